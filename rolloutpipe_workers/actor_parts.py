"""The streaming actor's torch-only parts: no verl, Ray or vLLM import, so the one-GPU check
(``recipe/rolloutpipe/run/one_gpu_check.py``, for a machine with CUDA torch and nothing else) runs the same code the
worker does.

- ``ParamSnapshot``: the round-start weights v kept for π_old of the round's later optimizer steps, on the device
  where memory allows (else on the host, pinned), swapped into the live parameters tensor by tensor for a log-prob
  call -- at most one tensor's worth of extra memory, no full copy of the model per call.
- ``TokenSumGradients``: a step's gradient streamed over several calls, kept as a token *sum* so the step can be
  divided by its total token count at the end (verl normalises a ``token-mean`` loss by each call's tokens).
- ``fitting_micro_batch``: the micro-batch a streamed call can use when it holds fewer rows than configured.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import torch

PLACEMENTS = ("auto", "device", "host")


def local(t: torch.Tensor) -> torch.Tensor:
    """This rank's shard of an FSDP2 (DTensor) parameter or gradient; a plain tensor as is."""
    return t.to_local() if hasattr(t, "to_local") else t


def fitting_micro_batch(rows: int, configured: int | None, dynamic: bool) -> int | None:
    """A streamed call can hold fewer rows per rank than verl's micro-batch (one group of K), which verl rejects
    without dynamic batch sizes: the largest micro-batch that divides the call, or None when the configured one
    fits. The loss is normalised per step, not per micro-batch, so only the float summation order changes."""
    if configured and not dynamic and rows % configured:
        return math.gcd(rows, configured)
    return None


def scale_grads(params: Iterable[torch.Tensor], factor: float) -> None:
    grads = [local(p.grad) for p in params if p.grad is not None]
    if grads:
        with torch.no_grad():
            torch._foreach_mul_(grads, factor)


class ParamSnapshot:
    """A copy of the parameters' local shards, taken once per round (weights v).

    ``placement``: ``device`` keeps it next to the live weights (fastest swap); ``host`` in CPU memory (pinned when the
    weights are on an accelerator, so the copies are DMA); ``auto`` takes ``device`` when the copy leaves at least
    ``headroom`` of the device's memory free, else ``host``. On a CPU-only run both are the same memory."""

    def __init__(self, params: dict[str, torch.Tensor], placement: str = "auto", headroom: float = 0.10) -> None:
        if placement not in PLACEMENTS:
            raise ValueError(f"snapshot placement {placement!r}: use one of {', '.join(PLACEMENTS)}")
        t0 = time.perf_counter()
        shards = {n: local(p.data) for n, p in params.items()}
        self.nbytes = sum(t.numel() * t.element_size() for t in shards.values())
        device = next(iter(shards.values())).device if shards else torch.device("cpu")
        self.placement = "host" if device.type == "cpu" else self._resolve(placement, device, headroom)
        with torch.no_grad():
            if self.placement == "device":
                self._store = {n: t.detach().clone() for n, t in shards.items()}
            else:
                pin = device.type != "cpu"
                self._store = {n: torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=pin).copy_(t)
                               for n, t in shards.items()}
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        self.take_s = time.perf_counter() - t0

    @property
    def tensors(self) -> dict[str, torch.Tensor]:
        """The kept weights (outside ``swapped_in``), by parameter name."""
        return self._store

    def _resolve(self, placement: str, device: torch.device, headroom: float) -> str:
        if placement != "auto":
            return placement
        free, total = torch.cuda.mem_get_info(device) if device.type == "cuda" else (0, 1)
        return "device" if free - self.nbytes >= headroom * total else "host"

    @contextmanager
    def swapped_in(self, params: dict[str, torch.Tensor]) -> Iterator[None]:
        """The live parameters hold the snapshot inside the block and their own values again after it (bit for bit:
        the two are exchanged, one tensor at a time). Pending gradients are untouched."""
        self._exchange(params)
        try:
            yield
        finally:
            self._exchange(params)

    def _exchange(self, params: dict[str, torch.Tensor]) -> None:
        with torch.no_grad():
            for n, p in params.items():
                live, kept = local(p.data), self._store[n]
                held = live.clone()  # the only extra memory: one tensor
                live.copy_(kept, non_blocking=True)
                kept.copy_(held, non_blocking=True)
        if self.placement == "host" and any(local(p.data).is_cuda for p in params.values()):
            torch.cuda.synchronize()  # a pinned host copy must land before `held` is freed and reused


class TokenSumGradients:
    """One optimizer step's gradient accumulated over several calls, each of which back-propagates a loss verl
    normalised by *that call's* token count n: before the call the running sum is divided by n, after it the
    whole is multiplied by n, so between calls the gradient is the token sum. ``close`` divides by the step's
    total (``token_mean``) -- the serial step's gradient, up to float summation order."""

    def __init__(self, token_mean: bool) -> None:
        self.token_mean = token_mean
        self.tokens: float | None = None  # None: no step open

    @property
    def open(self) -> bool:
        return self.tokens is not None

    def start(self) -> None:
        if self.open:
            raise RuntimeError("a step is already open")
        self.tokens = 0.0

    @contextmanager
    def call(self, params: list[torch.Tensor], call_tokens: float) -> Iterator[float]:
        """Wrap one call's backward; yields the divisor the call's loss must use (its tokens, or 1 for the modes
        normalised by sequence count)."""
        if not self.open:
            raise RuntimeError("accumulate outside an open step")
        n = float(call_tokens) if self.token_mean else 1.0
        scale_grads(params, 1.0 / n)
        yield n
        scale_grads(params, n)
        self.tokens += float(call_tokens)

    def close(self, params: list[torch.Tensor]) -> float:
        """The step's gradient (token sum / tokens for token-mean); returns the step's token count."""
        if not self.open:
            raise RuntimeError("optimizer step without accumulate")
        tokens, self.tokens = self.tokens, None
        if self.token_mean and tokens:  # no response token in the whole step: the gradient is zero as it stands
            scale_grads(params, 1.0 / tokens)
        return tokens

"""The one-GPU check (docs/gpu.md): the streaming actor's torch parts on a CUDA GPU, for a machine with CUDA torch
and nothing else (no verl, vLLM, Ray or network; only this repository's files).

    python -m recipe.rolloutpipe.run.one_gpu_check --out gpu_check.json          # on the GPU machine
    python -m recipe.rolloutpipe.run.one_gpu_check --device cpu --preset tiny    # the same checks on CPU (the tests)

A small causal LM sharded with FSDP2 on one rank (bf16 compute over fp32 master weights, as verl trains on GPU; and
fp32) runs the code the worker runs (``rolloutpipe_workers/actor_parts.py``) and asserts:

1. **streamed = serial**: U groups back-propagated one call at a time through ``TokenSumGradients`` (each call's
   token-mean loss divided by its own tokens, as verl does) give the gradient of one serial step over all U groups,
   up to float summation order (fp32: relative 1e-5; bf16 compute: 2e-2, bf16's resolution);
2. **π_old from the snapshot is exact**: log-probs under ``ParamSnapshot.swapped_in`` after an optimizer step equal
   the log-probs computed under the same weights before the step, bit for bit, and the live weights come back bit
   for bit, for both placements (device, pinned host);
3. **costs measured**: snapshot bytes, take and swap time, the swap's peak extra device memory, and publication's
   trainer-side cost (every parameter gathered and cast to the rollout's bf16, tensor by tensor, as verl's
   checkpoint engines send buckets), each also per billion parameters.

Prints one JSON object (and writes it to ``--out``); exits non-zero when a check fails.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time

import torch
import torch.distributed as dist
from torch import nn

from recipe.rolloutpipe.provenance import git_commit, machine
from rolloutpipe_workers.actor_parts import ParamSnapshot, TokenSumGradients, local

PRESETS = {  # hidden, layers, vocab, sequence length, groups (U), group size (K)
    "tiny": dict(hidden=64, layers=2, vocab=512, seq=24, groups=3, group_size=4),
    "medium": dict(hidden=1024, layers=4, vocab=16384, seq=32, groups=2, group_size=4),
    "gpu": dict(hidden=2048, layers=8, vocab=32768, seq=256, groups=4, group_size=8),  # ~0.54 B parameters
}
TOLERANCE = {"fp32": 1e-5, "bf16": 2e-2}  # relative gradient difference, streamed vs serial


class TinyCausalLM(nn.Module):
    def __init__(self, hidden: int, layers: int, vocab: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.layers = nn.ModuleList(nn.TransformerEncoderLayer(hidden, max(1, hidden // 64), 4 * hidden, dropout=0.0,
                                                               batch_first=True, norm_first=True)
                                    for _ in range(layers))
        self.norm = nn.LayerNorm(hidden)
        self.head = nn.Linear(hidden, vocab, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        mask = nn.Transformer.generate_square_subsequent_mask(ids.shape[1], device=ids.device)
        x = self.embed(ids)
        for layer in self.layers:
            x = layer(x, src_mask=mask, is_causal=True)
        return self.head(self.norm(x)).float()


def token_log_probs(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """log π(token_t | tokens_<t) for t >= 1."""
    logits = model(ids[:, :-1])
    return torch.log_softmax(logits, dim=-1).gather(-1, ids[:, 1:, None]).squeeze(-1)


def pg_loss_sum(model: nn.Module, ids: torch.Tensor, mask: torch.Tensor, adv: torch.Tensor) -> torch.Tensor:
    """A GRPO-like policy-gradient loss, summed over the response tokens (the caller divides)."""
    return -(token_log_probs(model, ids) * adv[:, None] * mask).sum()


def build(preset: dict, dtype: str, device: torch.device, seed: int) -> nn.Module:
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    torch.manual_seed(seed)
    model = TinyCausalLM(preset["hidden"], preset["layers"], preset["vocab"]).to(device)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if dtype == "bf16" else None
    kwargs = {"mp_policy": mp} if mp is not None else {}
    for layer in model.layers:
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)
    return model


def batch(preset: dict, device: torch.device, seed: int) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """U groups of K sequences; response lengths vary, so the groups' token counts differ (what token-mean needs)."""
    g = torch.Generator().manual_seed(seed)
    k, t = preset["group_size"], preset["seq"]
    out = []
    for _ in range(preset["groups"]):
        ids = torch.randint(preset["vocab"], (k, t), generator=g)
        lengths = torch.randint(2, t, (k,), generator=g)
        mask = (torch.arange(t - 1)[None, :] < lengths[:, None]).float()
        rewards = torch.rand(k, generator=g)
        adv = (rewards - rewards.mean()) / (rewards.std() + 1e-6)  # group-relative, as GRPO
        out.append((ids.to(device), mask.to(device), adv.to(device)))
    return out


def grads(model: nn.Module) -> list[torch.Tensor]:
    return [local(p.grad).detach().float().clone() for p in model.parameters()]


def check_streamed_gradients(model: nn.Module, groups, dtype: str) -> dict:
    params = list(model.parameters())
    model.zero_grad(set_to_none=True)
    total = sum(float(m.sum()) for _, m, _ in groups)
    loss = sum(pg_loss_sum(model, ids, m, a) for ids, m, a in groups) / total  # one serial step, all U groups
    loss.backward()
    serial = grads(model)

    model.zero_grad(set_to_none=True)
    step = TokenSumGradients(token_mean=True)
    step.start()
    for ids, m, a in groups:  # one call per group, each normalised by its own tokens (verl's token-mean)
        with step.call(params, float(m.sum())) as n:
            (pg_loss_sum(model, ids, m, a) / n).backward()
    tokens = step.close(params)
    streamed = grads(model)
    diff = torch.sqrt(sum(((s - p) ** 2).sum() for s, p in zip(streamed, serial, strict=True)))
    norm = torch.sqrt(sum((p ** 2).sum() for p in serial))
    rel = float(diff / norm)
    return {"dtype": dtype, "tokens": tokens, "grad_norm": float(norm), "relative_grad_diff": rel,
            "max_abs_grad_diff": max(float((s - p).abs().max()) for s, p in zip(streamed, serial, strict=True)),
            "tolerance": TOLERANCE[dtype], "ok": rel <= TOLERANCE[dtype]}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def check_snapshot(model: nn.Module, groups, placement: str, device: torch.device) -> dict:
    params = dict(model.named_parameters())
    ids = torch.cat([g[0] for g in groups])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with torch.no_grad():
        before = token_log_probs(model, ids)
    cuda = device.type == "cuda"
    base = torch.cuda.memory_allocated(device) if cuda else 0
    snap = ParamSnapshot(params, placement)
    held = torch.cuda.memory_allocated(device) - base if cuda else 0
    model.zero_grad(set_to_none=True)
    (sum(pg_loss_sum(model, i, m, a) for i, m, a in groups) / 1000.0).backward()
    opt.step()  # the live weights move on to v+1
    after = {n: local(p.data).clone() for n, p in params.items()}
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
        peak_base = torch.cuda.memory_allocated(device)
    _sync(device)
    t0 = time.perf_counter()
    with torch.no_grad(), snap.swapped_in(params):
        _sync(device)
        swap_in_s = time.perf_counter() - t0
        from_snapshot = token_log_probs(model, ids)
        _sync(device)
        t1 = time.perf_counter()
    _sync(device)
    swap_out_s = time.perf_counter() - t1
    swap_peak = torch.cuda.max_memory_allocated(device) - peak_base if cuda else 0
    logp_diff = float((from_snapshot - before).abs().max())
    restored = max(float((local(p.data) - after[n]).abs().max()) for n, p in params.items())
    moved = max(float((local(p.data) - snap.tensors[n].to(p.device)).abs().max()) for n, p in params.items())
    return {"placement": snap.placement, "bytes": snap.nbytes, "take_s": snap.take_s, "swap_in_s": swap_in_s,
            "swap_out_s": swap_out_s, "device_bytes_held": held, "swap_peak_extra_device_bytes": swap_peak,
            "max_abs_logprob_diff": logp_diff, "max_abs_live_weight_diff_after_swap": restored,
            "weights_moved_by_step": moved, "ok": logp_diff == 0.0 and restored == 0.0 and moved > 0.0}


def measure_publish(model: nn.Module, device: torch.device) -> dict:
    """The trainer side of a publication: each parameter gathered whole and cast to the rollout's bf16, one tensor at
    a time (verl's checkpoint engines then send buckets of these)."""
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
    _sync(device)
    t0 = time.perf_counter()
    nbytes = 0
    with torch.no_grad():
        for p in model.parameters():
            full = p.full_tensor() if hasattr(p, "full_tensor") else p
            nbytes += full.to(torch.bfloat16).numel() * 2
    _sync(device)
    return {"bf16_bytes": nbytes, "gather_cast_s": time.perf_counter() - t0,
            "peak_extra_device_bytes": torch.cuda.max_memory_allocated(device) - base if cuda else 0}


def _init_process_group(device: torch.device) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", init_method=f"tcp://127.0.0.1:{port}",
                            rank=0, world_size=1)


def run(device_name: str, preset_name: str, dtypes: list[str], seed: int = 0) -> dict:
    device = torch.device(device_name)
    preset = PRESETS[preset_name]
    if device.type == "cuda":  # fp32 means fp32: no TF32 matmuls
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    _init_process_group(device)
    try:
        result: dict = {"git_commit": git_commit(), "machine": machine(),
                        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                        "torch": torch.__version__, "preset": preset_name, **preset, "gradients": [], "snapshot": []}
        groups = batch(preset, device, seed)
        for dtype in dtypes:
            model = build(preset, dtype, device, seed)
            result["gradients"].append(check_streamed_gradients(model, groups, dtype))
        model = build(preset, dtypes[0], device, seed)
        n_params = sum(local(p.data).numel() for p in model.parameters())
        result["parameters"] = n_params
        for placement in (("device", "host") if device.type == "cuda" else ("host",)):
            result["snapshot"].append(check_snapshot(model, groups, placement, device))
        result["publish"] = measure_publish(model, device)
        per_b = 1e9 / n_params
        result["per_billion_parameters"] = {
            **{f"snapshot_{s['placement']}_{k}": s[k] * per_b for s in result["snapshot"]
               for k in ("bytes", "take_s", "swap_in_s", "swap_out_s")},
            "publish_gather_cast_s": result["publish"]["gather_cast_s"] * per_b,
            "publish_bf16_bytes": result["publish"]["bf16_bytes"] * per_b}
        result["ok"] = all(c["ok"] for c in result["gradients"] + result["snapshot"])
        return result
    finally:
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--preset", choices=sorted(PRESETS), default=None,
                        help="model size (default: gpu on CUDA, tiny on CPU)")
    parser.add_argument("--dtypes", default="bf16,fp32", help="compute dtypes of the gradient check, comma-separated")
    parser.add_argument("--out", default=os.environ.get("OUT") and os.path.join(os.environ["OUT"], "gpu_check.json"))
    args = parser.parse_args(argv)
    preset = args.preset or ("gpu" if args.device.startswith("cuda") else "tiny")
    result = run(args.device, preset, args.dtypes.split(","))
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

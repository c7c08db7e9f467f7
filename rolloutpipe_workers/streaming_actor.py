"""The actor worker RolloutPipe trains with: verl's ``ActorRolloutRefWorker`` plus what streaming needs.

RolloutPipe trains one optimizer step per call (U complete groups, all present), so verl's own loss normalisation
per mini-batch is already the serial run's. What verl lacks:

- a round-start *snapshot* of the weights, to compute π_old exactly for groups consumed after the first optimizer
  step of the round (``old_log_prob: snapshot``). verl's own CPU snapshot (``fsdp2_sharded_save_to_cpu``) aliases
  the live parameters on CPU, so this one clones;
- saving/restoring the whole train state (weights + optimizer + scheduler) and reading the last step's gradients,
  which the on-policy equivalence check uses.
"""

from __future__ import annotations

import copy

import torch
from verl.experimental.separation.engine_workers import DetachActorWorker
from verl.single_controller.base.decorator import Dispatch, make_nd_compute_dataproto_dispatch_fn, register
from verl.workers.engine_workers import ActorRolloutRefWorker


class StreamingActorMixin:
    """The streaming additions, for either of verl's actor workers (hybrid or disaggregated)."""

    def _module(self) -> torch.nn.Module:
        return self.actor.engine.module

    def _params(self) -> dict[str, torch.Tensor]:
        return {n: p for n, p in self._module().named_parameters()}

    @staticmethod
    def _local(t: torch.Tensor) -> torch.Tensor:
        return t.to_local() if hasattr(t, "to_local") else t

    def _clone_params(self) -> dict[str, torch.Tensor]:
        return {n: self._local(p.data).detach().clone().cpu() for n, p in self._params().items()}

    def _load_params(self, state: dict[str, torch.Tensor]) -> None:
        with torch.no_grad():
            for n, p in self._params().items():
                self._local(p.data).copy_(state[n])

    # ---- π_old snapshot ------------------------------------------------------------------------------------------
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def snapshot_weights(self) -> None:
        """Keep a copy of this round's starting weights (version v)."""
        self._rp_snapshot = self._clone_params()

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="actor"))
    def compute_log_prob_snapshot(self, data):  # noqa: ANN001, ANN201 - verl TensorDict in/out
        """Log-probs under the snapshot weights; the live weights (and pending gradients) are untouched."""
        live = self._clone_params()
        self._load_params(self._rp_snapshot)
        try:
            output = self.actor.infer_batch(data)
        finally:
            self._load_params(live)
        return output.cpu() if output is not None else None

    # ---- train state and gradients (equivalence check) --------------------------------------------------------
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_train_state(self, tag: str) -> None:
        eng = self.actor.engine
        states = getattr(self, "_rp_states", {})
        states[tag] = (self._clone_params(), copy.deepcopy(eng.optimizer.state_dict()),
                       copy.deepcopy(eng.lr_scheduler.state_dict()) if eng.lr_scheduler is not None else None)
        self._rp_states = states

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_train_state(self, tag: str) -> None:
        params, opt, sched = self._rp_states[tag]
        eng = self.actor.engine
        self._load_params(params)
        eng.optimizer.load_state_dict(copy.deepcopy(opt))
        if sched is not None:
            eng.lr_scheduler.load_state_dict(copy.deepcopy(sched))

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def get_weights(self) -> dict[str, torch.Tensor]:
        return self._clone_params()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def record_step_grads(self, enable: bool = True) -> None:
        """Record each optimizer step's gradients *before clipping* for ``pop_step_grads`` (clipping would hide a
        wrong gradient scale, as AdamW does)."""
        eng = self.actor.engine
        eng.__dict__.pop("optimizer_step", None)  # back to the class's method
        self._rp_grads: list[dict[str, torch.Tensor]] = []
        if enable:
            verl_step = eng.optimizer_step

            def optimizer_step(*args, **kwargs):  # noqa: ANN202
                self._rp_grads.append({n: self._local(p.grad).detach().clone().cpu()
                                       for n, p in self._params().items() if p.grad is not None})
                return verl_step(*args, **kwargs)

            eng.optimizer_step = optimizer_step

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def pop_step_grads(self) -> list[dict[str, torch.Tensor]]:
        grads, self._rp_grads = self._rp_grads, []
        return grads


class StreamingActorWorker(StreamingActorMixin, ActorRolloutRefWorker):
    """Hybrid layout: actor and rollout share verl's ``ActorRolloutRefWorker``."""


class StreamingDetachActorWorker(StreamingActorMixin, DetachActorWorker):
    """Disaggregated layout: the trainer pool's actor (verl's ``DetachActorWorker``); rollout runs elsewhere."""

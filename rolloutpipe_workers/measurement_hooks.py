"""Worker hooks only measurement calls: the on-policy check (``verify_onpolicy``: save/restore the whole train state,
read each step's gradients and the weights) and the benchmark (every mode from one saved state; the compute clock
that splits a call's wall time into compute and per-call overhead). Mixed into the streaming actor workers beside
what training needs (``streaming_actor.StreamingActorMixin``, whose parameter helpers these use)."""

from __future__ import annotations

import copy
import time

import torch
from verl.single_controller.base.decorator import Dispatch, register

from rolloutpipe_workers.actor_parts import local

# verl actor methods the compute clock (``pop_compute_seconds``) times
COMPUTE_FUNCTIONS = ("infer_batch", "train_mini_batch")


class MeasurementHooksMixin:
    # ---- train state and gradients (equivalence check, bench start state) -----------------------------------------
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

            def optimizer_step(*args, **kwargs):
                self._rp_grads.append({n: local(p.grad).detach().clone().cpu()
                                       for n, p in self._params().items() if p.grad is not None})
                return verl_step(*args, **kwargs)

            eng.optimizer_step = optimizer_step

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def pop_step_grads(self) -> list[dict[str, torch.Tensor]]:
        grads, self._rp_grads = self._rp_grads, []
        return grads

    # ---- compute time inside this worker (the benchmark's per-call overhead = a call's wall time minus this) -------
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def pop_compute_seconds(self) -> dict[str, float]:
        """Seconds spent in verl's ``infer_batch`` (π_old) and ``train_mini_batch`` (forward + backward + step) since
        the last call, by function (every update, accumulate and log-prob call runs through them); the first call
        starts the clock. Everything else in a worker call's wall time -- Ray's round trip, (de)serialising the
        batch, verl's dispatch -- is per-call overhead."""
        if not hasattr(self, "_rp_compute_s"):
            self._rp_compute_s = {name: 0.0 for name in COMPUTE_FUNCTIONS}
            for name in COMPUTE_FUNCTIONS:
                verl_fn = getattr(self.actor, name)

                def timed(*args, _verl_fn=verl_fn, _name=name, **kwargs):
                    t0 = time.perf_counter()
                    try:
                        return _verl_fn(*args, **kwargs)
                    finally:
                        self._rp_compute_s[_name] += time.perf_counter() - t0

                setattr(self.actor, name, timed)  # this instance only; verl's class is untouched
        seconds, self._rp_compute_s = self._rp_compute_s, {name: 0.0 for name in COMPUTE_FUNCTIONS}
        return seconds

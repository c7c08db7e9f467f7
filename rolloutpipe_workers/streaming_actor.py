"""The actor worker RolloutPipe trains with: verl's ``ActorRolloutRefWorker`` plus what streaming needs.

Two ways to train a round's optimizer steps:

- ``train_unit: step`` -- one worker call per optimizer step (U complete groups, all present; ``sync``: one call for
  the whole round, which verl's update splits into its R/U mini-batch steps, as its own trainer does):
  ``update_actor_in_round`` computes π_old in the same call (live weights on the round's first step, the round-start
  snapshot after) and then runs verl's own update; verl's loss normalisation per mini-batch is already the serial
  run's, and the LR scheduler is held until ``end_round`` (verl steps it once per round).
- ``train_unit: groups`` -- the streaming API below: ``begin_round`` / ``accumulate(groups)`` (forward + backward on
  whatever complete groups are there, no optimizer step) / ``optimizer_step`` / ``end_round``. verl normalises a
  ``token-mean`` loss by the tokens *of each call*; the serial step divides by the tokens of the whole step, which are
  known only when its last group arrives. So each call's gradient is kept as a token *sum* (scaled by the call's
  own token count) and ``optimizer_step`` divides by the step's total before verl clips and steps. The other loss
  modes need no fix: verl normalises them by the step's sequence count (``global_batch_size = U*K``), set per call.

What else verl lacks:

- a round-start *snapshot* of the weights, to compute π_old exactly for groups consumed after the first optimizer
  step of the round (``old_log_prob: snapshot``): ``actor_parts.ParamSnapshot``, on the device where memory allows
  (``rolloutpipe.snapshot_placement``). verl's own CPU snapshot (``fsdp2_sharded_save_to_cpu``) aliases the live
  parameters on CPU and always goes through the host;

What only the on-policy check and the benchmark call (train state, gradients, compute clock) is a mixin of its own:
``measurement_hooks.py``.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from verl.experimental.separation.engine_workers import DetachActorWorker
from verl.single_controller.base.decorator import Dispatch, make_nd_compute_dataproto_dispatch_fn, register
from verl.utils.device import get_device_name
from verl.workers.engine_workers import ActorRolloutRefWorker

from rolloutpipe_workers.actor_parts import ParamSnapshot, TokenSumGradients, fitting_micro_batch, local
from rolloutpipe_workers.measurement_hooks import MeasurementHooksMixin

# the batch's meta key that says where π_old comes from in ``update_actor_in_round`` and ``accumulate``: "live" |
# "snapshot" | "batch"
OLD_LOG_PROB_FROM = "rolloutpipe_old_log_prob_from"
# ``accumulate``'s meta key: true when the call's groups close the optimizer step (the step is taken in the same call)
STEP_AFTER = "rolloutpipe_step_after"


class StreamingActorMixin:
    """The streaming additions, for either of verl's actor workers (hybrid or disaggregated)."""

    def _module(self) -> torch.nn.Module:
        return self.actor.engine.module

    def _params(self) -> dict[str, torch.Tensor]:
        return {n: p for n, p in self._module().named_parameters()}

    def _trained_params(self) -> dict[str, torch.Tensor]:
        """What an optimizer step changes (with LoRA: the adapter; the frozen base is not copied for π_old)."""
        return {n: p for n, p in self._params().items() if p.requires_grad}

    def _clone_params(self) -> dict[str, torch.Tensor]:
        """A host copy of this rank's weights (train state saved for the check, weights sent to the driver)."""
        return {n: local(p.data).detach().clone().cpu() for n, p in self._params().items()}

    def _load_params(self, state: dict[str, torch.Tensor]) -> None:
        with torch.no_grad():
            for n, p in self._params().items():
                local(p.data).copy_(state[n])

    # ---- π_old: live weights (the round's first step) or the round-start snapshot ---------------------------------
    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="actor"))
    def compute_log_prob_live(self, data):  # verl TensorDict in/out
        """verl's ``compute_log_prob`` for a call of any number of whole groups."""
        return self._infer(data)

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="actor"))
    def compute_log_prob_snapshot(self, data):  # verl TensorDict in/out
        """Log-probs under the snapshot weights; the live weights (and pending gradients) are untouched."""
        return self._infer_snapshot(data)

    def _infer(self, data):
        output = self.actor.infer_batch(
            self._fit_micro_batches(data, self.actor.engine_config.infer_micro_batch_size_per_gpu))
        return output.cpu() if output is not None else None

    # ---- one optimizer step per call: π_old and verl's update fused, the LR schedule stepped per round --------------
    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="actor"))
    def update_actor_in_round(self, data):  # verl TensorDict in/out
        """verl's ``update_actor`` for one of a round's optimizer steps (``train_unit: step``), or -- ``sync`` -- for
        all of them, split into mini-batch steps by verl as its own trainer's one update call per round.

        π_old comes from the batch's ``OLD_LOG_PROB_FROM`` meta key: ``live`` / ``snapshot`` -- computed here, in the
        same call, under weights v (the live weights before the round's first optimizer step, the snapshot after it)
        and written into the batch as ``old_log_probs`` exactly as the driver would; ``batch`` -- already in the rows
        (``old_log_prob: rollout``, or a trainer with sequence parallelism that computed it in a call of its own).
        The LR scheduler holds: verl steps it once per update call, which in verl's trainer is once per round, and a
        round here has several calls; ``end_round`` takes the round's one scheduler step. Returns the log-prob output
        (``log_probs``, no padding, as ``compute_log_prob``) carrying the update's metrics, or verl's update output
        when π_old came with the batch."""
        from verl.utils import tensordict_utils as tu

        logp = self._old_log_probs_in_call(data, "update_actor_in_round")
        # the micro-batch must divide a mini-batch (U*K rows: one step), which a whole round's call splits into
        mini = tu.get(data, "mini_batch_size", default=None)  # verl's _update_actor sets it: U*K
        dp = self.actor.engine.get_data_parallel_size()
        per_rank = data.shape[0] if mini is None else min(data.shape[0], mini // dp)
        self._fit_micro_batches(data, self.actor.engine_config.micro_batch_size_per_gpu, rows=per_rank)
        with self._lr_schedule_held():
            update = self.actor.train_mini_batch(data=data)
        if update is None or logp is None:
            return update
        tu.assign_non_tensor(logp, metrics=tu.get(update, "metrics"))
        return logp

    def _old_log_probs_in_call(self, data, call: str):
        """π_old where the batch's ``OLD_LOG_PROB_FROM`` says: ``live`` / ``snapshot`` -- computed here under weights
        v and written into ``data`` as ``old_log_probs`` exactly as the driver would; returns the log-prob output
        (``log_probs``, no padding, as ``compute_log_prob``); ``batch`` (default): already in the rows, None."""
        from verl.utils import tensordict_utils as tu
        from verl.workers.utils.padding import no_padding_2_padding

        source = tu.pop(data, key=OLD_LOG_PROB_FROM, default="batch")
        if source == "batch":
            return None
        infer = data.copy()  # the infer pass sets its own keys (micro-batch, compute_loss) on a shallow copy
        tu.assign_non_tensor(infer, calculate_entropy=False, compute_loss=False)
        logp = self._infer_snapshot(infer) if source == "snapshot" else self._infer(infer)
        if logp is None:  # verl returns outputs only on a model-parallel group's source rank: all FSDP ranks are one
            raise RuntimeError(f"{call}: π_old in the training call needs every rank to see its log-probs (no "
                               "sequence parallelism); send it with the batch instead")
        data["old_log_probs"] = no_padding_2_padding(tu.get(logp, "log_probs"), data).float()
        return logp

    @contextmanager
    def _lr_schedule_held(self):
        """verl's engine with ``lr_scheduler_step`` reporting the LR in use instead of stepping."""
        eng = self.actor.engine
        saved = eng.__dict__.get("lr_scheduler_step")
        eng.lr_scheduler_step = lambda: eng.lr_scheduler.get_last_lr()[0] if eng.lr_scheduler is not None else None
        try:
            yield
        finally:
            eng.__dict__.pop("lr_scheduler_step", None)
            if saved is not None:
                eng.lr_scheduler_step = saved

    def _infer_snapshot(self, data):
        with self._rp_snapshot.swapped_in(self._trained_params()):
            return self._infer(data)

    def _fit_micro_batches(self, data, configured: int | None, rows: int | None = None):
        """A call (or ``rows``: its mini-batch) of fewer rows than verl's micro-batch: the largest one that divides
        it (``fitting_micro_batch``)."""
        from verl.utils import tensordict_utils as tu

        fit = fitting_micro_batch(rows or data.shape[0], configured, self.actor.engine_config.use_dynamic_bsz)
        if fit is not None:
            tu.assign_non_tensor(data, micro_batch_size_per_gpu=fit)
        return data

    # ---- streaming training: begin_round / accumulate / optimizer_step / end_round -----------------------------
    @property
    def _step_grads(self) -> TokenSumGradients:
        if getattr(self, "_rp_step_grads", None) is None:
            self._rp_step_grads = TokenSumGradients(token_mean=self.config.actor.loss_agg_mode == "token-mean")
        return self._rp_step_grads

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def begin_round(self, snapshot: bool, placement: str = "auto") -> dict[str, float | str] | None:
        """A new weight version starts training; ``snapshot``: keep its weights for π_old of later steps, where
        ``placement`` says (``actor_parts.ParamSnapshot``). Returns the snapshot's size, time and placement."""
        if self._step_grads.open:
            raise RuntimeError("begin_round: the previous round left an optimizer step open")
        self._rp_snapshot = None  # the previous one is freed before the next is taken
        if not snapshot:
            return None
        self._rp_snapshot = ParamSnapshot(self._trained_params(), placement)
        return {"bytes": float(self._rp_snapshot.nbytes), "seconds": self._rp_snapshot.take_s,
                "placement": self._rp_snapshot.placement}

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="actor"))
    def accumulate(self, data):  # verl TensorDict in/out, as update_actor
        """Forward + backward on these complete groups through verl's own training path (``train_mini_batch``),
        adding to the open step's gradients. π_old as in ``update_actor_in_round`` (``OLD_LOG_PROB_FROM``: computed
        here first, or with the batch); with ``STEP_AFTER`` the optimizer step that closes the step is taken in the
        same call, else not. One call per dispatched group then, not three (π_old, accumulate, step). Returns verl's
        metrics of the call (with the step's, when it stepped) -- on the log-prob output when π_old was computed here,
        as ``update_actor_in_round``."""
        from verl.utils import tensordict_utils as tu

        step_after = bool(tu.pop(data, key=STEP_AFTER, default=False))
        logp = self._old_log_probs_in_call(data, "accumulate")
        # the call is one mini-batch of its own rows; global_batch_size stays the step's (U*K) for seq-mean modes
        tu.assign_non_tensor(data, mini_batch_size=data.shape[0] * self.actor.engine.get_data_parallel_size())
        self._fit_micro_batches(data, self.actor.engine_config.micro_batch_size_per_gpu)
        with self._accumulating():
            output = self.actor.train_mini_batch(data=data)
        step = self._optimizer_step() if step_after else {}
        if output is None:
            return None
        metrics = tu.get(output, "metrics")
        metrics.pop("grad_norm", None)  # no step was taken inside verl's update: the step reports it
        metrics.update(step)  # bare names: verl's _update_actor on the driver prefixes actor/
        if logp is None:
            return output.cpu()
        tu.assign_non_tensor(logp, metrics=metrics)
        return logp

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def optimizer_step(self) -> dict[str, float]:
        """Close the open step (a step whose last dispatch brought no rows); the metrics under their logged names."""
        step = self._optimizer_step()
        return {"actor/grad_norm": step["grad_norm"], "actor/lr": step["lr"],
                "rolloutpipe/step_tokens": step["step_tokens"]}

    def _optimizer_step(self) -> dict[str, float]:
        """Gradients = token sum / the step's tokens (token-mean), then verl's clip + step. The LR scheduler steps
        once per round, in ``end_round``, as in verl's trainer. Returns verl's bare metric names (no ``actor/``)."""
        eng = self.actor.engine
        with eng.train_mode():
            tokens = self._step_grads.close(list(self._params().values()))
            grad_norm = eng.optimizer_step()
            lr = eng.lr_scheduler.get_last_lr()[0] if eng.lr_scheduler is not None else float("nan")
        return {"grad_norm": float(grad_norm), "lr": float(lr), "step_tokens": float(tokens)}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def end_round(self) -> None:
        """The round's one LR scheduler step (verl's trainer steps it once per round: its update call's last
        mini-batch); the snapshot is dropped."""
        if self._step_grads.open:
            raise RuntimeError("end_round with gradients accumulated but no optimizer step taken")
        self._rp_snapshot = None
        if self.actor.engine.lr_scheduler is not None:
            self.actor.engine.lr_scheduler_step()

    @contextmanager
    def _accumulating(self):
        """verl's engine with the step's start/end taken out of ``train_batch``: zero the gradients only at the
        start of a step, never step the optimizer or the scheduler, and keep the gradient a token sum."""
        from verl.utils import tensordict_utils as tu

        eng = self.actor.engine
        verl_fb = eng.forward_backward_batch
        saved = {k: eng.__dict__[k] for k in ("optimizer_zero_grad", "optimizer_step", "lr_scheduler_step",
                                              "forward_backward_batch") if k in eng.__dict__}

        step = self._step_grads
        params = list(self._params().values())

        def forward_backward_batch(data, loss_function, forward_only=False):
            if forward_only:
                return verl_fb(data, loss_function, forward_only=forward_only)
            # the tokens verl will divide this call's token-mean loss by (the same all-reduced count), counted on
            # the device the process group reduces on (nccl on GPU, gloo on CPU)
            count = data["loss_mask"].sum().to(device=get_device_name(), dtype=torch.float64)
            torch.distributed.all_reduce(count, group=eng.get_data_parallel_group())
            with step.call(params, float(count)) as n:
                out = verl_fb(data, loss_function, forward_only=forward_only)
                used = tu.get(data, key="batch_num_tokens")
                if step.token_mean and float(used) != n:  # verl changed how it normalises: the fix would be wrong
                    raise RuntimeError(f"accumulate: verl normalised by {used} tokens, expected {n}")
            return out

        if not step.open:  # first call of a step
            eng.optimizer_zero_grad()
            step.start()
        eng.optimizer_zero_grad = lambda: None
        eng.optimizer_step = lambda: float("nan")
        eng.lr_scheduler_step = lambda: None
        eng.forward_backward_batch = forward_backward_batch
        try:
            yield
        finally:
            for k in ("optimizer_zero_grad", "optimizer_step", "lr_scheduler_step", "forward_backward_batch"):
                eng.__dict__.pop(k, None)
            eng.__dict__.update(saved)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def ray_node_id(self) -> str:
        """The Ray node this rank runs on (the trainer logs how its pool is spread over nodes)."""
        import ray

        return ray.get_runtime_context().get_node_id()


class StreamingActorWorker(StreamingActorMixin, MeasurementHooksMixin, ActorRolloutRefWorker):
    """Hybrid layout: actor and rollout share verl's ``ActorRolloutRefWorker``."""


class StreamingDetachActorWorker(StreamingActorMixin, MeasurementHooksMixin, DetachActorWorker):
    """Disaggregated layout: the trainer pool's actor (verl's ``DetachActorWorker``); rollout runs elsewhere."""

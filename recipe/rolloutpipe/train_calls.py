"""A round's trainer calls: verl's own update path (``_update_actor``, ``_compute_old_log_prob``,
``_compute_ref_log_prob``), routed to the streaming worker's variants through the trainer's ``StreamingActorGroup``,
with π_old, the reference and a KL penalty in the reward computed as the serial run computes them.

``train_unit: step`` / ``steps``: one verl update per dispatch of whole steps; ``groups``: an ``accumulate`` call per
dispatch, the optimizer step in the call that closes it (rolloutpipe_workers/streaming_actor.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from verl import DataProto
from verl.trainer.ppo.core_algos import FixedKLController
from verl.trainer.ppo.ray_trainer import apply_kl_penalty, compute_advantage
from verl.utils.metric import reduce_metrics
from verl.utils.profiler import marked_timer

from rolloutpipe_workers.actor_parts import fitting_micro_batch

from .pipeline import PREFIX, Dispatch
from .round_metrics import merge_metric_lists


def grpo_advantages(algorithm: Any, rows: DataProto, group_size: int) -> DataProto:
    """GRPO advantages of whole groups (verl's code; normalised within each uid, so per group = per batch)."""
    return compute_advantage(rows, adv_estimator=algorithm.adv_estimator, gamma=algorithm.gamma, lam=algorithm.lam,
                             num_repeat=group_size, norm_adv_by_std_in_grpo=algorithm.get("norm_adv_by_std_in_grpo",
                                                                                         True), config=algorithm)


@dataclass
class RoundRewardKL:
    """``algorithm.use_kl_in_reward`` for one round, streamed. verl's serial trainer applies the penalty once, to the
    whole round's batch, with the controller's coefficient at that moment, and updates the controller with the
    batch's mean KL. Here verl's ``apply_kl_penalty`` runs on each dispatched step (or group) with the coefficient the
    round started with, and ``close`` gives the controller that one update from the same mean over all sequences."""

    controller: Any  # verl's kl_ctrl_in_reward (fixed or adaptive)
    kl_penalty: str
    beta: float
    kl_sum: float = 0.0  # Σ over sequences of each one's mean KL over its response tokens
    sequences: int = 0

    def apply(self, rows: DataProto) -> DataProto:
        rows, metrics = apply_kl_penalty(rows, FixedKLController(self.beta), self.kl_penalty)
        self.kl_sum += metrics["actor/reward_kl_penalty"] * len(rows)
        self.sequences += len(rows)
        return rows

    def close(self) -> dict[str, float]:
        kl = self.kl_sum / max(self.sequences, 1)
        self.controller.update(current_kl=kl, n_steps=self.sequences)
        return {"actor/reward_kl_penalty": kl, "actor/reward_kl_penalty_coeff": self.beta}


class TrainCalls:
    """The train side of one round (``trainer``: a RolloutPipeTrainer with its workers started; ``timing``: where
    the phases timed inside a call add up; ``reward_kl``: the round's KL-in-reward, or None)."""

    def __init__(self, trainer: Any, group_size: int, timing: dict[str, float],
                 reward_kl: RoundRewardKL | None) -> None:
        self.trainer, self.group_size, self.timing, self.reward_kl = trainer, group_size, timing, reward_kl
        self.wg = trainer.actor_rollout_wg  # a StreamingActorGroup
        self.pi_old_from_snapshot = trainer.config.rolloutpipe.old_log_prob == "snapshot"
        sp = int(trainer.config.actor_rollout_ref.actor.get("ulysses_sequence_parallel_size", 1))
        # π_old inside the update call needs every trainer rank to hold its own log-probs: no sequence parallelism
        self.fused_update = sp == 1
        self.data_parallel_size = self.wg.world_size // sp  # ranks verl's update splits a batch between
        self._step_calls: list[DataProto] = []  # train_unit=groups: the open step's accumulate calls

    def train_step(self, rows: DataProto, step_index: int) -> DataProto:
        """Whole steps in one worker call: verl's update with π_old computed in the same call
        (``update_actor_in_round``); with π_old from the rollout, or with sequence parallelism (π_old then needs a
        call of its own), the rows bring it. ``sync`` sends its whole round here: verl's update splits it into its
        R/U mini-batch steps, π_old of all of them from the live weights first."""
        return self._call(rows, step_index, self.wg.update_actor_in_round)

    def train_groups(self, rows: DataProto | None, d: Dispatch) -> DataProto | None:
        """``train_unit: groups``: forward + backward on the groups there are now (verl's update path, routed to the
        worker's ``accumulate``), π_old and -- when the dispatch closes the step -- the optimizer step in the same
        call. Returns the step's metrics then, else None."""
        from rolloutpipe_workers.streaming_actor import STEP_AFTER  # worker module: import where used

        if rows is not None:
            self._step_calls.append(self._call(rows, d.step_index, self.wg.accumulate, **{STEP_AFTER: d.ends_step}))
        if not d.ends_step:
            return None
        calls, self._step_calls = self._step_calls, []
        metrics = reduce_metrics(merge_metric_lists([c.meta_info["metrics"] for c in calls]))
        if rows is None:  # a step closed by a dispatch without rows: the step in a call of its own
            metrics.update(self.wg.optimizer_step()[0])
        else:  # taken in the last call, whose metrics verl's _update_actor prefixed with actor/
            metrics[PREFIX + "step_tokens"] = metrics.pop("actor/step_tokens")
        return DataProto.from_single_dict(data={}, meta_info={"metrics": metrics})

    def old_log_probs(self, rows: DataProto, step_index: int) -> DataProto:
        """π_old = weights v. Before the round's first optimizer step the live weights are v; after it, the
        snapshot of v answers (exact, equal to the serial run)."""
        with self.wg.answering("compute_log_prob", "compute_log_prob_live" if step_index == 0 else
                               "compute_log_prob_snapshot"):
            old, _ = self.trainer._compute_old_log_prob(rows)
        old.batch.pop("entropys")
        return old

    def _call(self, rows: DataProto, step_index: int, worker_call, **meta) -> DataProto:
        """One training call through verl's ``_update_actor`` routed to ``worker_call``, with π_old computed in the
        same call where it can be (``OLD_LOG_PROB_FROM``), else first in a call of its own; ``meta``: more meta keys
        for the worker. Returns verl's update output."""
        from verl.utils import tensordict_utils as tu
        from verl.workers.utils.padding import no_padding_2_padding

        from rolloutpipe_workers.streaming_actor import OLD_LOG_PROB_FROM  # worker module: import where used

        # π_old in the training call, unless a KL penalty in the reward needs it before the advantages
        in_call = self.pi_old_from_snapshot and self.fused_update and self.reward_kl is None
        rows.meta_info["global_token_num"] = rows.batch["attention_mask"].sum(dim=-1).tolist()  # verl's throughput
        rows = self._with_ref_log_probs(rows if in_call else self._with_old_log_probs(rows, step_index))
        if self.reward_kl is not None:  # rewards minus β·KL(π_old ‖ ref), then their advantages
            rows = grpo_advantages(self.trainer.config.algorithm, self.reward_kl.apply(rows), self.group_size)
        meta[OLD_LOG_PROB_FROM] = ("live" if step_index == 0 else "snapshot") if in_call else "batch"
        rows.meta_info.update(meta)
        sent = {}

        def update_actor(batch_td):  # verl's _update_actor builds the call; keep what π_old needs back here
            sent["td"], sent["out"] = batch_td, worker_call(batch_td)
            return sent["out"]

        try:
            with self.wg.answering("update_actor", update_actor):
                out = self.trainer._update_actor(rows)
        finally:
            for key in meta:
                rows.meta_info.pop(key)
        if in_call:  # π_old back in the rows, padded as verl's _compute_old_log_prob returns it (metrics, checks)
            rows.batch["old_log_probs"] = no_padding_2_padding(tu.get(sent["out"], "log_probs"), sent["td"]).float()
        return out

    def _with_old_log_probs(self, rows: DataProto, step_index: int) -> DataProto:
        if self.pi_old_from_snapshot:
            with marked_timer("rolloutpipe/old_log_prob", self.timing):  # the rest of a train call: update
                rows = rows.union(self.old_log_probs(rows, step_index))
        return rows

    def _with_ref_log_probs(self, rows: DataProto) -> DataProto:
        """KL to the reference policy (``actor.use_kl_loss``): the rows' reference log-probs from verl's own ref call
        (the ref worker, or the actor without its LoRA adapter), on the trainer pool, per dispatched step or group --
        the same numbers the serial run computes for the whole batch (the reference never changes)."""
        t = self.trainer
        if not t.use_reference_policy:
            return rows
        # a call of one group can be smaller than verl's micro-batch: the one that fits, as verl's per-call key
        cfg = t.config.actor_rollout_ref.rollout if t.ref_in_actor else t.config.actor_rollout_ref.ref
        per_rank = len(rows) // (self.wg if t.ref_in_actor else t.ref_policy_wg).world_size
        fit = fitting_micro_batch(per_rank, cfg.get("log_prob_micro_batch_size_per_gpu"),
                                  cfg.get("log_prob_use_dynamic_bsz", False))
        if fit is not None:
            rows.meta_info["micro_batch_size_per_gpu"] = fit
        try:
            with marked_timer("rolloutpipe/ref_log_prob", self.timing):
                return rows.union(t._compute_ref_log_prob(rows))
        finally:
            rows.meta_info.pop("micro_batch_size_per_gpu", None)


def dp_step_order(rows: int, rows_per_step: int, dp: int) -> list[int]:
    """verl's update call splits its batch into ``dp`` contiguous chunks, one per rank, and each rank then walks its
    chunk mini-batch by mini-batch. So that mini-batch s of every rank is that rank's share of step s -- as in a
    one-step call -- rows in step order go to the call rank by rank, step by step: this permutation."""
    share, steps = rows_per_step // dp, rows // rows_per_step
    return [s * rows_per_step + r * share + i for r in range(dp) for s in range(steps) for i in range(share)]

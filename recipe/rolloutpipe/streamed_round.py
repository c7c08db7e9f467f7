"""StreamedRound: one round in flight on the verl side -- the pipeline's ``Round`` plus what verl holds for it.

It owns the round's state and both of its sides:
- rollout (a thread: ``roll_out``): send what the round admits, turn each finished group into training rows --
  rewards, GRPO advantages on that group alone -- or filter it, re-send groups lost with a dead replica;
- train (the trainer's thread: ``train``): build each dispatch's call (``train_calls.TrainCalls``);
- ``publish``: weights v+1 out, once every group of round v is consumed.
The trainer (``trainer.py``) runs the loop around it.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from verl import DataProto
from verl.trainer.ppo.ray_trainer import compute_response_mask
from verl.trainer.ppo.reward import extract_reward
from verl.utils.profiler import marked_timer

from .filters import keep_if_metric_varies
from .logs import get_logger
from .payload import Payload
from .pipeline import Dispatch, PipelineInvariantError, Round, RoundSettings, RoundTimeline, trains_after_first_step
from .rollout_stream import REQUEST_COLUMNS, GroupRequest, GroupRolloutStream
from .train_calls import RoundRewardKL, TrainCalls, dp_step_order, grpo_advantages

logger = get_logger(__name__)


@dataclass
class RoundResult:
    """What one round did -- returned by ``fit_round`` to the training loop, the benchmark and the verifier."""

    metrics: dict
    trained: list[DataProto]  # the training rows in training order, one entry per trainer call
    step_outputs: list[DataProto]  # verl's update output per optimizer step (sync: one for the round, its metrics
    # one list entry per step, as verl's update_actor returns them)
    calls_per_step: list[int]  # trainer calls that trained groups, per optimizer step (sync: its one call counts for
    # each)
    timeline: RoundTimeline
    timeline_path: Path  # its JSON (a .trace.json and, on some rounds, a Gantt .png beside it)


def group_rows(prompt_row: DataProto, out: DataProto, group_size: int) -> DataProto:
    """A group's K training rows: the prompt's row repeated, joined with the agent loop's K outputs."""
    rows = prompt_row.repeat(repeat_times=group_size, interleave=True)
    out.non_tensor_batch.pop("uid", None)  # the reward loop may drop or rewrite it: the prompt's uid wins
    for key in REQUEST_COLUMNS:
        out.non_tensor_batch.pop(key, None)
    out.meta_info.pop("metrics", None)  # the agent loop's per-sample timings; not part of the training batch
    rows = rows.union(out)
    if "response_mask" not in rows.batch.keys():
        rows.batch["response_mask"] = compute_response_mask(rows)
    return rows


def request_seed(base: int, round_index: int, group_id: int, group_size: int) -> int:
    """First vLLM seed of a group's K requests: a function of (base, round, group) only, so the same round
    regenerates the same samples in a resumed run, whatever the admission order."""
    return (base * 1_000_003 + round_index * 65_537 + group_id * group_size) % (2**31 - group_size)


class RoundPrompts:
    """A round's prompts by group id: the round's batch (groups 0..R-1), then -- for groups that replace filtered
    ones -- rows of later dataloader batches, pulled only when needed (the unused rest of a pulled batch is
    skipped, as verl's DAPO loop discards its surplus)."""

    def __init__(self, trainer: Any, batch: DataProto, more: Callable[[], DataProto | None] | None) -> None:
        self._trainer, self._more = trainer, more
        self.batches: list[DataProto] = []
        self.gen_batches: list[DataProto] = []
        self._add(batch)

    def _add(self, batch: DataProto) -> None:
        temperature = self._trainer.config.actor_rollout_ref.rollout.temperature
        batch.non_tensor_batch["uid"] = np.array([str(uuid.uuid4()) for _ in range(len(batch))], dtype=object)
        gen = self._trainer._get_gen_batch(batch)
        gen.meta_info["temperature"] = batch.meta_info["temperature"] = temperature
        self.batches.append(batch)
        self.gen_batches.append(gen)

    def available(self, group_id: int) -> bool:
        """Is there a prompt for this group (pulling the next dataloader batch if needed)?"""
        while group_id >= sum(len(b) for b in self.batches):
            nxt = self._more() if self._more is not None else None
            if nxt is None:
                return False
            self._add(nxt)
        return True

    def _locate(self, group_id: int) -> tuple[int, int]:
        if not self.available(group_id):
            raise PipelineInvariantError(f"no prompt for group {group_id}")
        for i, b in enumerate(self.batches):
            if group_id < len(b):
                return i, group_id
            group_id -= len(b)
        raise AssertionError

    def row(self, group_id: int) -> DataProto:
        i, j = self._locate(group_id)
        return self.batches[i][j : j + 1]

    def gen_row(self, group_id: int) -> DataProto:
        i, j = self._locate(group_id)
        return self.gen_batches[i][j : j + 1]


class StreamedRound:
    def __init__(self, trainer: Any, settings: RoundSettings, batch: DataProto,
                 more_prompts: Callable[[], DataProto | None] | None) -> None:
        """The round's pipeline state, its prompts and rollout stream; the worker snapshots π_old = weights v when
        a call after the round's first optimizer step will need it."""
        self.trainer, self.settings = trainer, settings
        self.config = trainer.config
        self.round_index = trainer.global_steps
        self.rnd = Round(trainer.weights_version, settings, trainer.clock)
        self.prompts = RoundPrompts(trainer, batch, more_prompts)
        self.stream = GroupRolloutStream(trainer.async_rollout_manager.agent_loop_workers, settings.group_size)
        self.trainable: dict[int, DataProto] = {}  # materialized, not yet dispatched
        self.trained: list[DataProto] = []
        self.step_outputs: list[DataProto] = []
        self.timing: dict[str, float] = {}  # verl's marked_timer: seconds per phase (the trainer's thread)
        self.rollout_timing: dict[str, float] = {}  # the same, summed over the rollout thread's groups
        self.reward_kl_metrics: dict[str, float] = {}
        self.payload = Payload()  # the round's data calls to the trainer pool, and their bytes
        self.old_log_prob = self.config.rolloutpipe.old_log_prob
        later_steps = trains_after_first_step(settings.mode, settings.train_unit.whole_step, settings.num_groups,
                                              settings.step_groups, may_end_short=settings.filter_metric is not None)
        self.snapshot: dict[str, float | str] | None = trainer.actor_rollout_wg.begin_round(  # rank 0's
            snapshot=self.old_log_prob == "snapshot" and later_steps,
            placement=self.config.rolloutpipe.snapshot_placement)[0]
        kl_ctrl = trainer.kl_ctrl_in_reward if self.config.algorithm.use_kl_in_reward else None
        self.reward_kl = None if kl_ctrl is None else RoundRewardKL(kl_ctrl, self.config.algorithm.kl_penalty,
                                                                    float(kl_ctrl.value))
        self.calls = TrainCalls(trainer, settings.group_size, self.timing, self.reward_kl)
        trainer.actor_rollout_wg.take_payload()  # count this round's calls from here

    # ---- rollout side (its own thread) ----------------------------------------------------------------------------
    def roll_out(self) -> None:
        """Send what the round admits, turn each finished group into training rows (or filter it), until the
        round's data is final. A failure is handed to the trainer thread through the Round."""
        rnd = self.rnd
        try:
            self.send(rnd.admit())
            while not rnd.rollout_closed:
                self.send(rnd.admit())  # groups the buffer bound held back, once some are consumed
                for gid, out in self.stream.poll(timeout_s=0.05):
                    rnd.served(gid)
                    with marked_timer("rolloutpipe/materialize", self.rollout_timing):
                        rows = self.materialize(self.prompts.row(gid), out)
                    if "reward_s" in rows.non_tensor_batch:  # the reward guard's per-response call seconds
                        rnd.ledger.group(gid).reward_s = float(np.max(rows.non_tensor_batch["reward_s"].astype(float)))
                    metric = self.settings.filter_metric  # dynamic sampling (verl's algorithm.filter_groups)
                    if metric is None or keep_if_metric_varies(rows, metric)[0]:
                        self.trainable[gid] = rows
                        rnd.materialized(gid)
                    else:
                        rnd.filtered(gid, replaceable=self.prompts.available(len(rnd.ledger.groups)))
                    self.send(rnd.admit())
                if self.stream.lost:
                    self._resend_lost_groups()
        except BaseException as e:
            rnd.fail(e)

    def send(self, admissions: list) -> None:
        """The admitted groups' K requests each to vLLM, in one call per agent-loop worker (seeded per request when
        ``rolloutpipe.sampling_seed`` is set)."""
        base, k = self.config.rolloutpipe.sampling_seed, self.settings.group_size
        self.stream.submit([
            GroupRequest(a.group_id, self.prompts.gen_row(a.group_id), a.priority, {"global_steps": self.round_index},
                         None if base is None else request_seed(int(base), self.round_index, a.group_id, k))
            for a in admissions])

    def materialize(self, prompt_row: DataProto, out: DataProto) -> DataProto:
        """Rewards, response mask, GRPO advantages (verl's code on this group alone; with a KL penalty in the
        reward they wait for π_old and the reference, on the trainer side), π_old if from the rollout."""
        rows = group_rows(prompt_row, out, self.settings.group_size)
        reward_tensor, extra = extract_reward(rows)
        if reward_tensor is None or not bool(reward_tensor.isfinite().all()):
            raise PipelineInvariantError(f"reward for prompt uid {rows.non_tensor_batch['uid'][0]} is not finite")
        rows.batch["token_level_scores"] = reward_tensor
        rows.batch["token_level_rewards"] = reward_tensor
        if extra:
            rows.non_tensor_batch.update({k: np.array(v) for k, v in extra.items()})
        if self.reward_kl is None:
            rows = grpo_advantages(self.config.algorithm, rows, self.settings.group_size)
        if self.old_log_prob == "rollout":
            rows.batch["old_log_probs"] = rows.batch["rollout_log_probs"]
        return rows

    def _resend_lost_groups(self) -> None:
        """Groups whose call died with an actor: if a rollout replica is dead, it leaves routing and the groups go
        again (same requests, same seeds) to the survivors; nothing of them was materialized, so each is still
        trained exactly once. Any other dead actor (agent-loop or reward worker) stops the round."""
        first = next(iter(self.stream.lost.values()))
        failover = self.trainer.failover
        if failover is None:
            raise first
        self.trainer.drop_dead_replicas(first)
        if not failover.dropped:
            raise first  # no replica died: not a failure re-sending can fix
        lost = sorted(self.stream.lost)
        self.rnd.resend(lost)
        self.stream.resend(lost)
        logger.info(f"[rolloutpipe] round {self.round_index}: groups {lost} lost with a dead rollout replica, re-sent "
                    f"to the {failover.alive} surviving replica(s)")

    # ---- train side (the trainer's thread) ------------------------------------------------------------------------
    def train(self, d: Dispatch) -> None:
        """Train the dispatched groups: one verl update for whole steps (``train_unit: step``; ``steps``: every
        whole step that was ready; sync: the round's whole steps), else accumulate them and step when the dispatch
        closes the optimizer step."""
        s = self.settings
        rows = DataProto.concat([self.trainable.pop(g) for g in d.training_order]) if d.group_ids else None
        if rows is None and not (not s.train_unit.whole_step and d.ends_step):
            return
        clock = self.rnd.clock
        t0 = clock.now()
        # whole steps (sync: the whole round's) in one verl update call; else a short last step
        whole = s.train_unit.whole_step and len(d.group_ids) == s.step_groups * d.steps
        order = None
        if whole and d.steps > 1 and (dp := self.calls.data_parallel_size) > 1:  # verl's mini-batch s = step s's
            order = dp_step_order(len(rows), len(rows) // d.steps, dp)
            rows = rows.select_idxs(order)
        out = self.calls.train_step(rows, d.step_index) if whole else self.calls.train_groups(rows, d)
        if order is not None:  # back in training order, with what the call added (π_old, ref, KL-penalised reward)
            rows = rows.select_idxs(np.argsort(order))
        self.rnd.trained(d, t0, clock.now(), trainer_version=self.trainer.weights_version)
        if out is not None:
            self.step_outputs.append(out)
        if rows is not None:  # each row with the weight version it was sampled by (= the one it trained at)
            rows.non_tensor_batch["weight_version"] = np.full(len(rows), self.rnd.version, dtype=np.int64)
            self.trained.append(rows)

    # ---- publication ----------------------------------------------------------------------------------------------
    def publish(self) -> None:
        """Weights v+1 to the rollout side -- only once every group of round v is consumed (the Round checks)."""
        t = self.trainer
        self.payload = t.actor_rollout_wg.take_payload()  # the round's data calls (end_round is none)
        t.actor_rollout_wg.end_round()
        self.rnd.check_publishable()
        if self.reward_kl is not None:  # the KL controller's one update of the round, as verl's trainer does
            self.reward_kl_metrics = self.reward_kl.close()
        if t.failover is not None:
            t.drop_dead_replicas(None)  # one that died after its last request must not fail the publish
        t0 = self.rnd.clock.now()
        t.checkpoint_manager.update_weights(self.round_index)
        self.rnd.published(t0, self.rnd.clock.now())

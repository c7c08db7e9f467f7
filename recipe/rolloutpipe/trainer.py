"""RolloutPipeTrainer: verl's ``RayPPOTrainer`` with a streaming, exactly on-policy round.

A round (= one verl training step, one weight version v):
  submit R prompt groups → each group, once its K responses are rewarded, gets GRPO advantages (verl's own
  ``compute_advantage`` on that group alone) and is *materialized* into the CGP FIFO → the trainer takes one
  optimizer step per U groups as soon as they are there, while later groups are still generating with weights v →
  after the last group: publish weights v+1.

Policy (admission, dispatch, step boundaries, invariants, metrics) lives in ``recipe.rolloutpipe.pipeline``; this
file only connects it to verl. The rollout side runs in a thread (it waits on Ray object refs); the trainer side
runs in the calling thread. They share the ledger and the FIFO under one lock.
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm
from verl import DataProto
from verl.experimental.one_step_off_policy.ray_trainer import OneStepOffRayTrainer
from verl.trainer.ppo.core_algos import FixedKLController
from verl.trainer.ppo.ray_trainer import RayPPOTrainer, apply_kl_penalty, compute_advantage, compute_response_mask
from verl.trainer.ppo.reward import extract_reward
from verl.utils.metric import reduce_metrics
from verl.utils.profiler import marked_timer

from rolloutpipe_workers.actor_parts import fitting_micro_batch
from rolloutpipe_workers.vllm_compat import WeightPublicationError

from .config_check import PipeSettings, validate
from .failover import NoRolloutReplicaLeftError, ReplicaFailover, dead_actor_error
from .filters import keep_if_metric_varies
from .learning_curve import write_learning_curve
from .logs import get_logger
from .payload import Payload, metered
from .pipeline import (
    PREFIX,
    WHOLE_STEP_UNITS,
    Dispatch,
    MeasuredFrontierWidth,
    MonotonicClock,
    PipelineInvariantError,
    Round,
    RoundAbortedError,
    RoundShape,
    RoundTimeline,
    trains_after_first_step,
)
from .rollout_stream import REQUEST_COLUMNS, GroupRequest, GroupRolloutStream
from .round_metrics import merge_metric_lists, round_line, round_metrics

logger = get_logger(__name__)


class _Rerouted:
    """The actor worker group with one method answered by another, so verl's trainer code that calls the first
    (``_compute_old_log_prob``, ``_update_actor``) runs unchanged on the streaming worker's variant."""

    def __init__(self, wg, method: str, to: str | Callable) -> None:
        self._wg = wg
        setattr(self, method, getattr(wg, to) if isinstance(to, str) else to)

    def __getattr__(self, name: str):
        return getattr(self._wg, name)


class _RoundPrompts:
    """A round's prompts by group id: the round's batch (groups 0..R-1), then -- for groups that replace filtered
    ones -- rows of later dataloader batches, pulled only when needed (the unused rest of a pulled batch is
    skipped, as verl's DAPO loop discards its surplus)."""

    def __init__(self, trainer: RolloutPipeTrainer, batch: DataProto,
                 more: Callable[[], DataProto | None] | None) -> None:
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


@dataclass
class _RoundRun:
    """A round in flight: the pipeline's Round plus what the verl side holds for it."""

    rnd: Round
    pipe: PipeSettings
    prompts: _RoundPrompts
    stream: GroupRolloutStream
    trainable: dict[int, DataProto] = field(default_factory=dict)  # materialized, not yet dispatched
    trained: list[DataProto] = field(default_factory=list)
    step_outputs: list[DataProto] = field(default_factory=list)
    timing: dict[str, float] = field(default_factory=dict)  # verl's marked_timer: seconds per phase
    snapshot: dict[str, float | str] | None = None  # π_old snapshot of rank 0: bytes, seconds, placement
    reward_kl: RoundRewardKL | None = None  # algorithm.use_kl_in_reward
    reward_kl_metrics: dict[str, float] = field(default_factory=dict)
    payload: Payload = field(default_factory=Payload)  # the round's data calls to the trainer pool, and their bytes


class RolloutPipeTrainer(RayPPOTrainer):
    """Streaming GRPO: CGP (train on complete groups while the round generates) + FGD (frontier admission)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.pipe: PipeSettings = validate(self.config)
        self.weights_version = 0
        self.clock = MonotonicClock()
        self.timeline_dir = Path(self.config.rolloutpipe.timeline_dir)
        self.round_rewards: list[float] = []
        self._phase_timing: dict[str, float] = {}
        self._reward_kl: RoundRewardKL | None = None
        self._frontier_widths: dict[tuple, MeasuredFrontierWidth] = {}  # frontier_width=auto, per round shape
        self.val_scores: list[tuple[int, float]] = []
        self.groups_trained_total = 0
        self.failover: ReplicaFailover | None = None  # disaggregated layout: replicas that may die mid-round
        self._step_metrics: list[DataProto] = []  # train_unit=groups: the open step's accumulate calls

    # ---- the training loop -----------------------------------------------------------------------------------
    def fit(self) -> None:
        from omegaconf import OmegaConf
        from verl.utils.tracking import Tracking

        tracker = Tracking(project_name=self.config.trainer.project_name,
                           experiment_name=self.config.trainer.experiment_name,
                           default_backend=self.config.trainer.logger,
                           config=OmegaConf.to_container(self.config, resolve=True))
        self.report_trainer_pool()
        self.global_steps = 0
        if self.config.rolloutpipe.layout == "disaggregated":
            self.failover = ReplicaFailover(self.llm_server_manager)
        self._load_checkpoint()
        with self._one_message_if_a_worker_fails("before round 1 (publishing the starting weights)"):
            self.checkpoint_manager.update_weights(self.global_steps)
        self.weights_version = self.global_steps
        test_freq = self.config.trainer.test_freq
        if self.val_dataset is not None and self.config.trainer.get("val_before_train", False):
            tracker.log(data=self._validate_and_report(), step=self.global_steps)
        self.global_steps += 1
        batches = self._prompt_batches()
        while True:
            metrics = self._fit_round_or_abort(next(batches), more_prompts=lambda: next(batches)).metrics
            self._check_engine_has_the_weights(metrics)
            last = self.global_steps >= self.total_training_steps
            if test_freq > 0 and (last or self.global_steps % test_freq == 0):
                metrics.update(self._validate_and_report())
            tracker.log(data=metrics, step=self.global_steps)
            if self.config.trainer.save_freq > 0 and self.global_steps % self.config.trainer.save_freq == 0:
                self._save_checkpoint()
            if last:
                break
            self.global_steps += 1
        blocks = [self.round_rewards[i : i + 10] for i in range(0, len(self.round_rewards), 10)]
        logger.info(f"[rolloutpipe] done: {self.groups_trained_total} groups trained; mean training reward per 10 "
                    "rounds "
                    f"{[round(sum(b) / len(b), 3) for b in blocks]}; validation {self.val_scores}")
        png = write_learning_curve(self.round_rewards, self.val_scores, self.timeline_dir,
                                   title=f"{self.config.trainer.experiment_name}: {self.pipe.mode}")
        logger.info(f"[rolloutpipe] learning curve: {png}")

    def report_trainer_pool(self) -> None:
        nodes = self.actor_rollout_wg.ray_node_id()
        logger.info(f"[rolloutpipe] trainer pool: {len(nodes)} FSDP rank(s) on {len(set(nodes))} Ray node(s)")

    def _prompt_batches(self) -> Iterator[DataProto]:
        """The dataloader's batches, epoch after epoch (verl's StatefulDataLoader: its position is checkpointed)."""
        while True:
            for batch_dict in self.train_dataloader:
                yield DataProto.from_single_dict(batch_dict)

    def _fit_round_or_abort(self, batch: DataProto,
                            more_prompts: Callable[[], DataProto] | None = None) -> RoundResult:
        """``fit_round``; a dead worker (trainer or rollout side) or an engine that stopped taking the published
        weights becomes one message naming the round and the checkpoint to resume from."""
        with self._one_message_if_a_worker_fails(f"during round {self.global_steps}"):
            return self.fit_round(batch, more_prompts)

    @contextmanager
    def _one_message_if_a_worker_fails(self, when: str) -> Iterator[None]:
        try:
            yield
        except Exception as e:  # only a dead actor or a failed publication is translated; the rest is re-raised
            dead = dead_actor_error(e)
            if dead is None:
                raise
            step = self._latest_checkpoint_step()
            who = "the rollout engine failed" if isinstance(dead, WeightPublicationError) else "a worker died"
            what = str(dead) if isinstance(dead, (NoRolloutReplicaLeftError, WeightPublicationError)) \
                else type(dead).__name__
            raise RoundAbortedError(
                f"rolloutpipe: {who} {when} ({what}); nothing of the round was published (the rollout "
                f"holds weights v{self.weights_version} or a partial load of the next). Last checkpoint: "
                + (f"{self._checkpoint_dir(step)}; rerun the same command (trainer.resume_mode=auto) to restart round "
                   f"{step + 1} from it." if step is not None else
                   "none (set trainer.save_freq to checkpoint at round boundaries); rerun to start over.")
            ) from None

    def _check_engine_has_the_weights(self, metrics: dict[str, Any]) -> None:
        """Stop when the round's responses were not sampled by the weights the trainer holds: their vLLM log-probs
        and the trainer's differ by more than ``rolloutpipe.max_logprob_gap_p90`` (p90 over response tokens).
        A publication that did nothing -- verl sending an unmerged LoRA adapter's base weights only -- is silent
        otherwise: the run goes on training on another policy's samples."""
        bound = self.config.rolloutpipe.get("max_logprob_gap_p90")
        gap = metrics.get(PREFIX + "rollout_vs_trainer_logprob_diff_p90")
        if bound is None or gap is None or not gap > bound:
            return
        step = self._latest_checkpoint_step()
        raise RoundAbortedError(
            f"rolloutpipe: round {self.global_steps} was not generated with the trainer's weights v"
            f"{self.weights_version - 1}: p90 |vLLM log-prob - trainer log-prob| = {gap:.4g} > "
            f"rolloutpipe.max_logprob_gap_p90={bound:g} (the engine holds other weights: the publication did not "
            "reach it -- with LoRA in the disaggregated layout keep actor_rollout_ref.model.lora.merge=true). Last "
            "checkpoint: " + (str(self._checkpoint_dir(step)) if step is not None else "none")
            + "; raise the bound or set it to null only if this gap is expected (other kernels or precisions)")

    def _checkpoint_dir(self, step: int) -> Path:
        return Path(self.config.trainer.default_local_dir) / f"global_step_{step}"

    def _latest_checkpoint_step(self) -> int | None:
        """verl's tracker of the last complete checkpoint (written last by ``_save_checkpoint``)."""
        tracker = Path(self.config.trainer.default_local_dir) / "latest_checkpointed_iteration.txt"
        return int(tracker.read_text().strip()) if tracker.exists() else None

    # ---- checkpoints at round boundaries: verl's (actor, optimizer, scheduler, data position) + ours ----------
    STATE_FILE = "rolloutpipe_state.json"

    def _save_checkpoint(self) -> None:
        """Called between rounds only: every group of the finished rounds is consumed and published, none is in
        flight, so verl's checkpoint (weights, optimizer, data position) plus the round counter is the whole
        state; resuming starts at the next round's groups -- none lost, none trained twice."""
        super()._save_checkpoint()
        folder = self._checkpoint_dir(self.global_steps)
        state = {"rounds_completed": self.global_steps, "weights_version": self.weights_version,
                 "groups_trained_total": self.groups_trained_total, "round_rewards": self.round_rewards,
                 "val_scores": self.val_scores}
        tmp = folder / (self.STATE_FILE + ".tmp")
        tmp.write_text(json.dumps(state))
        os.replace(tmp, folder / self.STATE_FILE)

    def _load_checkpoint(self):
        out = super()._load_checkpoint()
        if self.global_steps:
            state_file = self._checkpoint_dir(self.global_steps) / self.STATE_FILE
            if state_file.exists():
                state = json.loads(state_file.read_text())
                if state["rounds_completed"] != self.global_steps:
                    raise PipelineInvariantError(f"{state_file}: rounds_completed={state['rounds_completed']} but "
                                                 f"verl resumed at global step {self.global_steps}")
                self.groups_trained_total = state["groups_trained_total"]
                self.round_rewards = list(state["round_rewards"])
                self.val_scores = [tuple(v) for v in state["val_scores"]]
            logger.info(f"[rolloutpipe] resumed after round {self.global_steps} ({self.groups_trained_total} groups "
                        f"trained so far): the next round is {self.global_steps + 1}")
        return out

    def fit_round(self, batch: DataProto, more_prompts: Callable[[], DataProto | None] | None = None, *,
                  pipe: PipeSettings | None = None, draw_png: bool | None = None) -> RoundResult:
        """One round: stream R groups through the pipeline, train them, publish weights v+1.

        With dynamic sampling (``algorithm.filter_groups``), a group whose K rewards are all equal is dropped and
        replaced by the next prompt (``more_prompts`` gives the next dataloader batch when the round's runs out).
        ``pipe`` runs this round with another shape (mode, R, F_w, FGD strength, train unit; the benchmark does);
        ``draw_png`` forces the Gantt PNG on or off (default: ``rolloutpipe.timeline_png_every``). With
        ``frontier_width=auto`` the round's F_w comes from the previous round of the same shape."""
        pipe, width = self._with_measured_frontier(pipe or self.pipe)
        run = self._fit_start_round(batch, more_prompts, pipe)
        roller = threading.Thread(target=self._fit_rollout_side, args=(run,), daemon=True,
                                  name=f"rolloutpipe-rollout-v{run.rnd.version}")
        bar = tqdm(total=run.pipe.num_groups, desc=f"round {self.global_steps} [{run.pipe.mode}] consumed",
                   unit="group", leave=False)
        roller.start()
        whole_step = run.pipe.train_unit in WHOLE_STEP_UNITS
        while (d := run.rnd.next_dispatch(whole_step, self.config.rolloutpipe.stall_timeout_s,
                                          ready_steps=run.pipe.train_unit == "steps")) is not None:
            with marked_timer("rolloutpipe/train", run.timing):
                self._fit_train_dispatch(run, d)
            bar.set_postfix(materialized=len(run.rnd.ledger.materialization_order), in_engine=run.stream.inflight)
            bar.update(len(d.group_ids))
        roller.join()
        bar.close()
        with marked_timer("rolloutpipe/publish", run.timing):
            self._fit_publish(run)
        if width is not None:
            width.observe(run.rnd.timeline)
        return self._fit_report(run, draw_png)

    def _with_measured_frontier(self, pipe: PipeSettings) -> tuple[PipeSettings, MeasuredFrontierWidth | None]:
        """``frontier_width=auto``: the pipe with this round's F_w, and the controller that takes its timeline (one
        per round shape, so the benchmark's interleaved modes and sizes each keep their own)."""
        if not pipe.frontier_auto:
            return pipe, None
        key = (pipe.mode, pipe.fgd_strength, pipe.num_groups, pipe.step_groups, pipe.train_unit)
        width = self._frontier_widths.setdefault(key, MeasuredFrontierWidth(pipe.step_groups, pipe.num_groups))
        return dataclasses.replace(pipe, frontier_width=width.width), width

    # ---- the round's hooks, in the order fit_round calls them ----------------------------------------------------
    def _fit_start_round(self, batch: DataProto, more_prompts: Callable[[], DataProto | None] | None,
                         pipe: PipeSettings) -> _RoundRun:
        """The round's pipeline state (``pipeline.Round``), its prompts and the per-group rollout stream; the
        worker snapshots π_old = weights v when a later optimizer step will need it."""
        for key in ("group_size", "step_groups", "old_log_prob", "filter_metric"):  # worker/group-level settings
            if getattr(pipe, key) != getattr(self.pipe, key):
                raise ValueError(f"fit_round(pipe=...) cannot change {key} (the run's is {getattr(self.pipe, key)})")
        shape = RoundShape(pipe.num_groups, pipe.group_size, pipe.step_groups, mode=pipe.mode,
                           frontier_width=pipe.frontier_width, fgd_strength=pipe.fgd_strength,
                           max_buffered_groups=pipe.max_buffered_groups, max_extra_groups=pipe.max_extra_groups)
        rnd = Round(self.weights_version, shape, self.clock)
        rnd.timeline.settings["train_unit"] = pipe.train_unit
        # π_old of a call after the round's first optimizer step comes from the round-start snapshot
        later_steps = trains_after_first_step(pipe.mode, pipe.train_unit in WHOLE_STEP_UNITS, pipe.num_groups,
                                              pipe.step_groups,
                                              may_end_short=pipe.filter_metric is not None)
        snapshot = self.actor_rollout_wg.begin_round(snapshot=pipe.old_log_prob == "snapshot" and later_steps,
                                                     placement=self.config.rolloutpipe.snapshot_placement)[0]
        stream = GroupRolloutStream(self.async_rollout_manager.agent_loop_workers, pipe.group_size)
        run = _RoundRun(rnd, pipe, _RoundPrompts(self, batch, more_prompts), stream, snapshot=snapshot)
        if self.config.algorithm.use_kl_in_reward:
            run.reward_kl = RoundRewardKL(self.kl_ctrl_in_reward, self.config.algorithm.kl_penalty,
                                          float(self.kl_ctrl_in_reward.value))
        # what a train call needs of the round: the phases timed inside it (old log-probs) add up in its timing
        self._phase_timing, self._reward_kl = run.timing, run.reward_kl
        return run

    def _fit_rollout_side(self, run: _RoundRun) -> None:
        """The rollout thread: send what the round admits, turn each finished group into training rows (or filter
        it), until the round's data is final. A failure is handed to the trainer thread through the Round."""
        try:
            self._fit_send(run, run.rnd.admit())
            while not run.rnd.rollout_closed:
                self._fit_send(run, run.rnd.admit())  # groups the buffer bound held back, once some are consumed
                for gid, out in run.stream.poll(timeout_s=0.05):
                    run.rnd.served(gid)
                    rows = self._materialize_group(run.prompts.row(gid), out)
                    metric = run.pipe.filter_metric  # dynamic sampling (verl's algorithm.filter_groups)
                    if metric is None or keep_if_metric_varies(rows, metric)[0]:
                        run.trainable[gid] = rows
                        run.rnd.materialized(gid)
                    else:
                        run.rnd.filtered(gid, replaceable=run.prompts.available(len(run.rnd.ledger.groups)))
                    self._fit_send(run, run.rnd.admit())
                if run.stream.lost:
                    self._resend_lost_groups(run)
        except BaseException as e:
            run.rnd.fail(e)

    def _fit_send(self, run: _RoundRun, admissions: list) -> None:
        """The admitted groups' K requests each to vLLM, in one call per agent-loop worker (seeded per request when
        ``rolloutpipe.sampling_seed`` is set)."""
        base = self.config.rolloutpipe.get("sampling_seed")
        run.stream.submit([
            GroupRequest(a.group_id, run.prompts.gen_row(a.group_id), a.priority, {"global_steps": self.global_steps},
                         None if base is None else request_seed(int(base), self.global_steps, a.group_id,
                                                                run.pipe.group_size))
            for a in admissions])

    def _fit_train_dispatch(self, run: _RoundRun, d: Dispatch) -> None:
        """Train the dispatched groups: one verl update for a whole step (``train_unit: step``; ``steps``: for every
        whole step that was ready; sync: for the round's whole steps), else accumulate them and step when the
        dispatch closes the optimizer step."""
        rows = DataProto.concat([run.trainable.pop(g) for g in d.training_order]) if d.group_ids else None
        if rows is None and not (run.pipe.train_unit == "groups" and d.ends_step):
            return
        t0 = self.clock.now()
        # whole steps (sync: the whole round's) in one verl update call; else a short last step
        whole = run.pipe.train_unit in WHOLE_STEP_UNITS and len(d.group_ids) == run.pipe.step_groups * d.steps
        order = None
        if whole and d.steps > 1 and (dp := self._data_parallel_size) > 1:  # verl's mini-batch s = step s's groups
            order = dp_step_order(len(rows), len(rows) // d.steps, dp)
            rows = rows.select_idxs(order)
        with metered(self, run.payload):
            out = self._train_step(rows, d.step_index) if whole else self._train_groups(rows, d)
        if order is not None:  # back in training order, with what the call added (π_old, ref, KL-penalised reward)
            rows = rows.select_idxs(np.argsort(order))
        run.rnd.trained(d, t0, self.clock.now(), trainer_version=self.weights_version)
        if out is not None:
            run.step_outputs.append(out)
        if rows is not None:
            run.trained.append(rows)

    def _fit_publish(self, run: _RoundRun) -> None:
        """Weights v+1 to the rollout side -- only once every group of round v is consumed (the Round checks)."""
        self.actor_rollout_wg.end_round()
        run.rnd.check_publishable()
        if run.reward_kl is not None:  # the KL controller's one update of the round, as verl's trainer does
            run.reward_kl_metrics = run.reward_kl.close()
        if self.failover is not None:
            self._drop_dead_replicas(None)  # one that died after its last request must not fail the publish
        t0 = self.clock.now()
        self.checkpoint_manager.update_weights(self.global_steps)
        run.rnd.published(t0, self.clock.now())
        self.weights_version += 1
        self.groups_trained_total += sum(len(rows) for rows in run.trained) // run.pipe.group_size

    # ---- rollout replicas that die mid-round (disaggregated layout) ---------------------------------------------
    def _drop_dead_replicas(self, cause: BaseException | None) -> None:
        dropped = self.failover.drop_dead()
        if dropped:
            logger.info(f"[rolloutpipe] rollout replica(s) {dropped} died in round {self.global_steps}: removed from "
                        f"request routing and weight publication; {self.failover.alive} of {self.failover.started} "
                        "left")
        if not self.failover.alive:
            raise NoRolloutReplicaLeftError(f"all {self.failover.started} rollout replicas died") from cause

    def _resend_lost_groups(self, run: _RoundRun) -> None:
        """Groups whose call died with an actor: if a rollout replica is dead, it leaves routing and the groups go
        again (same requests, same seeds) to the survivors; nothing of them was materialized, so each is still
        trained exactly once. Any other dead actor (agent-loop or reward worker) stops the round."""
        first = next(iter(run.stream.lost.values()))
        if self.failover is None:
            raise first
        self._drop_dead_replicas(first)
        if not self.failover.dropped:
            raise first  # no replica died: not a failure re-sending can fix
        lost = sorted(run.stream.lost)
        run.rnd.resend(lost)
        run.stream.resend(lost)
        logger.info(f"[rolloutpipe] round {self.global_steps}: groups {lost} lost with a dead rollout replica, re-sent "
                    f"to the {self.failover.alive} surviving replica(s)")

    def _validate_and_report(self) -> dict:
        """verl's validation (val set, ``val_kwargs`` sampling) between rounds, when no round is in flight."""
        val = self._validate()
        score = {k: v for k, v in val.items() if k.endswith("/reward/mean@1") or "acc/mean" in k}
        if score:
            self.val_scores.append((self.global_steps, round(float(next(iter(score.values()))), 3)))
        logger.info(f"[rolloutpipe] validation after round {self.global_steps}: "
                    + " ".join(f"{k}={v:.3f}" for k, v in score.items()))
        return val

    # ---- rollout side: one complete group -> trainable rows ---------------------------------------------------
    def group_rows(self, prompt_row: DataProto, out: DataProto) -> DataProto:
        """A group's K training rows: the prompt's row repeated, joined with the agent loop's K outputs."""
        rows = prompt_row.repeat(repeat_times=self.pipe.group_size, interleave=True)
        out.non_tensor_batch.pop("uid", None)  # the reward loop may drop or rewrite it: the prompt's uid wins
        for key in REQUEST_COLUMNS:
            out.non_tensor_batch.pop(key, None)
        out.meta_info.pop("metrics", None)  # the agent loop's per-sample timings; not part of the training batch
        rows = rows.union(out)
        if "response_mask" not in rows.batch.keys():
            rows.batch["response_mask"] = compute_response_mask(rows)
        return rows

    def _materialize_group(self, prompt_row: DataProto, out: DataProto) -> DataProto:
        """Rewards, response mask, GRPO advantages (verl's code on this group alone; with a KL penalty in the
        reward they wait for π_old and the reference, on the trainer side), π_old if from the rollout."""
        rows = self.group_rows(prompt_row, out)
        reward_tensor, extra = extract_reward(rows)
        if reward_tensor is None or not bool(reward_tensor.isfinite().all()):
            raise PipelineInvariantError(f"reward for prompt uid {rows.non_tensor_batch['uid'][0]} is not finite")
        rows.batch["token_level_scores"] = reward_tensor
        rows.batch["token_level_rewards"] = reward_tensor
        if extra:
            rows.non_tensor_batch.update({k: np.array(v) for k, v in extra.items()})
        if not self.config.algorithm.use_kl_in_reward:
            rows = self._advantages(rows)
        if self.pipe.old_log_prob == "rollout":
            rows.batch["old_log_probs"] = rows.batch["rollout_log_probs"]
        return rows

    def _advantages(self, rows: DataProto) -> DataProto:
        """GRPO advantages of whole groups (verl's code; normalised within each uid, so per group = per batch)."""
        algo = self.config.algorithm
        return compute_advantage(rows, adv_estimator=algo.adv_estimator, gamma=algo.gamma, lam=algo.lam,
                                 num_repeat=self.pipe.group_size,
                                 norm_adv_by_std_in_grpo=algo.get("norm_adv_by_std_in_grpo", True), config=algo)

    def _with_kl_in_reward(self, rows: DataProto) -> DataProto:
        """``algorithm.use_kl_in_reward``: the rows' rewards minus β·KL(π_old ‖ ref) (verl's ``apply_kl_penalty``),
        then their advantages -- on the trainer side, once π_old and the reference log-probs are there."""
        if self._reward_kl is None:
            return rows
        return self._advantages(self._reward_kl.apply(rows))

    # ---- trainer side: one optimizer step on U complete groups ------------------------------------------------
    @contextmanager
    def _routed(self, method: str, to: str | Callable) -> Iterator[None]:
        """verl's trainer code inside calls the streaming worker's ``to`` where it calls ``method``."""
        live = self.actor_rollout_wg
        self.actor_rollout_wg = _Rerouted(live, method, to)
        try:
            yield
        finally:
            self.actor_rollout_wg = live

    def _old_log_probs(self, rows: DataProto, step_index: int) -> DataProto:
        """π_old = weights v. Before the round's first optimizer step the live weights are v; after it, the
        snapshot of v answers (exact, equal to the serial run)."""
        with self._routed("compute_log_prob", "compute_log_prob_live" if step_index == 0 else
                          "compute_log_prob_snapshot"):
            old, _ = self._compute_old_log_prob(rows)
        old.batch.pop("entropys")
        return old

    def _with_old_log_probs(self, rows: DataProto, step_index: int) -> DataProto:
        if self.pipe.old_log_prob == "snapshot":
            with marked_timer("rolloutpipe/old_log_prob", self._phase_timing):  # the rest of a train call: update
                rows = rows.union(self._old_log_probs(rows, step_index))
        return rows

    def _with_ref_log_probs(self, rows: DataProto) -> DataProto:
        """KL to the reference policy (``actor.use_kl_loss``): the rows' reference log-probs from verl's own ref call
        (the ref worker, or the actor without its LoRA adapter), on the trainer pool, per dispatched step or group --
        the same numbers the serial run computes for the whole batch (the reference never changes)."""
        if not self.use_reference_policy:
            return rows
        # a call of one group can be smaller than verl's micro-batch: the one that fits, as verl's per-call key
        cfg = self.config.actor_rollout_ref.rollout if self.ref_in_actor else self.config.actor_rollout_ref.ref
        per_rank = len(rows) // (self.actor_rollout_wg if self.ref_in_actor else self.ref_policy_wg).world_size
        fit = fitting_micro_batch(per_rank, cfg.get("log_prob_micro_batch_size_per_gpu"),
                                  cfg.get("log_prob_use_dynamic_bsz", False))
        if fit is not None:
            rows.meta_info["micro_batch_size_per_gpu"] = fit
        try:
            with marked_timer("rolloutpipe/ref_log_prob", self._phase_timing):
                return rows.union(self._compute_ref_log_prob(rows))
        finally:
            rows.meta_info.pop("micro_batch_size_per_gpu", None)

    def _train_step(self, rows: DataProto, step_index: int) -> DataProto:
        """``train_unit: step``: the whole step (its U groups) in one worker call, verl's update with π_old computed
        in the same call (``update_actor_in_round``); with π_old from the rollout, or with sequence parallelism
        (π_old then needs a call of its own), the rows bring it. ``sync`` sends its whole round here: verl's update
        splits it into its R/U mini-batch steps, π_old of all of them from the live weights first."""
        return self._train_call(rows, step_index, self.actor_rollout_wg.update_actor_in_round)

    def _train_call(self, rows: DataProto, step_index: int, worker_call, **meta) -> DataProto:
        """One training call through verl's ``_update_actor`` routed to ``worker_call`` (``update_actor_in_round`` or
        ``accumulate``), with π_old computed in the same call where it can be (``OLD_LOG_PROB_FROM``), else first in
        a call of its own; ``meta``: more meta keys for the worker. Returns verl's update output."""
        from verl.utils import tensordict_utils as tu
        from verl.workers.utils.padding import no_padding_2_padding

        from rolloutpipe_workers.streaming_actor import OLD_LOG_PROB_FROM  # worker module: import where used

        # π_old in the training call, unless a KL penalty in the reward needs it before the advantages
        in_call = self.pipe.old_log_prob == "snapshot" and self._fused_update and self._reward_kl is None
        _count_tokens(rows)
        rows = self._with_ref_log_probs(rows if in_call else self._with_old_log_probs(rows, step_index))
        rows = self._with_kl_in_reward(rows)
        meta[OLD_LOG_PROB_FROM] = ("live" if step_index == 0 else "snapshot") if in_call else "batch"
        rows.meta_info.update(meta)
        sent = {}

        def update_actor(batch_td):  # verl's _update_actor builds the call; keep what π_old needs back here
            sent["td"], sent["out"] = batch_td, worker_call(batch_td)
            return sent["out"]

        try:
            with self._routed("update_actor", update_actor):
                out = self._update_actor(rows)
        finally:
            for key in meta:
                rows.meta_info.pop(key)
        if in_call:  # π_old back in the rows, padded as verl's _compute_old_log_prob returns it (metrics, checks)
            rows.batch["old_log_probs"] = no_padding_2_padding(tu.get(sent["out"], "log_probs"), sent["td"]).float()
        return out

    @property
    def _data_parallel_size(self) -> int:
        """Ranks verl's update splits a batch between (sequence-parallel ranks share their rows)."""
        sp = int(self.config.actor_rollout_ref.actor.get("ulysses_sequence_parallel_size", 1))
        return self.actor_rollout_wg.world_size // sp

    @property
    def _fused_update(self) -> bool:
        """π_old inside the update call needs every trainer rank to hold its own log-probs: no sequence parallelism."""
        return int(self.config.actor_rollout_ref.actor.get("ulysses_sequence_parallel_size", 1)) == 1

    def _train_groups(self, rows: DataProto | None, d) -> DataProto | None:  # a pipeline Dispatch
        """``train_unit: groups``: forward + backward on the groups there are now (verl's update path, routed to the
        worker's ``accumulate``), π_old and -- when the dispatch closes the step -- the optimizer step in the same
        call. Returns the step's metrics then, else None."""
        from rolloutpipe_workers.streaming_actor import STEP_AFTER  # worker module: import where used

        if rows is not None:
            self._step_metrics.append(self._train_call(rows, d.step_index, self.actor_rollout_wg.accumulate,
                                                       **{STEP_AFTER: d.ends_step}))
        if not d.ends_step:
            return None
        calls, self._step_metrics = self._step_metrics, []
        metrics = reduce_metrics(merge_metric_lists([c.meta_info["metrics"] for c in calls]))
        if rows is None:  # a step closed by a dispatch without rows: the step in a call of its own
            metrics.update(self.actor_rollout_wg.optimizer_step()[0])
        else:  # taken in the last call, whose metrics verl's _update_actor prefixed with actor/
            metrics[PREFIX + "step_tokens"] = metrics.pop("actor/step_tokens")
        return DataProto.from_single_dict(data={}, meta_info={"metrics": metrics})

    # ---- metrics ------------------------------------------------------------------------------------------------
    def _fit_report(self, run: _RoundRun, draw_png: bool | None) -> RoundResult:
        """The round's timeline files, its metrics (docs/metrics.md) and its one console line."""
        p, timeline = run.pipe, run.rnd.timeline
        stem = f"round{self.global_steps:04d}_{p.mode}"
        every = self.config.rolloutpipe.timeline_png_every
        png = draw_png if draw_png is not None else (self.global_steps == 1 or self.global_steps >= (
            self.total_training_steps or 0) or (every > 0 and self.global_steps % every == 0))
        timeline.write(self.timeline_dir, stem, png=png)
        metrics = round_metrics(timeline, run.trained, run.step_outputs, p.group_size, p.step_groups,
                                snapshot=p.old_log_prob == "snapshot")
        metrics.update({f"timing_s/{k}": v for k, v in run.timing.items()})
        metrics.update(run.reward_kl_metrics)
        metrics[PREFIX + "frontier_width"] = float(p.frontier_width)  # F_w this round ran with (auto: measured)
        metrics[PREFIX + "trainer_payload_bytes"] = float(run.payload.bytes)
        metrics[PREFIX + "trainer_payload_calls"] = float(run.payload.calls)
        if run.snapshot is not None:  # π_old snapshot of weights v (trainer rank 0's shard)
            metrics[PREFIX + "snapshot_bytes"] = run.snapshot["bytes"]
            metrics[PREFIX + "snapshot_take_s"] = run.snapshot["seconds"]
        if self.failover is not None:
            metrics[PREFIX + "rollout_replicas_alive"] = float(self.failover.alive)
        metrics["training/global_step"] = self.global_steps
        self.round_rewards.append(float(metrics["critic/score/mean"]))
        path = self.timeline_dir / f"{stem}.{'png' if png else 'json'}"
        logger.info(round_line(self.global_steps, p, metrics, path))
        return RoundResult(metrics, run.trained, run.step_outputs, timeline.calls_per_step(), timeline,
                           self.timeline_dir / f"{stem}.json")


class DisaggregatedRolloutPipeTrainer(RolloutPipeTrainer, OneStepOffRayTrainer):
    """The same round on separate pools: the actor on the trainer pool (``DetachActorWorker``), rollout on
    standalone vLLM replicas with their own pool, weights published through verl's ``CheckpointEngineManager``.
    Worker layout and start-up come from verl's ``OneStepOffRayTrainer`` (via ``SeparateRayPPOTrainer``); the
    training loop is RolloutPipe's (its synchronous ``fit`` replaces one-step-off's asynchronous one)."""


def _count_tokens(rows: DataProto) -> None:
    """verl's per-sequence token counts for its throughput metrics (its trainer sets them before the update)."""
    rows.meta_info["global_token_num"] = rows.batch["attention_mask"].sum(dim=-1).tolist()


def dp_step_order(rows: int, rows_per_step: int, dp: int) -> list[int]:
    """verl's update call splits its batch into ``dp`` contiguous chunks, one per rank, and each rank then walks its
    chunk mini-batch by mini-batch. So that mini-batch s of every rank is that rank's share of step s -- as in a
    one-step call -- rows in step order go to the call rank by rank, step by step: this permutation."""
    share, steps = rows_per_step // dp, rows // rows_per_step
    return [s * rows_per_step + r * share + i for r in range(dp) for s in range(steps) for i in range(share)]


def request_seed(base: int, round_index: int, group_id: int, group_size: int) -> int:
    """First vLLM seed of a group's K requests: a function of (base, round, group) only, so the same round
    regenerates the same samples in a resumed run, whatever the admission order."""
    return (base * 1_000_003 + round_index * 65_537 + group_id * group_size) % (2**31 - group_size)

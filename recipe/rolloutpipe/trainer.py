"""RolloutPipeTrainer: verl's ``RayPPOTrainer`` with a streaming, exactly on-policy round.

A round (= one verl training step, one weight version v):
  submit R prompt groups → each group, once its K responses are rewarded, gets GRPO advantages (verl's own
  ``compute_advantage`` on that group alone) and is *materialized* into the CGP FIFO → the trainer takes one
  optimizer step per U groups as soon as they are there, while later groups are still generating with weights v →
  after the last group: publish weights v+1.

Policy (admission, dispatch, step boundaries, invariants, metrics) lives in ``recipe.rolloutpipe.pipeline``; a round
in flight -- its rollout side (a thread: it waits on Ray object refs) and its train side (the calling thread), sharing
the ledger and the FIFO under one lock -- in ``streamed_round.StreamedRound``, its trainer calls in
``train_calls.TrainCalls``. This file keeps verl's loop around them: rounds, validation, checkpoints at round
boundaries, one message when a worker dies, and the ``_fit_*`` hooks a subclass (the verifier) overrides.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tqdm import tqdm
from verl import DataProto
from verl.experimental.one_step_off_policy.ray_trainer import OneStepOffRayTrainer
from verl.trainer.ppo.ray_trainer import RayPPOTrainer
from verl.utils.profiler import marked_timer

from rolloutpipe_workers.vllm_compat import WeightPublicationError

from .actor_group import StreamingActorGroup
from .config_check import validate
from .drawing import write_timeline
from .failover import NoRolloutReplicaLeftError, ReplicaFailover, dead_actor_error
from .learning_curve import write_learning_curve
from .logs import get_logger
from .pipeline import (
    PREFIX,
    Dispatch,
    MeasuredFrontierWidth,
    MonotonicClock,
    PipelineInvariantError,
    RoundAbortedError,
    RoundSettings,
)
from .round_metrics import round_line, round_metrics
from .streamed_round import RoundResult, StreamedRound

logger = get_logger(__name__)


class RolloutPipeTrainer(RayPPOTrainer):
    """Streaming GRPO: CGP (train on complete groups while the round generates) + FGD (frontier admission)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.settings: RoundSettings = validate(self.config)
        self.weights_version = 0
        self.clock = MonotonicClock()
        self.timeline_dir = Path(self.config.rolloutpipe.timeline_dir)
        self.round_rewards: list[float] = []
        self._frontier_widths: dict[RoundSettings, MeasuredFrontierWidth] = {}  # frontier_width=auto, per setting
        self.val_scores: list[tuple[int, float]] = []
        self.groups_trained_total = 0
        self.failover: ReplicaFailover | None = None  # disaggregated layout: replicas that may die mid-round

    def init_workers(self) -> None:
        """verl's workers; then the actor worker group behind the one wrapper the round's calls go through
        (routing to the streaming worker's variants, payload metering: actor_group.py)."""
        super().init_workers()
        self.actor_rollout_wg = StreamingActorGroup(self.actor_rollout_wg)

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
            save_freq = self.config.trainer.save_freq  # as verl's trainer: every save_freq rounds and the last one
            if save_freq > 0 and (last or self.global_steps % save_freq == 0):
                self._save_checkpoint()
            if last:
                break
            self.global_steps += 1
        blocks = [self.round_rewards[i : i + 10] for i in range(0, len(self.round_rewards), 10)]
        logger.info(f"[rolloutpipe] done: {self.groups_trained_total} groups trained; mean training reward per 10 "
                    "rounds "
                    f"{[round(sum(b) / len(b), 3) for b in blocks]}; validation {self.val_scores}")
        png = write_learning_curve(self.round_rewards, self.val_scores, self.timeline_dir,
                                   title=f"{self.config.trainer.experiment_name}: {self.settings.mode}")
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
        and the trainer's differ by more than ``rolloutpipe.max_logprob_gap_p50`` (median over response tokens).
        A publication that did nothing -- verl sending an unmerged LoRA adapter's base weights only -- is silent
        otherwise: the run goes on training on another policy's samples. The median, not the p90: under the same
        weights a few tokens' gaps are large (a round's p90 reached 1.2e-3 in 300 rounds, 10x its usual value),
        while staleness moves every token's log-prob (docs/reliability.md)."""
        bound = self.config.rolloutpipe.max_logprob_gap_p50
        gap = metrics.get(PREFIX + "rollout_vs_trainer_logprob_diff_p50")
        if bound is None or gap is None or not gap > bound:
            return
        step = self._latest_checkpoint_step()
        raise RoundAbortedError(
            f"rolloutpipe: round {self.global_steps} was not generated with the trainer's weights v"
            f"{self.weights_version - 1}: median |vLLM log-prob - trainer log-prob| = {gap:.3g} > "
            f"rolloutpipe.max_logprob_gap_p50={bound:g} (the engine holds other weights: the publication did not "
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
                  settings: RoundSettings | None = None, draw_png: bool | None = None) -> RoundResult:
        """One round: stream R groups through the pipeline, train them, publish weights v+1.

        With dynamic sampling (``algorithm.filter_groups``), a group whose K rewards are all equal is dropped and
        replaced by the next prompt (``more_prompts`` gives the next dataloader batch when the round's runs out).
        ``settings`` runs this round with other ones (mode, R, F_w, FGD strength, train unit; the benchmark does);
        ``draw_png`` forces the Gantt PNG on or off (default: ``rolloutpipe.timeline_png_every``). With
        ``frontier_width=auto`` the round's F_w comes from the previous round of the same settings."""
        settings, width = self._with_measured_frontier(settings or self.settings)
        t0 = self.clock.now()
        run = self._fit_start_round(batch, more_prompts, settings)
        roller = threading.Thread(target=run.roll_out, daemon=True, name=f"rolloutpipe-rollout-v{run.rnd.version}")
        bar = tqdm(total=settings.num_groups, desc=f"round {self.global_steps} [{settings.mode}] consumed",
                   unit="group", leave=False)
        roller.start()
        while (d := run.rnd.next_dispatch(self.config.rolloutpipe.stall_timeout_s)) is not None:
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
        run.timing["step"] = self.clock.now() - t0  # verl's timing_s/step: the whole round, publish included
        return self._fit_report(run, draw_png)

    def _with_measured_frontier(self, settings: RoundSettings) -> tuple[RoundSettings, MeasuredFrontierWidth | None]:
        """``frontier_width=auto``: the settings with this round's F_w, and the controller that takes its timeline
        (one per settings, so the benchmark's interleaved modes and sizes each keep their own)."""
        if not settings.frontier_auto:
            return settings, None
        width = self._frontier_widths.setdefault(settings, MeasuredFrontierWidth(settings.step_groups,
                                                                                 settings.num_groups))
        return settings.replace(frontier_width=width.width), width

    # ---- the round's hooks, in the order fit_round calls them ----------------------------------------------------
    def _fit_start_round(self, batch: DataProto, more_prompts: Callable[[], DataProto | None] | None,
                         settings: RoundSettings) -> StreamedRound:
        for key in ("group_size", "step_groups", "filter_metric"):  # worker/group-level settings
            if getattr(settings, key) != getattr(self.settings, key):
                raise ValueError(f"fit_round(settings=...) cannot change {key} (the run's is "
                                 f"{getattr(self.settings, key)})")
        return StreamedRound(self, settings, batch, more_prompts)

    def _fit_train_dispatch(self, run: StreamedRound, d: Dispatch) -> None:
        run.train(d)

    def _fit_publish(self, run: StreamedRound) -> None:
        run.publish()
        self.weights_version += 1
        self.groups_trained_total += sum(len(rows) for rows in run.trained) // run.settings.group_size

    # ---- rollout replicas that die mid-round (disaggregated layout) ---------------------------------------------
    def drop_dead_replicas(self, cause: BaseException | None) -> None:
        """Take dead replicas out of routing and publication; raise when none is left."""
        dropped = self.failover.drop_dead()
        if dropped:
            logger.info(f"[rolloutpipe] rollout replica(s) {dropped} died in round {self.global_steps}: removed from "
                        f"request routing and weight publication; {self.failover.alive} of {self.failover.started} "
                        "left")
        if not self.failover.alive:
            raise NoRolloutReplicaLeftError(f"all {self.failover.started} rollout replicas died") from cause

    def _validate_and_report(self) -> dict:
        """verl's validation (val set, ``val_kwargs`` sampling) between rounds, when no round is in flight."""
        val = self._validate()
        score = {k: v for k, v in val.items() if k.endswith("/reward/mean@1") or "acc/mean" in k}
        if score:
            self.val_scores.append((self.global_steps, round(float(next(iter(score.values()))), 3)))
        logger.info(f"[rolloutpipe] validation after round {self.global_steps}: "
                    + " ".join(f"{k}={v:.3f}" for k, v in score.items()))
        return val

    # ---- metrics ------------------------------------------------------------------------------------------------
    def _verl_round_metrics(self, run: StreamedRound, metrics: dict[str, Any]) -> dict[str, float]:
        """verl's own names for a round's phases and throughput, so a verl dashboard works unchanged. The phases
        overlap here (that is the point), so they do not add up to ``timing_s/step`` (docs/metrics.md)."""
        from verl.trainer.ppo.metric_utils import compute_throughout_metrics

        timing = {**run.timing, **run.rollout_timing}
        inside_train = timing.get("rolloutpipe/old_log_prob", 0.0) + timing.get("rolloutpipe/ref_log_prob", 0.0)
        tokens = [int(n) for rows in run.trained for n in rows.batch["attention_mask"].sum(-1).tolist()]
        verl_timing = {
            "gen": metrics[PREFIX + "rollout_s"],  # first admission to the last group served (rewards included)
            "reward": timing.get("rolloutpipe/materialize", 0.0),  # the driver's reward extraction + advantages
            "old_log_prob": timing.get("rolloutpipe/old_log_prob", 0.0),  # in calls of its own (else in the update)
            "update_actor": timing.get("rolloutpipe/train", 0.0) - inside_train,
            "update_weights": timing.get("rolloutpipe/publish", 0.0),
            "step": timing["step"],
        }
        out = {f"timing_s/{k}": v for k, v in verl_timing.items()}
        out.update(compute_throughout_metrics(DataProto(meta_info={"global_token_num": tokens}), verl_timing,
                                              self.resource_pool_manager.get_n_gpus()))
        return out

    def _fit_report(self, run: StreamedRound, draw_png: bool | None) -> RoundResult:
        """The round's timeline files, its metrics (docs/metrics.md) and its one console line."""
        p, timeline = run.settings, run.rnd.timeline
        stem = f"round{self.global_steps:04d}_{p.mode}"
        every = self.config.rolloutpipe.timeline_png_every
        png = draw_png if draw_png is not None else (self.global_steps == 1 or self.global_steps >= (
            self.total_training_steps or 0) or (every > 0 and self.global_steps % every == 0))
        write_timeline(timeline, self.timeline_dir, stem, png=png)
        metrics = round_metrics(timeline, run.trained, run.step_outputs, p.group_size, p.step_groups,
                                snapshot=run.old_log_prob == "snapshot")
        metrics.update({f"timing_s/{k}": v for k, v in {**run.timing, **run.rollout_timing}.items()})
        metrics.update(self._verl_round_metrics(run, metrics))
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

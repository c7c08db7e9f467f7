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

import json
import os
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from tqdm import tqdm
from verl import DataProto
from verl.experimental.one_step_off_policy.ray_trainer import OneStepOffRayTrainer
from verl.trainer.ppo.metric_utils import compute_data_metrics
from verl.trainer.ppo.ray_trainer import RayPPOTrainer, compute_advantage, compute_response_mask
from verl.trainer.ppo.reward import extract_reward
from verl.utils.metric import reduce_metrics

from .config_check import PipeSettings, validate
from .failover import NoRolloutReplicaLeftError, ReplicaFailover, dead_actor_error
from .learning_curve import write_learning_curve
from .pipeline import (
    PREFIX,
    CompleteGroupFIFO,
    GroupLedger,
    MonotonicClock,
    PipelineInvariantError,
    RoundAbortedError,
    RoundTimeline,
    dispatch_mode_of,
    make_admission,
)
from .rollout_stream import REQUEST_COLUMNS, GroupRolloutStream


class _Rerouted:
    """The actor worker group with one method answered by another, so verl's trainer code that calls the first
    (``_compute_old_log_prob``, ``_update_actor``) runs unchanged on the streaming worker's variant."""

    def __init__(self, wg, method: str, to: str) -> None:  # noqa: ANN001
        self._wg = wg
        setattr(self, method, getattr(wg, to))

    def __getattr__(self, name: str):  # noqa: ANN204
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


class RolloutPipeTrainer(RayPPOTrainer):
    """Streaming GRPO: CGP (train on complete groups while the round generates) + FGD (frontier admission)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.pipe: PipeSettings = validate(self.config)
        self.weights_version = 0
        self.clock = MonotonicClock()
        self.timeline_dir = Path(self.config.rolloutpipe.timeline_dir)
        self.round_rewards: list[float] = []
        self.val_scores: list[tuple[int, float]] = []
        self.groups_trained_total = 0
        self.failover: ReplicaFailover | None = None  # disaggregated layout: replicas that may die mid-round
        self._step_metrics: list[DataProto] = []  # train_unit=groups: the open step's accumulate calls

    # ---- the training loop -----------------------------------------------------------------------------------
    def fit(self) -> None:
        from omegaconf import OmegaConf
        from verl.utils.tracking import Tracking

        logger = Tracking(project_name=self.config.trainer.project_name,
                          experiment_name=self.config.trainer.experiment_name,
                          default_backend=self.config.trainer.logger,
                          config=OmegaConf.to_container(self.config, resolve=True))
        self.report_trainer_pool()
        self.global_steps = 0
        if self.config.rolloutpipe.layout == "disaggregated":
            self.failover = ReplicaFailover(self.llm_server_manager)
        self._load_checkpoint()
        self.checkpoint_manager.update_weights(self.global_steps)
        self.weights_version = self.global_steps
        test_freq = self.config.trainer.test_freq
        if self.val_dataset is not None and self.config.trainer.get("val_before_train", False):
            logger.log(data=self._validate_and_report(), step=self.global_steps)
        self.global_steps += 1
        batches = self._prompt_batches()
        while True:
            metrics = self._fit_round_or_abort(next(batches), more_prompts=lambda: next(batches))
            last = self.global_steps >= self.total_training_steps
            if test_freq > 0 and (last or self.global_steps % test_freq == 0):
                metrics.update(self._validate_and_report())
            logger.log(data=metrics, step=self.global_steps)
            if self.config.trainer.save_freq > 0 and self.global_steps % self.config.trainer.save_freq == 0:
                self._save_checkpoint()
            if last:
                break
            self.global_steps += 1
        blocks = [self.round_rewards[i : i + 10] for i in range(0, len(self.round_rewards), 10)]
        tqdm.write(f"[rolloutpipe] done: {self.groups_trained_total} groups trained; mean training reward per 10 "
                   "rounds "
                   f"{[round(sum(b) / len(b), 3) for b in blocks]}; validation {self.val_scores}")
        png = write_learning_curve(self.round_rewards, self.val_scores, self.timeline_dir,
                                   title=f"{self.config.trainer.experiment_name}: {self.pipe.mode}")
        tqdm.write(f"[rolloutpipe] learning curve: {png}")

    def report_trainer_pool(self) -> None:
        nodes = self.actor_rollout_wg.ray_node_id()
        tqdm.write(f"[rolloutpipe] trainer pool: {len(nodes)} FSDP rank(s) on {len(set(nodes))} Ray node(s)")

    def _prompt_batches(self) -> Iterator[DataProto]:
        """The dataloader's batches, epoch after epoch (verl's StatefulDataLoader: its position is checkpointed)."""
        while True:
            for batch_dict in self.train_dataloader:
                yield DataProto.from_single_dict(batch_dict)

    def _fit_round_or_abort(self, batch: DataProto, more_prompts: Callable[[], DataProto] | None = None) -> dict:
        """``fit_round``; a dead worker (trainer or rollout side) becomes one message naming the round and the
        checkpoint to resume from."""
        try:
            return self.fit_round(batch, more_prompts)
        except Exception as e:  # noqa: BLE001 - only a dead actor is translated; anything else is re-raised
            dead = dead_actor_error(e)
            if dead is None:
                raise
            step = self._latest_checkpoint_step()
            what = str(dead) if isinstance(dead, NoRolloutReplicaLeftError) else type(dead).__name__
            raise RoundAbortedError(
                f"rolloutpipe: a worker died during round {self.global_steps} ({what}); nothing of the "
                f"round was published (the rollout still holds weights v{self.weights_version}). Last checkpoint: "
                + (f"{self._checkpoint_dir(step)}; rerun the same command (trainer.resume_mode=auto) to restart round "
                   f"{step + 1} from it." if step is not None else
                   "none (set trainer.save_freq to checkpoint at round boundaries); rerun to start over.")
            ) from None

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

    def _load_checkpoint(self):  # noqa: ANN202
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
            tqdm.write(f"[rolloutpipe] resumed after round {self.global_steps} ({self.groups_trained_total} groups "
                       f"trained so far): the next round is {self.global_steps + 1}")
        return out

    def fit_round(self, batch: DataProto, more_prompts: Callable[[], DataProto | None] | None = None) -> dict:
        """One round: stream R groups through the pipeline, publish weights v+1, return the round's metrics.
        With dynamic sampling (``algorithm.filter_groups``), a group whose K rewards are all equal is dropped and
        replaced by the next prompt (``more_prompts`` gives the next dataloader batch when the round's runs out)."""
        p = self.pipe
        version = self.weights_version
        prompts = _RoundPrompts(self, batch, more_prompts)

        ledger = GroupLedger(version, p.num_groups, p.group_size, clock=self.clock,
                             max_buffered_groups=p.max_buffered_groups, max_extra_groups=p.max_extra_groups)
        fifo = CompleteGroupFIFO(ledger, dispatch_mode_of(p.mode), p.step_groups)
        admission = make_admission(p.mode, p.frontier_width, p.fgd_strength)  # type: ignore[arg-type]
        timeline = RoundTimeline(ledger, settings={"R": p.num_groups, "K": p.group_size, "U": p.step_groups,
                                                   "F_w": p.frontier_width, "mode": p.mode,
                                                   "fgd_strength": p.fgd_strength, "train_unit": p.train_unit})
        lock = threading.Condition()
        trainable: dict[int, DataProto] = {}
        failure: list[BaseException] = []
        self.actor_rollout_wg.begin_round(snapshot=p.old_log_prob == "snapshot" and p.step_groups < p.num_groups)

        stream = GroupRolloutStream(self.async_rollout_manager.agent_loop_workers, p.group_size)
        meta = {"global_steps": self.global_steps}

        base_seed = self.config.rolloutpipe.get("sampling_seed")

        def admit() -> None:  # called with the lock held
            for a in admission.admit(ledger):
                seed = None if base_seed is None else request_seed(int(base_seed), self.global_steps, a.group_id,
                                                                   p.group_size)
                stream.submit(a.group_id, prompts.gen_row(a.group_id), a.priority, meta, seed)

        def rollout_side() -> None:
            try:
                with lock:
                    admit()
                while True:
                    with lock:
                        if ledger.rollout_closed:
                            return
                        admit()  # groups the buffer bound held back, once the trainer has consumed some
                    for gid, out in stream.poll(timeout_s=0.05):
                        with lock:
                            ledger.complete_serving(gid)
                        rows = self._materialize_group(prompts.row(gid), out)
                        with lock:
                            if p.filter_metric is not None and self._no_reward_variance(rows):
                                if not prompts.available(len(ledger.groups)):
                                    ledger.stop_replacements()
                                ledger.filter(gid)  # its replacement (if any) is submitted: admission sends it
                            else:
                                trainable[gid] = rows
                                ledger.materialize(gid)
                            admit()
                            lock.notify_all()
                    if stream.lost:
                        self._resend_lost_groups(stream, ledger, lock)
            except BaseException as e:  # noqa: BLE001 - re-raised in the trainer thread
                with lock:
                    failure.append(e)
                    lock.notify_all()

        roller = threading.Thread(target=rollout_side, name=f"rolloutpipe-rollout-v{version}", daemon=True)
        bar = tqdm(total=p.num_groups, desc=f"round {self.global_steps} [{p.mode}] consumed", unit="group",
                   leave=False)
        roller.start()
        step_outputs, trained = [], []
        while True:
            with lock:
                while True:
                    if failure:
                        raise RuntimeError(f"rolloutpipe: rollout side failed in round v{version}") from failure[0]
                    d = fifo.take(whole_step=p.train_unit == "step")
                    if d is not None or fifo.exhausted:
                        break
                    ledger.check_progress(self.config.rolloutpipe.stall_timeout_s)
                    lock.wait(timeout=0.5)
                if d is None:
                    break
                rows = DataProto.concat([trainable.pop(g) for g in d.training_order]) if d.group_ids else None
                bar.set_postfix(materialized=len(ledger.materialization_order), in_engine=stream.inflight)
            if rows is None and not (p.train_unit == "groups" and d.ends_step):
                continue
            t0 = self.clock.now()
            whole = p.train_unit == "step" and len(d.group_ids) == p.step_groups  # else: a short last step
            out = self._train_step(rows, d.step_index) if whole else self._train_groups(rows, d)
            if out is not None:
                step_outputs.append(out)
            t1 = self.clock.now()
            with lock:
                timeline.trainer_busy(t0, t1, d.step_index, d.group_ids)
                ledger.consume(d.group_ids, trainer_version=self.weights_version)
            if rows is not None:
                trained.append(rows)
            bar.update(len(d.group_ids))
        roller.join()
        bar.close()
        fifo.check_drained()
        self.actor_rollout_wg.end_round()

        ledger.mark_published()  # raises unless every group of round v is consumed
        if self.failover is not None:
            self._drop_dead_replicas(None)  # one that died after its last request must not fail the publish
        t0 = self.clock.now()
        self.checkpoint_manager.update_weights(self.global_steps)
        timeline.published(t0, self.clock.now())
        self.weights_version += 1
        self.groups_trained_total += sum(len(rows) for rows in trained) // p.group_size
        self.last_round = (trained, step_outputs)
        self.last_round_calls = timeline.calls_per_step()
        return self._round_metrics(timeline, trained, step_outputs)

    # ---- rollout replicas that die mid-round (disaggregated layout) ---------------------------------------------
    def _drop_dead_replicas(self, cause: BaseException | None) -> None:
        dropped = self.failover.drop_dead()
        if dropped:
            tqdm.write(f"[rolloutpipe] rollout replica(s) {dropped} died in round {self.global_steps}: removed from "
                       f"request routing and weight publication; {self.failover.alive} of {self.failover.started} "
                       "left")
        if not self.failover.alive:
            raise NoRolloutReplicaLeftError(f"all {self.failover.started} rollout replicas died") from cause

    def _resend_lost_groups(self, stream: GroupRolloutStream, ledger: GroupLedger, lock: threading.Condition) -> None:
        """Groups whose call died with an actor: if a rollout replica is dead, it leaves routing and the groups go
        again (same requests, same seeds) to the survivors; nothing of them was materialized, so each is still
        trained exactly once. Any other dead actor (agent-loop or reward worker) stops the round."""
        first = next(iter(stream.lost.values()))
        if self.failover is None:
            raise first
        self._drop_dead_replicas(first)
        if not self.failover.dropped:
            raise first  # no replica died: not a failure re-sending can fix
        lost = sorted(stream.lost)
        with lock:
            for gid in lost:
                ledger.resend(gid)
        for gid in lost:
            stream.resend(gid)
        tqdm.write(f"[rolloutpipe] round {self.global_steps}: groups {lost} lost with a dead rollout replica, re-sent "
                   f"to the {self.failover.alive} surviving replica(s)")

    def _validate_and_report(self) -> dict:
        """verl's validation (val set, ``val_kwargs`` sampling) between rounds, when no round is in flight."""
        val = self._validate()
        score = {k: v for k, v in val.items() if k.endswith("/reward/mean@1") or "acc/mean" in k}
        if score:
            self.val_scores.append((self.global_steps, round(float(next(iter(score.values()))), 3)))
        tqdm.write(f"[rolloutpipe] validation after round {self.global_steps}: "
                   + " ".join(f"{k}={v:.3f}" for k, v in score.items()))
        return val

    # ---- rollout side: one complete group -> trainable rows ---------------------------------------------------
    def _no_reward_variance(self, rows: DataProto) -> bool:
        """Dynamic sampling (verl's ``algorithm.filter_groups``): all K values of the metric are equal, so GRPO
        gives every response advantage 0 and the group would only dilute the token-mean."""
        metric = self.pipe.filter_metric
        if metric == "reward":
            values = rows.batch["token_level_scores"].sum(-1).tolist()
        elif metric in rows.non_tensor_batch:
            values = [float(v) for v in rows.non_tensor_batch[metric]]
        else:
            raise PipelineInvariantError(
                f"algorithm.filter_groups.metric={metric!r} is not among the reward function's outputs "
                f"{sorted(rows.non_tensor_batch)}: use reward or one of those")
        return max(values) - min(values) == 0

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
        """Rewards, response mask, GRPO advantages (verl's code on this group alone), π_old if from the rollout."""
        rows = self.group_rows(prompt_row, out)
        reward_tensor, extra = extract_reward(rows)
        if reward_tensor is None or not bool(reward_tensor.isfinite().all()):
            raise PipelineInvariantError(f"reward for prompt uid {rows.non_tensor_batch['uid'][0]} is not finite")
        rows.batch["token_level_scores"] = reward_tensor
        rows.batch["token_level_rewards"] = reward_tensor
        if extra:
            rows.non_tensor_batch.update({k: np.array(v) for k, v in extra.items()})
        rows = compute_advantage(
            rows, adv_estimator=self.config.algorithm.adv_estimator, gamma=self.config.algorithm.gamma,
            lam=self.config.algorithm.lam, num_repeat=self.pipe.group_size,
            norm_adv_by_std_in_grpo=self.config.algorithm.get("norm_adv_by_std_in_grpo", True),
            config=self.config.algorithm,
        )
        if self.pipe.old_log_prob == "rollout":
            rows.batch["old_log_probs"] = rows.batch["rollout_log_probs"]
        return rows

    # ---- trainer side: one optimizer step on U complete groups ------------------------------------------------
    @contextmanager
    def _routed(self, method: str, to: str) -> Iterator[None]:
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
        rows.meta_info["global_token_num"] = rows.batch["attention_mask"].sum(dim=-1).tolist()
        if self.pipe.old_log_prob == "snapshot":
            rows = rows.union(self._old_log_probs(rows, step_index))
        return rows

    def _train_step(self, rows: DataProto, step_index: int) -> DataProto:
        """``train_unit: step``: one verl update call on the whole step (its U groups)."""
        return self._update_actor(self._with_old_log_probs(rows, step_index))

    def _train_groups(self, rows: DataProto | None, d) -> DataProto | None:  # noqa: ANN001 - a pipeline Dispatch
        """``train_unit: groups``: forward + backward on the groups there are now (verl's update path, routed to the
        worker's ``accumulate``); the optimizer steps when the dispatch closes the step. Returns the step's metrics
        then, else None."""
        if rows is not None:
            rows = self._with_old_log_probs(rows, d.step_index)
            with self._routed("update_actor", "accumulate"):
                self._step_metrics.append(self._update_actor(rows))
        if not d.ends_step:
            return None
        calls, self._step_metrics = self._step_metrics, []
        metrics = reduce_metrics(_merge([c.meta_info["metrics"] for c in calls]))
        metrics.update(self.actor_rollout_wg.optimizer_step()[0])
        return DataProto.from_single_dict(data={}, meta_info={"metrics": metrics})

    # ---- metrics ------------------------------------------------------------------------------------------------
    def _round_metrics(self, timeline: RoundTimeline, trained: list[DataProto], outs: list[DataProto]) -> dict:
        p = self.pipe
        stem = f"round{self.global_steps:04d}_{p.mode}"
        every = self.config.rolloutpipe.timeline_png_every
        png = self.global_steps == 1 or self.global_steps >= self.total_training_steps or (
            every > 0 and self.global_steps % every == 0)
        timeline.write(self.timeline_dir, stem, png=png)
        metrics = dict(timeline.metrics())
        metrics.update(reduce_metrics(_merge([o.meta_info["metrics"] for o in outs])))
        for b in trained:
            b.meta_info.pop("global_token_num", None)  # per-step values; the round's batch needs none
        batch = DataProto.concat(trained)
        metrics.update(compute_data_metrics(batch=batch, use_critic=False))
        # responses with no token at all (the engine returned nothing): counted, trained as verl would (reward of "")
        metrics[PREFIX + "empty_responses"] = float((batch.batch["response_mask"].sum(-1) == 0).sum())
        # trained groups whose K responses all got advantage 0 (what algorithm.filter_groups drops)
        metrics[PREFIX + "groups_zero_advantage"] = float(sum(
            bool(g.abs().sum() == 0) for g in batch.batch["advantages"].split(p.group_size)))
        metrics[PREFIX + "groups_short"] = float(timeline.ledger.short_by)
        # mean response length of the groups of each optimizer step (rows are in training order): completion order
        # trains short answers first, a known bias of streaming RL that the learning curves measure (curves.py)
        lengths = batch.batch["response_mask"].sum(-1).float()
        for s, chunk in enumerate(lengths.split(p.step_groups * p.group_size)):
            metrics[f"{PREFIX}response_length/step{s}"] = float(chunk.mean())
        if "reward_error" in batch.non_tensor_batch:
            metrics[PREFIX + "reward_errors"] = float(np.sum(batch.non_tensor_batch["reward_error"].astype(float)))
        if p.old_log_prob == "snapshot" and "rollout_log_probs" in batch.batch.keys():
            # vLLM's log-probs vs the trainer's under the same weights v: small only if the publish reached vLLM
            mask = batch.batch["response_mask"].float()
            gap = (batch.batch["rollout_log_probs"] - batch.batch["old_log_probs"]).abs() * mask
            metrics[PREFIX + "rollout_vs_trainer_logprob_diff"] = float(gap.sum() / mask.sum())
        if self.failover is not None:
            metrics[PREFIX + "rollout_replicas_alive"] = float(self.failover.alive)
        metrics["training/global_step"] = self.global_steps
        self.round_rewards.append(float(metrics["critic/score/mean"]))
        m = {k.removeprefix(PREFIX): v for k, v in metrics.items() if k.startswith(PREFIX)}
        tqdm.write(
            f"[rolloutpipe] round {self.global_steps} mode={p.mode} R={p.num_groups} K={p.group_size} "
            f"U={p.step_groups} reward={metrics['critic/score/mean']:.3f} "
            f"rollout_to_train_end={m['rollout_to_train_end_s']:.2f}s wait_ratio={m['trainer_wait_ratio']:.1%} "
            f"first_dispatch={m['first_dispatch_s']:.2f}s overlap_eff={m['overlap_efficiency']:.2f} "
            f"publish={m.get('publish_s', 0):.2f}s "
            f"lp_diff={metrics.get(PREFIX + 'rollout_vs_trainer_logprob_diff', float('nan')):.4f} "
            + (f"reward_errors={metrics[PREFIX + 'reward_errors']:.0f} " if metrics.get(PREFIX + "reward_errors")
               else "")
            + (f"filtered={m['groups_filtered']:.0f} short_by={m['groups_short']:.0f} "
               if p.filter_metric is not None else "")
            + f"timeline={self.timeline_dir / stem}.{'png' if png else 'json'}"
        )
        return metrics


class DisaggregatedRolloutPipeTrainer(RolloutPipeTrainer, OneStepOffRayTrainer):
    """The same round on separate pools: the actor on the trainer pool (``DetachActorWorker``), rollout on
    standalone vLLM replicas with their own pool, weights published through verl's ``CheckpointEngineManager``.
    Worker layout and start-up come from verl's ``OneStepOffRayTrainer`` (via ``SeparateRayPPOTrainer``); the
    training loop is RolloutPipe's (its synchronous ``fit`` replaces one-step-off's asynchronous one)."""


def request_seed(base: int, round_index: int, group_id: int, group_size: int) -> int:
    """First vLLM seed of a group's K requests: a function of (base, round, group) only, so the same round
    regenerates the same samples in a resumed run, whatever the admission order."""
    return (base * 1_000_003 + round_index * 65_537 + group_id * group_size) % (2**31 - group_size)


def _merge(dicts: list[dict]) -> dict[str, list]:
    out: dict[str, list] = {}
    for d in dicts:
        for k, v in d.items():
            out.setdefault(k, []).extend(v if isinstance(v, list) else [v])
    return out

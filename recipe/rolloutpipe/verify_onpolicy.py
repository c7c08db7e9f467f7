"""``python -m recipe.rolloutpipe.verify_onpolicy --json OUT``: prove on the real stack that a pipelined round
trains exactly what a serial round trains (architecture.md §2), and that the proof would catch an off-policy round.

One round of the embedded default runs pipelined (``cgp_fgd``, U < R, ``old_log_prob: snapshot``, seeded sampling),
recording the gradients of every optimizer step. Then the serial reference runs as verl's serial trainer would,
from the round's starting train state (weights, AdamW state, scheduler) and the same weights in vLLM: it
**regenerates** the round -- all R groups submitted at once, each request with its seed -- computes rewards
batch-wise from the responses (verl's ``NaiveRewardManager`` with the run's reward function) and GRPO advantages
with verl's ``compute_advantage`` over the whole batch, then π_old for the whole round with the starting weights and
one ``update_actor`` call over the round (R/U optimizer steps, the groups in the pipelined run's training order).
Nothing of the pipelined run is reused but the order. The LR schedule decays (cosine), so the LR of every step
must match too. Written:

- ``responses_differing``: rows whose response tokens differ between the two runs (0: same policy, same seeds);
  ``max_abs_sampling_logprob_diff``: vLLM's log-probs of the sampled tokens, on the rows with the same response;
  ``max_abs_reward_diff``, ``max_abs_advantage_diff``: per-group (pipelined) vs batch-wise (serial);
- ``max_abs_weight_diff``: final actor weights, pipelined vs serial;
- ``max_abs_grad_diff`` and both runs' per-step grad norms: AdamW normalises away a wrong gradient scale, so
  equal weights alone prove little;
- ``max_abs_old_logprob_diff``: π_old of every trained token, snapshot (pipelined) vs serial;
- ``rollout_vs_snapshot_logprob_gap``: what ``old_log_prob: rollout`` (vLLM's log-probs) would have used instead;
- ``negative_control``: the same round pipelined with a bug injected -- the weights after the first optimizer step
  published to vLLM mid-round, so later groups are sampled from π_{v+1} (stale π_old, off-policy) -- checked against
  the same serial reference: ``detected`` (some response differs, or vLLM's log-prob of a sampled token differs by
  more than float32 rounding of another batch shape) must be true, with its ``responses_differing``,
  ``max_abs_sampling_logprob_diff`` and ``max_abs_weight_diff``;
- ``max_abs_weight_diff_one_group_per_call`` and ``max_abs_grad_diff_one_group_per_call``, whatever the train unit:
  the round replayed from the same start state through the ``groups`` unit's worker API with *one group per call*
  (U ``accumulate`` calls per optimizer step, π_old from the live weights / the snapshot), against the serial
  weights -- the case a ``groups`` run reaches when its groups arrive one by one, so one launch checks both paths;
- with KL to a reference policy: ``max_abs_ref_logprob_diff`` (per step vs whole batch), ``kl_loss_per_step``; with
  ``algorithm.use_kl_in_reward`` the serial side applies verl's penalty to the whole batch before its advantages
  (so ``max_abs_advantage_diff`` compares the penalised ones), and a round of training comes first -- the penalty is
  KL(π_old ‖ ref), zero while π_old is the reference -- with ``reward_kl_penalty`` and ``max_abs_reward_kl_shift``
  showing it is not.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path

import numpy as np
import ray
from verl import DataProto
from verl.trainer.ppo.core_algos import FixedKLController
from verl.trainer.ppo.ray_trainer import apply_kl_penalty

from .logs import get_logger
from .pipeline import PREFIX
from .provenance import git_commit, machine
from .rollout_stream import GroupRequest, GroupRolloutStream
from .round_metrics import tool_turn_tokens
from .streamed_round import group_rows, request_seed
from .train_calls import TrainCalls, dp_step_order, grpo_advantages

R, U = 16, 4
logger = get_logger("recipe.rolloutpipe.verify_onpolicy")


def serial_order_for_dp(rows: DataProto, rows_per_step: int, dp: int) -> DataProto:
    """The rows in the order verl's one update call over several steps needs (``dp_step_order``; a copy)."""
    return rows.select_idxs(dp_step_order(len(rows), rows_per_step, dp))


def _max_abs_diff(a: dict, b: dict) -> float:
    """Largest elementwise difference between two name -> tensor dicts (weights or one step's gradients)."""
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def _scalar(x):  # verl reports a step's metric as a one-element list
    return x[0] if isinstance(x, list) and len(x) == 1 else x


def _masked_max_abs(a, b, mask) -> float:
    return float(((a - b).abs() * mask).max())


def _max_abs_rows(a, b, rows) -> float | None:  # tensors; rows: a bool mask over their rows
    return float((a[rows] - b[rows]).abs().max()) if bool(rows.any()) else None


def _regenerate_serially(trainer, batch: DataProto, uids: list[str]) -> dict[int, DataProto]:
    """The round generated again as verl's serial trainer does it -- every group at once, FCFS -- from the weights
    vLLM holds now, each request with the seed the pipelined run gave it. Returns each group's K rows (with the
    pipelined run's prompt uids, so rows line up)."""
    batch.non_tensor_batch["uid"] = np.array(uids, dtype=object)
    base = trainer.config.rolloutpipe.get("sampling_seed")
    if base is None:
        raise SystemExit("rolloutpipe verify_onpolicy: set rolloutpipe.sampling_seed (an int): the serial reference "
                         "regenerates the round and must draw the same samples")
    k = trainer.settings.group_size
    gen = trainer._get_gen_batch(batch)
    gen.meta_info["temperature"] = batch.meta_info["temperature"] = trainer.config.actor_rollout_ref.rollout.temperature
    stream = GroupRolloutStream(trainer.async_rollout_manager.agent_loop_workers, k)
    stream.submit([GroupRequest(gid, gen[gid : gid + 1], 0, {"global_steps": trainer.global_steps},
                                request_seed(int(base), trainer.global_steps, gid, k)) for gid in range(len(batch))])
    outs: dict[int, DataProto] = {}
    while len(outs) < len(batch):
        outs.update(stream.poll(timeout_s=0.1))
        if stream.lost:
            raise next(iter(stream.lost.values()))
    return {gid: group_rows(batch[gid : gid + 1], out, k) for gid, out in outs.items()}


def _score_batchwise(trainer, rows: DataProto) -> DataProto:
    """Rewards and GRPO advantages of the whole round at once, as verl's serial trainer computes them: verl's
    ``NaiveRewardManager`` decodes every response and calls the run's reward function; ``compute_advantage``
    normalises within each uid over the batch."""
    from verl.trainer.ppo.reward import get_custom_reward_fn
    from verl.workers.reward_manager.naive import NaiveRewardManager

    rows.batch.pop("rm_scores")  # the agent loop's per-group scores: recomputed here, not reused
    scorer = NaiveRewardManager(trainer.tokenizer, num_examine=0, compute_score=get_custom_reward_fn(trainer.config))
    scores = scorer(rows)
    rows.batch["token_level_scores"] = scores
    rows.batch["token_level_rewards"] = scores
    return grpo_advantages(trainer.config.algorithm, rows, trainer.settings.group_size)


@contextmanager
def _publishing_after_first_step(trainer) -> Iterator[None]:
    """The bug the negative control injects: the trainer's weights reach vLLM right after the round's first
    optimizer step, while later groups of the round are still to be sampled.

    So that the bug always has groups to act on -- on a machine where generation outruns training every request
    may have been sampled before step 1 ends, and the bug then changes nothing (seen in CI on two Ray nodes) --
    only the first U admitted groups go to vLLM before that publish; the rest are sent right after it."""
    published, held, sent = threading.Event(), [], [0]
    start_round = trainer._fit_start_round

    def publish_once(step_index: int) -> None:
        if step_index == 0 and not published.is_set():
            trainer.checkpoint_manager.update_weights(trainer.global_steps)
            published.set()

    def with_the_bug(*args, **kwargs):  # the round as the trainer starts it, its three calls wrapped
        run = start_round(*args, **kwargs)
        train_step, train_groups, send = run.calls.train_step, run.calls.train_groups, run.send

        def step_then_publish(rows, step_index):
            out = train_step(rows, step_index)
            publish_once(step_index)
            return out

        def groups_then_publish(rows, d):
            out = train_groups(rows, d)
            if d.ends_step:
                publish_once(d.step_index)
            return out

        def send_after_publish(admissions):  # called by the rollout thread on every poll, admissions or not
            if not published.is_set():
                free = max(0, run.settings.step_groups - sent[0])
                now, admissions = admissions[:free], admissions[free:]
                sent[0] += len(now)
                held.extend(admissions)
                return send(now)
            admissions, held[:] = [*held, *admissions], []
            return send(admissions)

        run.calls.train_step, run.calls.train_groups, run.send = step_then_publish, groups_then_publish, \
            send_after_publish
        return run

    trainer._fit_start_round = with_the_bug
    try:
        yield
    finally:
        del trainer._fit_start_round  # the class's hook again


def verify_in_trainer(trainer) -> dict:  # a RolloutPipeTrainer, workers started
    wg = trainer.actor_rollout_wg
    trainer.global_steps = 1
    trainer.checkpoint_manager.update_weights(0)

    def first_batch() -> DataProto:  # the round's prompts, fresh (a round takes columns out of its batch)
        return DataProto.from_single_dict(next(iter(trainer.train_dataloader)))

    if trainer.config.algorithm.use_kl_in_reward:
        # the penalty is KL(π_old ‖ ref), and the first round's π_old *is* the reference: zero. One round of
        # training first, so the checked round starts away from the reference and its penalty counts
        trainer.fit_round(first_batch())
        trainer.global_steps = 2
    wg.save_train_state("round_start")
    start_weights = wg.get_weights()[0]

    result, regenerated = _check_round(trainer, first_batch, start_weights)
    control, _ = _check_round(trainer, first_batch, start_weights, stale_publish=True, regenerated=regenerated)
    result["negative_control"] = {
        "injected": "weights after optimizer step 1 published to vLLM mid-round (later groups sampled from π_v+1)",
        "responses_differing": control["responses_differing"],
        "max_abs_weight_diff": control["max_abs_weight_diff"],
        "max_abs_sampling_logprob_diff": control["max_abs_sampling_logprob_diff"],
        "max_abs_grad_diff": control["max_abs_grad_diff"],
        "detected": control["responses_differing"] > 0
        or control["max_abs_sampling_logprob_diff"] > SAMPLING_LOGPROB_TOLERANCE,
    }
    out = trainer.config.rolloutpipe.verify_out
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(result, indent=1))
    n = R * trainer.settings.group_size
    nc = result["negative_control"]
    g = lambda x: "n/a" if x is None else f"{x:.3g}"  # None: not comparable where responses differ
    logger.info(f"[rolloutpipe] verify_onpolicy: pipelined vs serial round: {result['responses_differing']} of {n} "
                f"responses differ, sampling log-probs by {g(result['max_abs_sampling_logprob_diff'])}, "
                f"max |dw| {g(result['max_abs_weight_diff'])}, max |dgrad| {g(result['max_abs_grad_diff'])}, "
                f"max |d old log-prob| {g(result['max_abs_old_logprob_diff'])}")
    logger.info(f"[rolloutpipe] verify_onpolicy negative control ({nc['injected']}): "
                + ("DETECTED" if nc["detected"] else "NOT DETECTED -- the check is blind")
                + f": {nc['responses_differing']} of {n} responses differ, vLLM's sampling log-probs by up to "
                f"{g(nc['max_abs_sampling_logprob_diff'])} (same responses), max |dw| {g(nc['max_abs_weight_diff'])}")
    return result


# vLLM's log-prob of a sampled token, same weights, same seed, other batch composition: measured <= 7.6e-6 (float32
# rounding of other batch shapes); one optimizer step of difference in the weights: 5.7e-2
SAMPLING_LOGPROB_TOLERANCE = 1e-4


# the streaming worker's training-side calls a round can make (rolloutpipe_workers/streaming_actor.py)
TRAINER_POOL_CALLS = ("update_actor_in_round", "accumulate", "optimizer_step", "compute_log_prob_live",
                      "compute_log_prob_snapshot")


@contextmanager
def _counting_calls(wg) -> Iterator[Counter]:
    """Count the worker group's ``TRAINER_POOL_CALLS`` made inside the block."""
    calls: Counter = Counter()
    saved = {name: getattr(wg, name) for name in TRAINER_POOL_CALLS}

    def counted(name: str, call: Callable) -> Callable:
        def counting(*args, **kwargs):
            calls[name] += 1
            return call(*args, **kwargs)
        return counting

    for name, call in saved.items():
        setattr(wg, name, counted(name, call))
    try:
        yield calls
    finally:
        for name in saved:  # the worker group's own lookup again (metering, routing: actor_group.py)
            delattr(wg, name)


def _check_round(trainer, first_batch: Callable[[], DataProto], start_weights: dict, stale_publish: bool = False,
                 regenerated: dict[int, DataProto] | None = None) -> tuple[dict, dict[int, DataProto]]:
    """One pipelined round from the round's start state (with the off-policy bug injected if ``stale_publish``),
    then the serial reference from the same state; what differs, and the serial run's generated groups.
    ``regenerated``: those groups from an earlier call (the same start state, weights and seeds generate the same
    round: the negative control reuses the clean check's instead of generating it a third time)."""
    wg, k = trainer.actor_rollout_wg, trainer.settings.group_size
    wg.load_train_state("round_start")
    trainer.checkpoint_manager.update_weights(0)
    wg.record_step_grads(True)
    batch = first_batch()
    with _publishing_after_first_step(trainer) if stale_publish else nullcontext(), _counting_calls(wg) as pool_calls:
        result = trainer.fit_round(batch)
    trained, step_outputs, calls = result.trained, result.step_outputs, result.calls_per_step
    reward_kl = result.metrics.get("actor/reward_kl_penalty")  # algorithm.use_kl_in_reward: the round's mean KL
    reward_kl_beta = result.metrics.get("actor/reward_kl_penalty_coeff")
    snapshot_bytes = result.metrics.get(PREFIX + "snapshot_bytes")  # π_old's snapshot: with LoRA, the adapter only
    pipe_grads = wg.pop_step_grads()[0]
    pipe_weights = wg.get_weights()[0]
    rows = DataProto.concat(trained)  # the round in training order

    # the serial reference: same start state, same weights in vLLM, same seeds; the round regenerated
    wg.load_train_state("round_start")
    trainer.checkpoint_manager.update_weights(0)
    uids = list(batch.non_tensor_batch["uid"])
    order = [uids.index(u) for u in rows.non_tensor_batch["uid"][::k]]  # group ids in training order
    if regenerated is None:
        regenerated = _regenerate_serially(trainer, first_batch(), uids)
    serial = _score_batchwise(trainer, DataProto.concat([regenerated[g] for g in order]))
    same = (serial.batch["responses"] == rows.batch["responses"]).all(-1)
    differing = int((~same).sum())
    # per-group (pipelined) vs batch-wise (serial) rewards and advantages, on the rows with the same response
    reward_diff = _max_abs_rows(serial.batch["token_level_scores"], rows.batch["token_level_scores"], same)
    advantage_diff = _max_abs_rows(serial.batch["advantages"], rows.batch["advantages"], same)
    # vLLM's log-probs of the sampled tokens: the policy the engine sampled from, token by token
    sampled_lp_diff = _max_abs_rows(serial.batch["rollout_log_probs"] * serial.batch["response_mask"],
                                    rows.batch["rollout_log_probs"] * rows.batch["response_mask"], same)
    rows_per_step = U * k
    pipe_ordered = serial_order_for_dp(rows, rows_per_step, wg.world_size)
    pipe_old = pipe_ordered.batch["old_log_probs"]
    serial = serial_order_for_dp(serial, rows_per_step, wg.world_size)
    mask = serial.batch["response_mask"].float()
    serial.meta_info["global_token_num"] = serial.batch["attention_mask"].sum(dim=-1).tolist()
    old, _ = trainer._compute_old_log_prob(serial)
    old.batch.pop("entropys")
    serial = serial.union(old)
    use_ref = trainer.use_reference_policy  # actor.use_kl_loss: the serial run's reference log-probs, whole batch
    if use_ref:
        serial = serial.union(trainer._compute_ref_log_prob(serial))
    if reward_kl is not None:  # verl's order: π_old, reference, the penalty on the whole batch, then advantages
        serial, _ = apply_kl_penalty(serial, FixedKLController(reward_kl_beta), trainer.config.algorithm.kl_penalty)
        serial = grpo_advantages(trainer.config.algorithm, serial, k)
        advantage_diff = _masked_max_abs(pipe_ordered.batch["advantages"], serial.batch["advantages"], mask) \
            if differing == 0 else None
    trainer._update_actor(serial)
    serial_grads = wg.pop_step_grads()[0]
    serial_weights = wg.get_weights()[0]
    # (the negative control reports what its round trained against the serial one: no replay of it)
    replay = None if stale_publish else _replay_one_group_per_call(trainer, rows)
    wg.record_step_grads(False)

    assert len(pipe_grads) == len(serial_grads) == R // U, (len(pipe_grads), len(serial_grads))
    norm = lambda g: math.sqrt(sum(float(t.double().pow(2).sum()) for t in g.values()))
    pipe_rollout_lp = rows.batch["rollout_log_probs"]
    pipe_mask = rows.batch["response_mask"].float()
    result = {
        "responses_differing": differing,
        "max_abs_reward_diff": reward_diff,
        "max_abs_advantage_diff": advantage_diff,
        "max_abs_sampling_logprob_diff": sampled_lp_diff,
        "max_abs_weight_diff": _max_abs_diff(pipe_weights, serial_weights),
        "max_abs_grad_diff": max(_max_abs_diff(p, s) for p, s in zip(pipe_grads, serial_grads, strict=True)),
        "grad_norms_pipelined": [norm(g) for g in pipe_grads],
        "grad_norms_serial": [norm(g) for g in serial_grads],
        # on differing responses π_old is of other tokens: meaningful only when none differs
        "max_abs_old_logprob_diff": _masked_max_abs(pipe_old, serial.batch["old_log_probs"], mask)
        if differing == 0 else None,
        "rollout_vs_snapshot_logprob_gap": _masked_max_abs(pipe_rollout_lp, rows.batch["old_log_probs"], pipe_mask),
        "rollout_vs_snapshot_logprob_mean_gap": float(((pipe_rollout_lp - rows.batch["old_log_probs"]).abs()
                                                       * pipe_mask).sum() / pipe_mask.sum()),
        "weights_moved": _max_abs_diff(pipe_weights, start_weights),
        # multi-turn (task=agentic): responses with a tool turn inside (masked out of the loss, as in verl), and
        # those tokens: the comparison above covered multi-turn trajectories only if these are > 0
        "responses_with_tool_turns": int((tool_turn_tokens(rows.batch["response_mask"]) > 0).sum()),
        "tool_response_tokens": int(tool_turn_tokens(rows.batch["response_mask"]).sum()),
        # KL to the reference policy: per-step reference log-probs (pipelined) vs the serial batch's, and how far
        # the reference is from π_old (> 0: the KL term is not trivially zero), verl's kl_loss per step
        "kl_loss": use_ref,
        "max_abs_ref_logprob_diff": _masked_max_abs(pipe_ordered.batch["ref_log_prob"], serial.batch["ref_log_prob"],
                                                    mask) if use_ref and differing == 0 else None,
        "ref_vs_old_logprob_gap": _masked_max_abs(rows.batch["ref_log_prob"], rows.batch["old_log_probs"], pipe_mask)
        if use_ref else None,
        "kl_in_reward": reward_kl is not None,
        "reward_kl_penalty": reward_kl,
        "reward_kl_penalty_coeff": reward_kl_beta,
        # how far the penalty moved the rewards (0 would make the KL-in-reward comparison vacuous)
        "max_abs_reward_kl_shift": float((rows.batch["token_level_rewards"] - rows.batch["token_level_scores"])
                                         .abs().max()) if reward_kl is not None else None,
        "kl_loss_per_step": [next((_scalar(v) for key, v in o.meta_info["metrics"].items()
                                   if key.endswith("kl_loss")), None) for o in step_outputs],
        "verl_grad_norm_per_step": [_scalar(o.meta_info["metrics"].get("actor/grad_norm")) for o in step_outputs],
        "groups_with_reward_variance_per_step": [
            sum(bool(g.abs().sum() > 0) for g in step.split(k))
            for step in rows.batch["advantages"].split(rows_per_step)],
        "snapshot_bytes": snapshot_bytes,
        "R": R, "U": U, "K": k, "optimizer_steps": len(pipe_grads),
        "train_unit": trainer.settings.train_unit, "calls_per_step": calls,
        "trainer_pool_calls": dict(pool_calls),  # the pipelined round's training-side worker calls, by method
    }
    if replay is not None:
        weights, grads = replay
        result["max_abs_weight_diff_one_group_per_call"] = _max_abs_diff(weights, serial_weights)
        result["max_abs_grad_diff_one_group_per_call"] = max(
            _max_abs_diff(p, s) for p, s in zip(grads, serial_grads, strict=True))
    return result, regenerated


def _replay_one_group_per_call(trainer, rows: DataProto) -> tuple[dict, list[dict]]:
    """The round's groups again from the round's start state, one ``accumulate`` call per group: final weights
    and every step's gradients (before clipping)."""
    from .pipeline import Dispatch

    wg, k = trainer.actor_rollout_wg, trainer.settings.group_size
    wg.load_train_state("round_start")
    wg.begin_round(snapshot=True)
    # the rows carry the round's rewards and advantages (a KL penalty in the reward already applied): replayed as is
    calls = TrainCalls(trainer, k, timing={}, reward_kl=None)
    for g in range(len(rows) // k):
        group = rows.slice(g * k, (g + 1) * k)
        for key in ("old_log_probs", "ref_log_prob"):  # computed again by the replay, in its own call shapes
            if key in group.batch.keys():
                group.batch.pop(key)
        calls.train_groups(group, Dispatch((g,), g // U, ends_step=g % U == U - 1, version=0))
    wg.end_round()
    return wg.get_weights()[0], wg.pop_step_grads()[0]


class _Verifying:
    """A RolloutPipe trainer whose ``fit`` is the verification (mixed in front of the layout's trainer class)."""

    def fit(self) -> None:
        self.report_trainer_pool()
        verify_in_trainer(self)


@ray.remote
class VerifyTaskRunner:
    """The recipe's task runner with the verifying trainer: the same workers and start-up as a training run."""

    def run(self, config) -> None:
        from .runner import run_task
        from .trainer import DisaggregatedRolloutPipeTrainer, RolloutPipeTrainer

        run_task(config, hybrid_cls=type("VerifyingTrainer", (_Verifying, RolloutPipeTrainer), {}),
                 disaggregated_cls=type("VerifyingDisaggregatedTrainer", (_Verifying, DisaggregatedRolloutPipeTrainer),
                                        {}))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, required=True, help="where to write the result")
    ap.add_argument("overrides", nargs="*", help="extra Hydra overrides")
    args = ap.parse_args(argv)
    from hydra import compose, initialize_config_dir

    from .main import CONFIG_DIR, run

    overrides = [
        f"rolloutpipe.verify_out={args.json.resolve()}",
        "rolloutpipe.mode=cgp_fgd", "rolloutpipe.old_log_prob=snapshot", "rolloutpipe.sampling_seed=0",
        f"data.train_batch_size={R}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={U}", "data.shuffle=false",
        # a decaying LR: verl steps its scheduler once per round (its update call's last mini-batch); one stepped per
        # optimizer-step call instead would give the round's later steps another LR and show in the weights
        "actor_rollout_ref.actor.optim.lr_scheduler_type=cosine", *args.overrides,
    ]
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        cfg = compose(config_name="rolloutpipe", overrides=overrides)
    commit = git_commit()  # at launch: the run checks this tree (an edit during the run is not what ran)
    run(cfg, task_runner_class=VerifyTaskRunner)
    result = json.loads(args.json.read_text())
    result["git_commit"], result["machine"] = commit, machine()
    result["overrides"] = list(args.overrides)  # what was checked beyond the fixed round above (KL, train unit)
    args.json.write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))
    # the two binary facts; the numeric tolerances are the test's (tests/test_rolloutpipe_e2e.py)
    return 0 if result["responses_differing"] == 0 and result["negative_control"]["detected"] else 1


if __name__ == "__main__":
    sys.exit(main())

"""``python -m recipe.rolloutpipe.verify_onpolicy --json OUT``: prove on the real stack that a pipelined round
trains exactly what a serial round trains (DESIGN.md §2).

One round of the embedded default runs pipelined (``cgp_fgd``, U < R, ``old_log_prob: snapshot``), recording the
gradients of every optimizer step. Then the actor is restored to the round's starting train state (weights,
AdamW state, scheduler) and verl's serial path runs on the same groups in the same order: π_old for the whole
round with the starting weights, then one ``update_actor`` call over the round (R/U optimizer steps). Written:

- ``max_abs_weight_diff``: final actor weights, pipelined vs serial;
- ``max_abs_grad_diff`` and both runs' per-step grad norms: AdamW normalises away a wrong gradient scale, so
  equal weights alone prove little;
- ``max_abs_old_logprob_diff``: π_old of every trained token, snapshot (pipelined) vs serial;
- ``rollout_vs_snapshot_logprob_gap``: what ``old_log_prob: rollout`` (vLLM's log-probs) would have used instead;
- with ``rolloutpipe.train_unit=groups`` also ``max_abs_weight_diff_one_group_per_call``: the round replayed from the
  same start state through the streaming worker API with *one group per call* (U ``accumulate`` calls per
  optimizer step, π_old from the live weights / the snapshot), against the serial weights -- the case the pipelined
  run reaches only when its groups happen to arrive one by one.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from verl import DataProto

R, U = 16, 4


def serial_order_for_dp(rows: DataProto, rows_per_step: int, dp: int) -> DataProto:
    """verl's serial update splits the round's batch into ``dp`` contiguous chunks, one per rank, and each rank
    then walks its chunk mini-batch by mini-batch. So that mini-batch s of every rank is that rank's share of step
    s -- as in a one-step call, and as in the pipelined run -- the rows go rank by rank, step by step (a copy)."""
    share = rows_per_step // dp
    steps = len(rows) // rows_per_step
    return rows.select_idxs([s * rows_per_step + r * share + i
                             for r in range(dp) for s in range(steps) for i in range(share)])


def _max_abs_diff(a: dict, b: dict) -> float:
    """Largest elementwise difference between two name -> tensor dicts (weights or one step's gradients)."""
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def _scalar(x):  # noqa: ANN001, ANN202 - verl reports a step's metric as a one-element list
    return x[0] if isinstance(x, list) and len(x) == 1 else x


def _masked_max_abs(a, b, mask) -> float:  # noqa: ANN001
    return float(((a - b).abs() * mask).max())


def verify_in_trainer(trainer) -> dict:  # noqa: ANN001 - a RolloutPipeTrainer, workers started
    wg = trainer.actor_rollout_wg
    trainer.global_steps = 1
    trainer.checkpoint_manager.update_weights(0)
    wg.save_train_state("round_start")
    start_weights = wg.get_weights()[0]
    wg.record_step_grads(True)
    batch = DataProto.from_single_dict(next(iter(trainer.train_dataloader)))
    trainer.fit_round(batch)
    trained, step_outputs = trainer.last_round
    pipe_grads = wg.pop_step_grads()[0]
    pipe_weights = wg.get_weights()[0]

    # the serial reference: same groups, same order, same start state
    wg.load_train_state("round_start")
    rows = DataProto.concat(trained)  # the round in training order
    rows_per_step = U * trainer.pipe.group_size
    serial = serial_order_for_dp(rows, rows_per_step, wg.world_size)
    pipe_old = serial.batch.pop("old_log_probs")
    rows.batch.pop("old_log_probs")  # the replay computes its own
    serial.meta_info["global_token_num"] = serial.batch["attention_mask"].sum(dim=-1).tolist()
    old, _ = trainer._compute_old_log_prob(serial)
    old.batch.pop("entropys")
    serial = serial.union(old)
    trainer._update_actor(serial)
    serial_grads = wg.pop_step_grads()[0]
    serial_weights = wg.get_weights()[0]
    replay = _replay_one_group_per_call(trainer, rows) if trainer.pipe.train_unit == "groups" else None
    wg.record_step_grads(False)

    mask = serial.batch["response_mask"].float()
    assert len(pipe_grads) == len(serial_grads) == R // U, (len(pipe_grads), len(serial_grads))
    norm = lambda g: math.sqrt(sum(float(t.double().pow(2).sum()) for t in g.values()))  # noqa: E731
    result = {
        "max_abs_weight_diff": _max_abs_diff(pipe_weights, serial_weights),
        "max_abs_grad_diff": max(_max_abs_diff(p, s) for p, s in zip(pipe_grads, serial_grads, strict=True)),
        "grad_norms_pipelined": [norm(g) for g in pipe_grads],
        "grad_norms_serial": [norm(g) for g in serial_grads],
        "max_abs_old_logprob_diff": _masked_max_abs(pipe_old, serial.batch["old_log_probs"], mask),
        "rollout_vs_snapshot_logprob_gap": _masked_max_abs(serial.batch["rollout_log_probs"], pipe_old, mask),
        "rollout_vs_snapshot_logprob_mean_gap": float(((serial.batch["rollout_log_probs"] - pipe_old).abs() * mask)
                                                      .sum() / mask.sum()),
        "weights_moved": _max_abs_diff(pipe_weights, start_weights),
        "verl_grad_norm_per_step": [_scalar(o.meta_info["metrics"].get("actor/grad_norm")) for o in step_outputs],
        "groups_with_reward_variance_per_step": [
            sum(bool(g.abs().sum() > 0) for g in step.split(trainer.pipe.group_size))
            for step in rows.batch["advantages"].split(rows_per_step)],
        "R": R, "U": U, "K": trainer.pipe.group_size, "optimizer_steps": len(pipe_grads),
        "train_unit": trainer.pipe.train_unit, "calls_per_step": trainer.last_round_calls,
    }
    if replay is not None:
        weights, grads = replay
        result["max_abs_weight_diff_one_group_per_call"] = _max_abs_diff(weights, serial_weights)
        result["max_abs_grad_diff_one_group_per_call"] = max(
            _max_abs_diff(p, s) for p, s in zip(grads, serial_grads, strict=True))
    out = trainer.config.rolloutpipe.verify_out
    if out:
        Path(out).write_text(json.dumps(result, indent=1))
    print("[rolloutpipe] verify_onpolicy:", json.dumps(result), flush=True)
    return result


def _replay_one_group_per_call(trainer, rows: DataProto) -> tuple[dict, list[dict]]:  # noqa: ANN001
    """The round's groups again from the round's start state, one ``accumulate`` call per group: final weights
    and every step's gradients (before clipping)."""
    from .pipeline import Dispatch

    wg, k = trainer.actor_rollout_wg, trainer.pipe.group_size
    wg.load_train_state("round_start")
    wg.begin_round(snapshot=True)
    for g in range(len(rows) // k):
        trainer._train_groups(rows.slice(g * k, (g + 1) * k),
                              Dispatch((g,), g // U, ends_step=g % U == U - 1, version=0))
    wg.end_round()
    return wg.get_weights()[0], wg.pop_step_grads()[0]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, required=True, help="where to write the result")
    ap.add_argument("overrides", nargs="*", help="extra Hydra overrides")
    args = ap.parse_args(argv)
    from hydra import compose, initialize_config_dir

    from .main import CONFIG_DIR, run

    overrides = [
        "rolloutpipe.task=verify_onpolicy", f"rolloutpipe.verify_out={args.json.resolve()}",
        "rolloutpipe.mode=cgp_fgd", "rolloutpipe.old_log_prob=snapshot", f"data.train_batch_size={R}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={U}", "data.shuffle=false", *args.overrides,
    ]
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        cfg = compose(config_name="rolloutpipe", overrides=overrides)
    run(cfg)
    print(args.json.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())

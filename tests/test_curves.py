"""The learning-curve comparison's bookkeeping (the runs themselves are a long measurement: docs/results.md)."""

from __future__ import annotations

import pytest

from recipe.rolloutpipe.curves import EQUIVALENCE_MARGIN, equivalence, mode_overrides, series, summarize


def _records(rewards: list[float], vals: dict[int, float], lengths: list[float] | None = None) -> list[dict]:
    """verl's file-logger lines: validation at step 0 alone, then one line per round (with validation on some)."""
    recs = [{"step": 0, "data": {"val-core/rolloutpipe/arith/acc/mean@1": vals[0], "val-aux/x/reward/mean@1": 9.0}}]
    for r, reward in enumerate(rewards, start=1):
        data = {"critic/score/mean": reward, "training/global_step": r}
        if r in vals:
            data["val-core/rolloutpipe/arith/acc/mean@1"] = vals[r]
        for s, length in enumerate(lengths or []):
            data[f"rolloutpipe/response_length/step{s}"] = length + r  # step s of round r
        recs.append({"step": r, "data": data})
    return recs


def test_series_reads_reward_validation_and_step_lengths():
    s = series(_records([0.1, 0.2, 0.3], {0: 0.05, 2: 0.3}, lengths=[3.0, 5.0]))
    assert s["reward"] == [0.1, 0.2, 0.3]
    assert s["val"] == [(0, 0.05), (2, 0.3)]  # val-core only, by round
    assert s["step_response_length"] == [[4.0, 6.0], [5.0, 7.0], [6.0, 8.0]]


def test_summary_pairs_each_mode_with_stock_by_seed():
    runs = {
        "stock": {0: series(_records([0.1, 0.2], {0: 0.1, 2: 0.40})),
                  1: series(_records([0.3, 0.4], {0: 0.1, 2: 0.50}))},
        "cgp": {0: series(_records([0.2, 0.2], {0: 0.1, 2: 0.42}, lengths=[2.0, 4.0])),
                1: series(_records([0.2, 0.6], {0: 0.1, 2: 0.56}, lengths=[2.0, 4.0]))},
    }
    out = summarize(runs)
    assert out["stock"]["final_val"] == [0.40, 0.50] and "final_val_diff_vs_stock" not in out["stock"]
    cgp = out["cgp"]
    assert cgp["seeds"] == [0, 1] and cgp["rounds"] == 2
    assert cgp["train_reward_mean"] == [0.2, 0.4] and cgp["train_reward_max"] == [0.2, 0.6]
    assert cgp["val_rounds"] == [0, 2] and cgp["val_mean"] == pytest.approx([0.1, 0.49])
    assert cgp["final_val_diff_vs_stock"] == pytest.approx(0.04)  # mean of the paired +0.02 and +0.06
    lo, hi = cgp["final_val_diff_vs_stock_ci"]  # t-interval, 1 degree of freedom: mean +- 12.71 * sd / sqrt(2)
    assert (lo, hi) == pytest.approx((0.04 - 12.706 * 0.02, 0.04 + 12.706 * 0.02), abs=1e-3)
    assert cgp["equivalence"]["n"] == 2 and cgp["equivalence"]["equivalent"] is False  # 2 seeds prove nothing
    assert cgp["final_val_inside_stock_spread"] is True  # 0.49 within stock's 0.40 .. 0.50
    assert cgp["step_response_length"] == pytest.approx([3.5, 5.5])  # per step, over rounds and seeds


def test_equivalence_needs_a_small_difference_and_a_small_spread():
    tight = equivalence([0.005, -0.004, 0.002, 0.0, -0.003])
    assert tight["equivalent"] is True and tight["p"] < 0.05 and tight["margin"] == EQUIVALENCE_MARGIN
    assert -EQUIVALENCE_MARGIN < tight["ci90"][0] < 0 < tight["ci90"][1] < EQUIVALENCE_MARGIN
    wide = equivalence([0.05, -0.06, 0.04, -0.05, 0.02])  # centred on 0, but 5 seeds this spread cannot tell
    assert wide["equivalent"] is False and wide["ci90"][0] < -EQUIVALENCE_MARGIN
    shifted = equivalence([0.05, 0.06, 0.055, 0.045, 0.05])  # consistently better by more than the margin
    assert shifted["equivalent"] is False and shifted["ci90"][0] > EQUIVALENCE_MARGIN


def test_every_mode_gets_the_same_prompts_and_engine_seed_and_ours_a_sampling_seed():
    for mode in ("stock", "sync", "cgp", "cgp_fgd"):
        assert {"data.seed=7", "actor_rollout_ref.rollout.seed=7"} <= set(mode_overrides(mode, 7))
    assert "rolloutpipe.trainer=stock" in mode_overrides("stock", 7)
    assert {"rolloutpipe.mode=cgp", "rolloutpipe.sampling_seed=7"} <= set(mode_overrides("cgp", 7))

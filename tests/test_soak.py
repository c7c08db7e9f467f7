"""The soak's summary: per-process growth and round-time drift measured after the warm-up, held to the targets."""

from __future__ import annotations

import os

import psutil
import pytest

from recipe.rolloutpipe.bench.soak import TARGETS, process_label, sample_processes, summarize


def _rounds(n: int, leak_mb_per_round: float, slow_s_per_round: float, warmup_jump_mb: float = 0.0) -> list[dict]:
    rows = []
    for r in range(1, n + 1):
        rss = {"driver:main[1]": 500.0, "trainer:ray::WorkerDict[2]": 900.0 + leak_mb_per_round * r,
               "rollout:VLLM::EngineCore[3]": 1200.0 + (warmup_jump_mb if r > 5 else 0.0)}
        if r % 7 == 0:
            rss["ray_daemons:ray::IDLE[9]"] = 80.0  # a short-lived helper: listed, not held to a slope
        if r == n:  # the last sample is taken as the run shuts down: the workers have exited, the driver not yet
            del rss["trainer:ray::WorkerDict[2]"], rss["rollout:VLLM::EngineCore[3]"]
        rows.append({"round": r, "round_s": 7.0 + slow_s_per_round * r, "lp_diff_p90": 1e-4,
                     "object_store_bytes": 64 * 1024 * 1024, "rss_mb": rss})
    return rows


def test_a_steady_run_meets_the_targets_even_after_a_warm_up_jump():
    s = summarize(_rounds(60, 0.0, 0.0, warmup_jump_mb=400.0), skip=20)
    assert s["meets_targets"] == {"rss": True, "round_time": True}
    assert s["processes"]["rollout:VLLM::EngineCore[3]"]["rss_slope_mb_per_100_rounds"] == pytest.approx(0.0)
    assert s["processes"]["ray_daemons:ray::IDLE[9]"]["whole_run"] is False
    assert s["processes"]["ray_daemons:ray::IDLE[9]"]["rss_slope_mb_per_100_rounds"] is None
    assert s["object_store_slope_mb_per_100_rounds"] == pytest.approx(0.0)


def test_a_leak_and_a_slowdown_are_measured_and_fail_the_targets():
    s = summarize(_rounds(60, leak_mb_per_round=1.0, slow_s_per_round=0.01), skip=20)
    assert s["max_rss_slope"] == {"process": "trainer:ray::WorkerDict[2]", "mb_per_100_rounds": pytest.approx(100.0)}
    assert s["processes"]["trainer:ray::WorkerDict[2]"]["rss_mb_last"] == 959.0  # its last sample: round 59
    assert s["round_time_slope_per_100_rounds"] == pytest.approx(1.0)
    assert s["round_time_change_pct_per_100_rounds"] > TARGETS["round_time_change_pct_per_100_rounds"]
    assert s["meets_targets"] == {"rss": False, "round_time": False}


def test_this_process_tree_is_sampled_and_named():
    rss = sample_processes(os.getpid())
    me = f"driver:main[{os.getpid()}]"
    assert me in rss and rss[me] > 10
    assert process_label(psutil.Process(os.getpid()), driver_pid=-1).endswith(f"[{os.getpid()}]")

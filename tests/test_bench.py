"""The benchmark: workload generator, summary arithmetic, and one tiny real-stack run (prescribed lengths reach
vLLM through verl's agent loop; every mode runs from the same start state)."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

from recipe.rolloutpipe.bench.agent_loop import PrescribedToolCalls, parse_lengths
from recipe.rolloutpipe.bench.pinning import cpu_category, descendants, this_ray_node
from recipe.rolloutpipe.bench.report import (
    completion_order_rho,
    markdown,
    overlap_efficiency_vs_stock,
    rollout_vs_r,
    summarize,
)
from recipe.rolloutpipe.bench.runner import rotated
from recipe.rolloutpipe.mode_specs import ModeSpec, parse_mode_spec
from recipe.rolloutpipe.workloads import (
    LengthProfile,
    TurnProfile,
    describe,
    describe_turns,
    profile_from_mapping,
    round_lengths,
    round_turn_plans,
)

ROOT = Path(__file__).resolve().parents[1]
LONGTAIL = LengthProfile.from_mapping("t", {"alpha": 1.2, "beta": 2.5, "min_frac": 0.1, "gamma": 1.0,
                                            "sigma_within": 0.45, "cap_prob": 0.3})


def test_lengths_are_bounded_deterministic_and_long_tailed():
    a = round_lengths(LONGTAIL, seed=3, num_groups=200, k=8, cap=192)
    assert a == round_lengths(LONGTAIL, seed=3, num_groups=200, k=8, cap=192)
    assert a != round_lengths(LONGTAIL, seed=4, num_groups=200, k=8, cap=192)
    flat = [x for g in a for x in g]
    assert all(2 <= x <= 192 for x in flat) and all(len(g) == 8 for g in a)
    d = describe(a, 192)
    assert 0.03 < d["at_cap_share"] < 0.4  # a tail at the cap, not everything
    assert d["p50_tokens"] < d["p90_tokens"] <= 192


def test_lengths_are_correlated_within_a_group():
    groups = round_lengths(LONGTAIL, seed=0, num_groups=300, k=8, cap=192)
    mean = [sum(g) / len(g) for g in groups]
    grand = sum(mean) / len(mean)
    between = sum((m - grand) ** 2 for m in mean) / len(mean)
    within = sum(sum((x - m) ** 2 for x in g) / len(g) for g, m in zip(groups, mean, strict=True)) / len(groups)
    assert between > 0.5 * within  # the shared difficulty dominates; iid lengths give between ≈ within / K
    shuffled = [x for g in groups for x in g]
    random.Random(0).shuffle(shuffled)
    iid = [shuffled[i: i + 8] for i in range(0, len(shuffled), 8)]
    iid_mean = [sum(g) / 8 for g in iid]
    assert between > 3 * sum((m - grand) ** 2 for m in iid_mean) / len(iid_mean)


def test_profile_config_errors_name_the_keys():
    with pytest.raises(ValueError, match=r"'w'.*unknown keys \['alpha_'\].*missing \['alpha'\]"):
        LengthProfile.from_mapping("w", {"alpha_": 1, "beta": 1, "min_frac": 0.1, "gamma": 1, "sigma_within": 0.1,
                                         "cap_prob": 0.1})
    assert parse_lengths("3,17,192") == [3, 17, 192]


AGENTIC = {"kind": "multi_turn", "alpha": 1.2, "beta": 2.5, "min_frac": 0.15, "sigma_within": 0.4, "max_calls": 2,
           "call_prob": 0.6, "latency_p50_s": 0.4, "latency_sigma": 1.1, "latency_max_s": 1000.0}


def test_turn_plans_fit_the_cap_and_have_a_heavy_tailed_environment():
    profile = profile_from_mapping("a", AGENTIC)
    single = {k: v for k, v in LONGTAIL.__dict__.items() if k != "name"}
    assert isinstance(profile, TurnProfile) and isinstance(profile_from_mapping("t", single), LengthProfile)
    plans = round_turn_plans(profile, seed=1, num_groups=300, k=8, cap=192)
    assert plans == round_turn_plans(profile, seed=1, num_groups=300, k=8, cap=192)
    assert plans != round_turn_plans(profile, seed=2, num_groups=300, k=8, cap=192)
    flat = [p for g in plans for p in g]
    assert all(len(g) == 8 for g in plans)
    for p in flat:  # calls + 1 model turns, each within the turn cap, all of them and the tool turns within the cap
        assert len(p["lengths"]) == len(p["latencies"]) + 1 <= 3
        assert all(2 <= n <= profile.turn_cap(192) for n in p["lengths"])
        assert sum(p["lengths"]) + len(p["latencies"]) * profile.tool_turn_tokens + 4 * len(p["lengths"]) <= 192
    d = describe_turns(plans)
    assert 1.1 < d["mean_tool_calls"] < 1.3 and 0.8 < d["responses_with_calls"] < 0.9  # Binomial(2, 0.6)
    assert d["latency_p50_s"] == pytest.approx(0.4, rel=0.15)
    assert d["latency_p99_s"] / d["latency_p50_s"] > 10  # the heavy tail: exp(2.326 * 1.1) = 12.9x
    with pytest.raises(ValueError, match=r"'w'.*unknown keys \['calls'\].*missing \['max_calls'\]"):
        profile_from_mapping("w", {**{k: v for k, v in AGENTIC.items() if k != "max_calls"}, "calls": 1})
    with pytest.raises(ValueError, match="kind='agents', expected single_turn or multi_turn"):
        profile_from_mapping("w", {**AGENTIC, "kind": "agents"})


def test_a_planned_trajectory_calls_the_tool_as_planned():
    import asyncio

    parser = PrescribedToolCalls({"lengths": [5, 7, 3], "latencies": [0.25, 2.0]})
    calls = [asyncio.run(parser.extract_tool_calls([1, 2, 3]))[1] for _ in range(3)]
    assert [[(c.name, json.loads(c.arguments)) for c in turn] for turn in calls] == [
        [("wait", {"seconds": 0.25})], [("wait", {"seconds": 2.0})], []]
    assert parser.stop_token_ids == []  # a turn ends at its planned length, not at a tool parser's stop token


def _round(end: float, wait: float, first: float, busy: float, rollout: float, i: int = 1,
           forward_cpu: float = 3.0) -> dict:
    m = {"rollout_to_train_end_s": end, "trainer_wait_ratio": wait, "first_dispatch_s": first,
         "trainer_busy_s": busy, "rollout_s": rollout, "overlap_efficiency": 0.5, "ideal_s": rollout + 1}
    return {"round": i, "warmup": False, "wall_s": end + 0.1, "timeline": "/nonexistent", "workload_shape": {},
            "lengths_honoured": 1.0, "metrics": {"rolloutpipe/" + k: v for k, v in m.items()},
            "cpu_s": {"rollout:VLLM::Worker": forward_cpu, "kernel:kworker": 0.5, "ray_daemons:raylet": 0.25}}


def test_summary_compares_each_mode_with_verl_and_sync_of_the_same_round():
    warm = {**_round(99, 0.9, 9, 1, 1, i=0), "warmup": True}
    raw = {"settings": {"K": 8, "U": 2, "max_num_seqs": 16}, "results": [
        {"workload": "w", "R": 8, "mode": "stock", "rounds": [
            warm, _round(20, 0.5, 8, 8, 8, 1), _round(20, 0.5, 8, 8, 8, 2), _round(16, 0.5, 8, 8, 8, 3)]},
        {"workload": "w", "R": 8, "mode": "sync", "rounds": [
            warm, _round(10, 0.5, 4, 5, 4, 1), _round(12, 0.5, 5, 5, 6, 2), _round(11, 0.5, 6, 5, 5, 3)]},
        {"workload": "w", "R": 8, "mode": "cgp", "rounds": [
            _round(6, 0.2, 1, 5, 5, 1, 3.3), _round(8, 0.3, 2, 5, 5, 2, 3.6), _round(8, 0.1, 3, 5, 5, 3, 3.9)]},
    ]}
    recs = {r["mode"]: r for r in summarize(raw)["records"]}
    assert recs["sync"]["rollout_to_train_end_s"] == 11 and recs["sync"]["rounds"] == 3  # warm-up left out
    # paired per round: cgp 6/10, 8/12, 8/11 of sync; 6/20, 8/20, 8/16 of verl's own step
    assert recs["cgp"]["reduction_vs_sync"] == pytest.approx(1 - 8 / 12)
    assert recs["cgp"]["reduction_vs_verl"] == pytest.approx(1 - 8 / 20)
    lo, hi = recs["cgp"]["reduction_vs_verl_ci"]
    assert 1 - 8 / 16 <= lo <= 1 - 8 / 20 <= hi <= 1 - 6 / 20 and recs["cgp"]["verdict_vs_verl"] == "faster"
    assert recs["stock"]["reduction_vs_verl"] == 0 and recs["stock"]["verdict_vs_verl"] == "no difference shown"
    assert recs["cgp"]["waves"] == 4 and recs["cgp"]["regime"] == "saturated"  # 8 prompts x 8 / 16 slots
    # overlap efficiency from verl's run of the same round: serial 20, rollout 8, train 8, last step 2/8 of it,
    # first group at sync's 4 s -> ideal max(8 + 2, 4 + 8) = 12; cgp took 6 s in round 1: (20 - 6) / (20 - 12)
    assert overlap_efficiency_vs_stock(raw["results"][2]["rounds"][0], raw["results"][0]["rounds"][1],
                                       raw["results"][1]["rounds"][1], 2 / 8) == pytest.approx(14 / 8)
    assert recs["cgp"]["overlap_efficiency_own_rollout"] == 0.5
    assert recs["cgp"]["wait_ratio_reduction_vs_sync"] == pytest.approx(1 - 0.2 / 0.5)
    assert recs["cgp"]["first_dispatch_spread_s"] == pytest.approx(2)
    assert recs["sync"]["no_work_s"] == pytest.approx(11 - 5 - 5)  # median of (1, 1, 1)
    # busy 5 s of at least ideal_s = 6 s: the least waiting these rounds allow is 1/6
    assert recs["cgp"]["trainer_wait_floor"] == pytest.approx(1 / 6)
    # per round, the cut achieved over the cut of the round's own bound (ideal 6 s each): (1 - 6/20) / (1 - 6/20),
    # (1 - 8/20) / (1 - 6/20), (1 - 8/16) / (1 - 6/16) = 1, 6/7, 0.8; the median is the record's
    assert recs["cgp"]["fraction_of_ideal_per_round"] == pytest.approx([1, 6 / 7, 0.8])
    assert recs["cgp"]["fraction_of_ideal"] == pytest.approx(6 / 7)
    # the bound's own cut, the most cgp could cut on these rounds: 1 - 6/20, 1 - 6/20, 1 - 6/16
    assert recs["cgp"]["bound_reduction_vs_verl_per_round"] == pytest.approx([0.7, 0.7, 0.625])
    assert recs["cgp"]["bound_reduction_vs_verl"] == pytest.approx(0.7)
    assert "fraction_of_ideal" not in recs["stock"]
    assert recs["cgp"]["cpu_s_per_round"] == {"rollout": 3.6, "trainer": 0.0, "driver": 0.0, "ray_daemons": 0.25,
                                              "kernel": 0.5, "other": 0.0}
    # the same round's forward on the rollout core: 3.3, 3.6, 3.9 CPU-s against stock's 3.0 -> median 1.2
    assert recs["cgp"]["rollout_cpu_s_by_process"] == {"VLLM::Worker": 3.6}
    assert recs["cgp"]["forward_cpu_vs_stock"] == pytest.approx(1.2) and "forward_cpu_vs_stock" not in recs["stock"]
    text = markdown(summarize(raw))
    assert "| w | 8 | 4.0 (saturated) | cgp |" in text and "faster" in text
    assert "| w | 8 | cgp | 3.60 | 1.20 |" in text
    # the same round's rollout against verl's: 5 s against 8 s in every round; no compute recorded -> no ratio
    assert recs["cgp"]["rollout_vs_stock"] == pytest.approx(5 / 8) and recs["cgp"]["rollout_vs_stock_ci"] == [
        pytest.approx(5 / 8)] * 2
    assert recs["cgp"]["worker_compute_vs_stock"] != recs["cgp"]["worker_compute_vs_stock"]  # NaN
    assert "rollout_vs_cgp" not in recs["cgp"]  # FGD's comparisons with FCFS only for cgp_fgd modes


def test_fgd_is_compared_with_fcfs_on_the_same_round():
    raw = {"settings": {"K": 8, "U": 2, "max_num_seqs": 16}, "results": [
        {"workload": "w", "R": 8, "mode": "stock", "rounds": [_round(20, 0.5, 8, 8, 8, i) for i in (1, 2, 3)]},
        {"workload": "w", "R": 8, "mode": "cgp", "rounds": [
            _round(10, 0.2, 2.0, 5, 8, 1), _round(10, 0.2, 3.0, 5, 10, 2), _round(10, 0.2, 2.5, 5, 9, 3)]},
        {"workload": "w", "R": 8, "mode": "cgp_fgd:hold", "rounds": [
            _round(9, 0.2, 1.5, 5, 8.4, 1), _round(9, 0.2, 2.0, 5, 10, 2), _round(9, 0.2, 3.0, 5, 9.9, 3)]},
    ]}
    fgd = {r["mode"]: r for r in summarize(raw)["records"]}["cgp_fgd:hold"]
    assert fgd["rollout_vs_cgp"] == pytest.approx(1.05)  # 8.4/8, 10/10, 9.9/9 -> 1.05, 1.0, 1.1
    assert fgd["first_group_vs_cgp_s"] == pytest.approx(-0.5)  # -0.5, -1.0, +0.5
    assert fgd["rollout_vs_stock"] == pytest.approx(9.9 / 8)  # 8.4/8, 10/8, 9.9/8
    assert "| w | 8 | cgp_fgd:hold | 1.24 [1.05, 1.25] | – | 1.05 [1.00, 1.10] | -0.50 [-1.00, 0.50] |" in markdown(
        summarize(raw))


def test_cpu_is_attributed_to_whose_process_it_is():
    assert cpu_category("VLLM::Worker_TP0") == "rollout" and cpu_category("ray::WorkerDict.update") == "trainer"
    assert cpu_category("ray::GroupStreamingAgentLoopWorker.generate_groups") == "rollout"  # the recipe's subclass
    assert cpu_category("ray::BenchTaskRunner.run") == cpu_category("ray::RolloutCallsRunner.run") == "driver"
    assert cpu_category("/v/bin/python -m recipe.rolloutpipe.bench --quick") == "driver"
    assert cpu_category("/v/lib/python3.11/site-packages/ray/core/src/ray/raylet/raylet --x") == "ray_daemons"
    assert cpu_category("ray::IDLE") == cpu_category("ray::DashboardAgent") == "ray_daemons"
    assert cpu_category("") == "kernel"  # kernel threads have no command line
    assert cpu_category("/usr/bin/bash") == "other"
    assert rotated(["a", "b", "c"], 0) == ["a", "b", "c"] and rotated(["a", "b", "c"], 4) == ["b", "c", "a"]


def test_pinning_stays_inside_its_own_ray_node(monkeypatch):
    """Two runs on one machine (the suite runs two tests at a time): a run pins only the processes below its own
    raylet, found by parent pid; the grandchild of a started process is below it, this process is not."""
    code = ("import subprocess, sys, time; "
            "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
            "print(c.pid, flush=True); time.sleep(60)")
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    grandchild = int(child.stdout.readline())
    try:
        mine = descendants(os.getpid())
        assert {os.getpid(), child.pid, grandchild} <= mine and os.getppid() not in mine
        monkeypatch.setenv("RAY_RAYLET_PID", str(child.pid))  # as Ray sets it in every worker of a node
        node = this_ray_node()
        assert node == {child.pid, grandchild} and os.getpid() not in node
        monkeypatch.delenv("RAY_RAYLET_PID")
        assert this_ray_node() is None  # outside Ray: the whole machine
    finally:
        os.kill(grandchild, 9)
        child.kill()
        child.wait()


def test_a_round_counts_the_cpu_time_of_its_own_run_only():
    """Two runs' trainer workers on one machine (as in CI, two tests at a time): this run's round counts its own
    worker's CPU time, not the other's; the other's exiting mid-round (its test ending) takes nothing away from it.
    Summed by key over the machine, that exit made this run's trainer CPU negative, so the round showed none."""
    from recipe.rolloutpipe.bench.pinning import cpu_seconds, cpu_used

    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < {}: pass\ntime.sleep(60)"
    ours, other = (subprocess.Popen(["bash", "-c", f'exec -a ray::WorkerDict {sys.executable} -c "{burn.format(s)}"'])
                   for s in (30, 1.5))
    try:
        deadline = time.monotonic() + 20
        while cpu_seconds({other.pid}).get((other.pid, _start_tick(other.pid)), ("", 0.0))[1] < 1.0:
            assert time.monotonic() < deadline, "the other run's worker did not burn its CPU time"
            time.sleep(0.05)
        # both runs' workers, keyed alike (the machine's other processes -- a real stack in the test beside this
        # one -- are kept out: their CPU time would blur the sum)
        both = {ours.pid, other.pid}
        before_ours, before_all = cpu_seconds({ours.pid}), cpu_seconds(both)
        assert {key for key, _ in before_ours.values() if key.startswith("trainer:")} == {"trainer:ray::WorkerDict"}
        assert sum(1 for key, _ in before_all.values() if key == "trainer:ray::WorkerDict") == 2
        time.sleep(0.3)
        other.kill()
        other.wait()
        after_ours, after_all = cpu_seconds({ours.pid}), cpu_seconds(both)
        mine = cpu_used(before_ours, after_ours)["trainer:ray::WorkerDict"]
        assert 0.05 < mine < 1.0  # ~0.3 s of this run's worker burning
        assert cpu_used(before_all, after_all)["trainer:ray::WorkerDict"] == pytest.approx(mine, abs=0.05)
    finally:
        for p in (ours, other):
            p.kill()
            p.wait()


def _start_tick(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2:].split()[19])


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="pins two pools to two different cores")
def test_orchestration_is_pinned_with_the_pool_it_is_given_then_unpinned(monkeypatch):
    """A fake Ray node (processes titled as Ray's and vLLM's): the pools go to their cores, everything else of the
    node (the raylet, the task runner) to the orchestration's cores, and back to every core when unpinned; the
    process outside the node (this one, standing for another run beside it) is left alone."""
    from recipe.rolloutpipe.bench import pinning

    cpus = sorted(os.sched_getaffinity(0))
    rollout, trainer = cpus[:1], cpus[1:2]
    titles = ("ray::WorkerDict", "VLLM::Worker", "ray::BenchTaskRunner", "sleep")
    # the trainer's worker has a helper process of its own (untitled, as a pool's subprocesses are)
    script = ("(exec -a ray::WorkerDict bash -c 'sleep 61 & wait') & "
              + "".join(f"(exec -a {t} sleep 60) & " for t in titles[1:3]) + "wait")
    # a session of its own, killed as one process group: killed one by one, a parent whose child was killed first
    # may exit and be reaped in between (ProcessLookupError, seen in CI)
    node = subprocess.Popen(["bash", "-c", script], start_new_session=True)
    mine = os.sched_getaffinity(0)
    try:
        deadline = time.monotonic() + 10
        while not set(titles) <= {pinning.process_title(p).split(" ")[0] for p in descendants(node.pid)}:
            assert time.monotonic() < deadline, "the fake node's processes did not start"
            time.sleep(0.05)
        by_title = {pinning.process_title(p).split(" ")[0]: p for p in descendants(node.pid)}
        monkeypatch.setenv("RAY_RAYLET_PID", str(node.pid))
        pinned = pinning.pin_pools(rollout, trainer, orchestration_cpus=rollout)
        assert os.sched_getaffinity(by_title["ray::WorkerDict"]) == set(trainer)
        assert os.sched_getaffinity(by_title["VLLM::Worker"]) == set(rollout)
        assert os.sched_getaffinity(by_title["ray::BenchTaskRunner"]) == set(rollout)
        assert os.sched_getaffinity(node.pid) == set(rollout)  # the "raylet": a daemon of the node
        assert {t.split(" ")[0] for t in pinned["orchestration"]} == {"ray::BenchTaskRunner", "bash"}
        assert os.sched_getaffinity(by_title["sleep"]) == mine  # the pool's helper: left as it was started
        pinned = pinning.pin_pools(rollout, trainer)  # unpinned: back to the host's cores, the pools stay
        assert "orchestration" not in pinned
        assert os.sched_getaffinity(by_title["ray::BenchTaskRunner"]) == pinning.HOST_CPUS
        assert os.sched_getaffinity(by_title["ray::WorkerDict"]) == set(trainer)
        assert os.sched_getaffinity(0) == mine
    finally:
        os.killpg(node.pid, 9)
        node.wait()


def test_a_mode_names_where_its_orchestration_runs():
    from types import SimpleNamespace

    from recipe.rolloutpipe.bench.runner import orchestration_cpus

    bench = {"rollout_cpus": [0], "trainer_cpus": [1], "orchestration": None}
    cfg = SimpleNamespace(**bench, get=bench.get)
    assert orchestration_cpus("stock", cfg) is None and orchestration_cpus("cgp_fgd", cfg) is None
    assert orchestration_cpus("stock@rollout", cfg) == [0] and orchestration_cpus("cgp@trainer", cfg) == [1]
    bench["orchestration"] = "rollout"  # the run's setting, for modes without a suffix
    assert orchestration_cpus("cgp_fgd", cfg) == [0] and orchestration_cpus("cgp_fgd@trainer", cfg) == [1]


@pytest.mark.parametrize("override,named", [
    ("rolloutpipe.bench.modes=[stock,cgp@driver]", "'cgp@driver'"),  # no such pool
    ("rolloutpipe.bench.modes=[stock:paced,cgp]", "'stock:paced'"),  # verl's step has no FGD strength
    ("rolloutpipe.bench.modes=[stock,fcfs]", "'fcfs'"),
    ("rolloutpipe.bench.modes=[stock,cgp+group]", "'cgp+group'"),  # no such train unit
    ("rolloutpipe.bench.orchestration=driver", "rolloutpipe.bench.orchestration='driver'"),
])
def test_bad_bench_modes_are_named_before_ray_starts(override, named):
    from recipe.rolloutpipe.bench.__main__ import main

    with pytest.raises(SystemExit) as e:
        main([override])
    message = str(e.value)
    assert named in message, message
    assert ("use null" if "orchestration=" in override else "@rollout or @trainer") in message, message  # the fix


def test_rollout_calls_summary_pairs_rounds_and_measures_the_machine_drift():
    """bench.rollout_calls: a pattern 10 % slower in every round shows x1.1 with a CI of one point, whatever the
    round-to-round drift; a probe that tracks the pool's CPU seconds correlates with it."""
    from experiments.rollout_calls import summarize

    drift = [1.0, 1.6, 0.8, 1.3, 1.1]  # the machine's speed, round by round
    def rec(scale: float) -> dict:
        return {"seconds": [6 * d * scale for d in drift],
                "cpu_s": [{"rollout:VLLM::Worker": 3 * d * scale, "rollout:ray::AgentLoopWorker": 2 * d * scale,
                           "driver:ray::RolloutCallsRunner": 0.1} for d in drift],
                "extra": [{"probe_s": 0.05 * d} for d in drift]}
    s = summarize({"verl_batch": rec(1.0), "per_group": rec(1.1)})
    assert s["per_group"]["ratio_vs_verl_batch"] == pytest.approx(1.1)
    assert s["per_group"]["ratio_ci"] == pytest.approx([1.1, 1.1])
    assert s["per_group"]["cpu_s"]["rollout:VLLM::Worker"] == pytest.approx(3 * 1.1 * 1.1)
    assert s["machine"]["corr_probe_vs_pool_cpu"] > 0.9
    assert s["machine"]["pool_cpu_s_max"] / s["machine"]["pool_cpu_s_min"] == pytest.approx(1.6 / 0.8 * 1.1)


def test_completion_order_says_whether_fcfs_already_served_the_frontier_first():
    def timeline(done: list[float]) -> dict:
        return {"groups": [{"order": i, "times": {"serving_complete": t}} for i, t in enumerate(done)]}

    assert completion_order_rho(timeline([1.0, 2.0, 2.5, 4.0])) == pytest.approx(1.0)  # in submission order
    assert completion_order_rho(timeline([4.0, 3.0, 2.0, 1.0])) == pytest.approx(-1.0)
    assert completion_order_rho(timeline([1.0, 3.0, 2.0, 4.0])) == pytest.approx(0.8)  # one pair swapped
    rho = completion_order_rho(timeline([5.0] * 4))  # verl's step: the batch ends at once, no order
    assert rho != rho


def test_mode_specs():
    assert parse_mode_spec("sync") == ModeSpec("sync", None, None, None)
    assert parse_mode_spec("cgp_fgd:hold/4") == ModeSpec("cgp_fgd", "hold", 4, None)
    assert parse_mode_spec("cgp_fgd:priority+groups") == ModeSpec("cgp_fgd", "priority", None, "groups")
    assert parse_mode_spec("cgp+groups") == ModeSpec("cgp", None, None, "groups")
    assert parse_mode_spec("cgp_fgd+steps") == ModeSpec("cgp_fgd", None, None, "steps")
    assert parse_mode_spec("cgp_fgd:hold/auto") == ModeSpec("cgp_fgd", "hold", "auto", None)
    assert parse_mode_spec("cgp_fgd:hold/engine") == ModeSpec("cgp_fgd", "hold", "engine", None)
    assert parse_mode_spec("cgp_fgd:paced") == ModeSpec("cgp_fgd", "paced", None, None)
    assert parse_mode_spec("stock@rollout") == ModeSpec("stock", None, None, None, "rollout")
    assert parse_mode_spec("cgp_fgd:hold/4+groups@trainer") == ModeSpec("cgp_fgd", "hold", 4, "groups", "trainer")


@pytest.mark.parametrize("overrides,mode,num_groups,width,multi_turn", [
    ([], "cgp_fgd", 16, 8, False),  # the default strength, paced: the engine's width, ceil(2 * 32 slots / K=8)
    ([], "cgp_fgd", 16, 16, True),  # a workload that calls tools: paced lets the whole round in
    ([], "cgp_fgd:hold", 16, 2, False),  # the config's null under hold is U, not paced's resolution of it
    ([], "cgp_fgd:hold", 16, 2, True),  # ... with tools too: hold's frontier is what hold is for
    ([], "cgp_fgd:hold/engine", 4, 4, False),  # a width word resolved for this R (capped at R)
    ([], "cgp_fgd:hold/engine", 16, 16, True),
    (["rolloutpipe.frontier_width=3"], "cgp_fgd:hold", 16, 3, False),
    (["rolloutpipe.frontier_width=3"], "cgp_fgd:paced", 16, 8, False),  # paced takes its own unless the spec names one
    (["rolloutpipe.frontier_width=3"], "cgp_fgd:paced/3", 16, 3, True),  # a number stays that number
    (["rolloutpipe.frontier_width=auto"], "cgp_fgd:hold", 16, 2, False),  # auto starts at U
])
def test_a_bench_mode_gets_the_width_of_its_own_strength_and_r(overrides, mode, num_groups, width, multi_turn):
    from recipe.rolloutpipe.bench.__main__ import load_config
    from recipe.rolloutpipe.bench.runner import round_settings_for
    from recipe.rolloutpipe.config_check import validate

    cfg = load_config(False, overrides)
    run = validate(cfg)
    settings = round_settings_for(cfg, mode, num_groups, multi_turn)
    assert (settings.num_groups, settings.frontier_width) == (num_groups, width)
    assert settings.frontier_auto == ("auto" in "".join(overrides))
    # what the spec leaves alone is the run's: the one resolver, not a copy of its fields
    assert settings.replace(mode=run.mode, num_groups=run.num_groups, fgd_strength=run.fgd_strength,
                            frontier_width=run.frontier_width) == run


@pytest.mark.real_stack(runs=1)
def test_bench_runs_all_modes_on_the_real_stack(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "recipe.rolloutpipe.bench", "--json", str(tmp_path / "records.json"),
         f"rolloutpipe.bench.out_dir={tmp_path}/results",
         # the multi-turn workload too, at most one tool call per response (its turns share the 48-token cap), the
         # tool's latency a tenth of the bench's (this checks the turns, not the environment's tail)
         "rolloutpipe.bench.workloads=[sci-longtail,agentic-longtail]",
         "rolloutpipe.bench.profiles.agentic-longtail.max_calls=1", "rolloutpipe.bench.sizes=[4]",
         "rolloutpipe.bench.profiles.agentic-longtail.latency_p50_s=0.04",
         "rolloutpipe.bench.profiles.agentic-longtail.latency_max_s=0.8",
         "rolloutpipe.bench.modes=[stock,sync,cgp,cgp_fgd:priority+groups,cgp_fgd:paced@rollout]",
         "rolloutpipe.bench.rounds=1", "rolloutpipe.bench.warmup_rounds=0", "data.max_response_length=48",
         f"trainer.default_local_dir={tmp_path}/ckpt"],
        capture_output=True, text=True, timeout=900, cwd=ROOT)
    log = out.stdout + out.stderr
    assert out.returncode == 0, log[-6000:]
    every = json.loads((tmp_path / "records.json").read_text())["records"]
    paced = "cgp_fgd:paced@rollout"  # with its orchestration pinned to the rollout pool's core
    modes = ["stock", "sync", "cgp", "cgp_fgd:priority+groups", paced]
    assert [(r["workload"], r["mode"]) for r in every] == [(w, m) for w in ("sci-longtail", "agentic-longtail")
                                                           for m in modes]
    # the multi-turn workload: verl's step and every mode ran the planned turns (tool calls through verl's tool
    # path, each waiting its planned latency), every trained response with its planned number of turns
    agentic = [r for r in every if r["workload"] == "agentic-longtail"]
    for r in agentic:
        assert r["lengths_honoured"] == 1.0 and r["workload_shape"]["mean_tool_calls"] > 0, r
        assert r["rollout_to_train_end_s"] > 0 and len(r["reduction_vs_verl_ci"]) == 2
    records = [r for r in every if r["workload"] == "sci-longtail"]
    for r in records:
        assert r["lengths_honoured"] == 1.0  # every response has exactly the workload's length (max_tokens+ignore_eos)
        assert r["rollout_to_train_end_s"] > 0 and "reduction_vs_sync" in r and r["rollout_train_ratio_sync"] > 0
        assert "reduction_vs_verl" in r and len(r["reduction_vs_verl_ci"]) == 2 and r["waves"] == 4 * 8 / 32
        assert r["cpu_s_per_round"]["rollout"] > 0 and r["cpu_s_per_round"]["trainer"] > 0  # both pools pinned+busy
    # trainer calls per round (R=4, U=2): verl's step 2 (π_old, update); sync 1 (its round in one call, as verl's
    # update_actor); a call per optimizer step in cgp; per dispatch with the groups unit (at least one per step)
    calls = {r["mode"]: r["trainer_calls"] for r in records}
    assert (calls["stock"], calls["sync"], calls["cgp"], calls[paced]) == (2, 1, 2, 2), calls
    assert calls["cgp_fgd:priority+groups"] >= 2, calls
    # the data those calls carried (payload.py), metered the same way in verl's step and the recipe's: verl's two
    # calls each send the round's rows; the pipelined modes send each row once, over their calls
    sent = {r["mode"]: (r["trainer_payload_calls"], r["trainer_payload_bytes"]) for r in records}
    assert {mode: n for mode, (n, _) in sent.items()} == calls, sent
    once = sent["sync"][1]
    assert once > 0 and 1.5 * once < sent["stock"][1] < 2.5 * once, sent
    assert all(0.9 * once < b < 1.1 * once for mode, (_, b) in sent.items() if mode != "stock"), sent
    assert "data sent (MB)" in (tmp_path / "results" / "bench.md").read_text()
    raw_rounds = [res for res in json.loads((tmp_path / "results" / "bench_raw.json").read_text())["results"]
                  if res["workload"] == "sci-longtail"]
    stock = raw_rounds[0]["rounds"][0]
    assert stock["verl_timing_s"]["gen"] > 0 and stock["verl_timing_s"]["update_actor"] > 0  # verl's own step ran
    for res in raw_rounds:  # the worker's compute is part of the trainer's call time, the rest is overhead
        m = res["rounds"][0]["metrics"]
        assert 0 < m["rolloutpipe/worker_compute_s"] < m["rolloutpipe/trainer_busy_s"], (res["mode"], m)
        # both parts timed: π_old (infer) and the update (train) each ran on the worker in every mode
        assert m["rolloutpipe/worker_infer_s"] > 0 and m["rolloutpipe/worker_train_s"] > 0, (res["mode"], m)
        assert m["rolloutpipe/worker_infer_s"] + m["rolloutpipe/worker_train_s"] == pytest.approx(
            m["rolloutpipe/worker_compute_s"])
    assert [res["rounds"][0]["position_in_round"] for res in raw_rounds] == [0, 1, 2, 3, 4]
    # paced's width is the engine's: ceil(2 * 32 slots / K=8) = 8 groups, capped at R=4 -- the whole round at once
    assert raw_rounds[4]["rounds"][0]["metrics"]["rolloutpipe/frontier_width"] == 4
    raw = json.loads((tmp_path / "results" / "bench_raw.json").read_text())
    assert {p.split(" ")[0] for p in raw["pinned"]["trainer"]} == {"ray::WorkerDict"}
    assert any(p.startswith("VLLM::Worker") for p in raw["pinned"]["rollout"])
    # the last mode pinned (paced@rollout) put the orchestration on the rollout core: the task runner, Ray's raylet
    orchestration = {p.split(" ")[0] for p in raw["pinned"]["orchestration"]}
    assert any(p.startswith("ray::BenchTaskRunner") for p in orchestration), orchestration  # (.run while it runs)
    assert any("raylet" in p for p in orchestration), orchestration
    for name in ("bench.md", "bench_bars.png", "timelines_sci-longtail_R4.png", "timelines_agentic-longtail_R4.png"):
        assert (tmp_path / "results" / name).stat().st_size > 0


def test_rollout_time_against_r_is_fitted_per_workload():
    recs = [{"workload": "w", "mode": "stock", "R": r, "rollout_s": 0.5 * r + 1} for r in (8, 16, 24)]
    recs += [{"workload": "w", "mode": "cgp", "R": 8, "rollout_s": 99.0}]  # pipelined modes are not fitted
    (fit,) = rollout_vs_r(recs)
    assert fit["mode"] == "stock" and fit["s_per_group"] == pytest.approx(0.5)
    assert fit["intercept_s"] == pytest.approx(1) and fit["r2"] == pytest.approx(1)


def test_long_prompts_keep_each_problem_and_reach_the_asked_length(tmp_path):
    import pandas as pd

    from experiments.long_prompts import write_long_prompts
    from recipe.rolloutpipe.prepare import default_dir, ensure_default

    ensure_default()
    info = write_long_prompts(tmp_path, 120)
    assert 115 <= info["min_tokens"] <= info["max_tokens"] <= 125 and info["max_prompt_length"] >= info["max_tokens"]
    for split in ("train", "val"):
        before = pd.read_parquet(default_dir() / f"{split}.parquet")
        after = pd.read_parquet(tmp_path / f"{split}.parquet")
        assert len(after) == len(before)
        assert [list(p)[1:] for p in after["prompt"]] == [list(p) for p in before["prompt"]]  # the problem, unchanged
        assert {p[0]["role"] for p in after["prompt"]} == {"system"}
        assert list(after["reward_model"]) == list(before["reward_model"])
    with pytest.raises(ValueError, match="--tokens 5 is not above"):
        write_long_prompts(tmp_path / "short", 5)

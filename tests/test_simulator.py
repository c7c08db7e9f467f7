"""The simulator drives the real pipeline classes; checks against the paper's facts and a known calibration."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from recipe.rolloutpipe.sim.__main__ import calibrate_from_run, main
from recipe.rolloutpipe.sim.paper import ENGINE, TRAINER, calibrated, paper_matrix
from recipe.rolloutpipe.sim.simulator import TrainerModel, Workload, paper_round, simulate_round

W = Workload("t", mean_tokens=800, sigma_between=0.6, sigma_within=0.4, p_cap=0.05, cap=4096)


@pytest.mark.parametrize("mode,strength", [("sync", "hold"), ("cgp", "hold"), ("cgp_fgd", "hold"),
                                           ("cgp_fgd", "priority"), ("cgp_fgd_adaptive", "hold")])
def test_round_consumes_every_group_and_trains_the_same(mode, strength):
    tl = simulate_round(paper_round(24, mode=mode, fgd_strength=strength, max_extra_groups=6), W, filter_p=0.2)
    m = tl.metrics()
    assert tl.ledger.published and m["rolloutpipe/groups_trained"] == tl.ledger.num_trainable
    steps = {s for iv in tl.intervals for s in iv.step_indices}
    assert m["rolloutpipe/trainer_busy_s"] == pytest.approx(tl.ledger.num_trainable * TrainerModel().per_group_s
                                                            + len(steps) * 0.1)


def test_ready_steps_take_a_backlog_in_fewer_calls_and_the_same_steps():
    """train_unit=steps in the simulator: a trainer slower than the arrivals catches up in fewer calls, each paying
    the per-call cost once, over the same optimizer steps and groups as one call per step."""
    slow = TrainerModel(per_group_s=20.0, call_overhead_s=2.0)
    per_step, ready = (simulate_round(paper_round(24, mode="cgp", train_unit=unit), W, trainer=slow)
                       for unit in ("step", "steps"))
    assert per_step.trainer_calls() == 12 and ready.trainer_calls() < 12
    assert ready.ledger.materialization_order == per_step.ledger.materialization_order
    steps = [{g.order: g.step_index for g in tl.ledger.groups} for tl in (ready, per_step)]
    assert steps[0] == steps[1]
    key = "rolloutpipe/rollout_to_train_end_s"
    saved = (12 - ready.trainer_calls()) * slow.call_overhead_s
    assert ready.metrics()[key] == pytest.approx(per_step.metrics()[key] - saved)


def test_pipelining_never_loses_to_sync_and_fgd_dispatches_first_group_earlier():
    w = calibrated("OlyPhys")
    ends = {m: simulate_round(paper_round(96, mode=m), w, ENGINE, TRAINER).metrics()
            for m in ("sync", "cgp", "cgp_fgd")}
    key = "rolloutpipe/rollout_to_train_end_s"
    assert ends["cgp_fgd"][key] <= ends["cgp"][key] <= ends["sync"][key]
    assert ends["cgp_fgd"]["rolloutpipe/first_dispatch_s"] < ends["cgp"]["rolloutpipe/first_dispatch_s"]


def test_paper_matrix_is_calibrated():
    rec = paper_matrix()
    assert len(rec) == 36
    sync96 = [r for r in rec if r["R"] == 96 and r["mode"] == "sync"]
    assert all(470 <= r["rollout_s"] <= 515 for r in sync96)  # serial rollout at R=96 ≈ 510 s (cap limits OlyPhys)
    assert all(0.40 <= r["trainer_wait_ratio"] <= 0.55 for r in rec if r["mode"] == "sync")


def test_from_run_recovers_a_known_engine(tmp_path):
    """A 'measured' timeline from a 3x slower engine: calibrating on it predicts the other modes within 15%."""
    w = calibrated("Sci-JL")
    slow = replace(ENGINE, step_base_s=ENGINE.step_base_s * 3, step_per_seq_s=ENGINE.step_per_seq_s * 3,
                   prefill_per_token_s=ENGINE.prefill_per_token_s * 3)
    truth = {m: simulate_round(paper_round(64, mode=m), w, slow, TRAINER) for m in ("sync", "cgp", "cgp_fgd")}
    path = tmp_path / "run.json"
    path.write_text(json.dumps(truth["cgp_fgd"].to_dict()))
    eng, tr = calibrate_from_run(truth["cgp_fgd"], w, "cgp_fgd", paper_round(64))
    for m, tl in truth.items():
        pred = simulate_round(paper_round(64, mode=m), w, eng, tr).metrics()["rolloutpipe/rollout_to_train_end_s"]
        real = tl.metrics()["rolloutpipe/rollout_to_train_end_s"]
        assert abs(pred - real) / real < 0.15, (m, pred, real)
    assert main(["--from-run", str(path), "--workload", "Sci-JL", "--json", str(tmp_path / "p.json")]) == 0
    assert len(json.loads((tmp_path / "p.json").read_text())) == 5


def test_from_run_replays_the_round_shape_the_run_recorded(tmp_path):
    """K and U come from the timeline's settings (what the trainer was configured with), not from defaults."""
    tl = simulate_round(paper_round(24, group_size=4, step_groups=6, mode="cgp"), calibrated("Sci-JL"), ENGINE, TRAINER)
    data = tl.to_dict()
    assert data["settings"]["K"] == 4 and data["settings"]["U"] == 6
    (tmp_path / "run.json").write_text(json.dumps(data))
    assert main(["--from-run", str(tmp_path / "run.json"), "--json", str(tmp_path / "p.json")]) == 0
    preds = json.loads((tmp_path / "p.json").read_text())
    assert {(p["K"], p["U"]) for p in preds} == {(4, 6)}
    del data["settings"]
    (tmp_path / "old.json").write_text(json.dumps(data))
    with pytest.raises(SystemExit, match="has no 'settings' with K and U"):
        main(["--from-run", str(tmp_path / "old.json")])


def test_simulator_predicts_the_real_benchmark_out_of_sample():
    """docs/results/bench_raw.json is a real pinned CPU run (python -m recipe.rolloutpipe.bench). Calibrated per
    round on verl's own (stock) rounds only -- engine speed, trainer seconds per token -- the simulator must predict
    the serial mode and CGP within 20 % in every setting (measured: -14.7 .. +8.5 % and -17.5 .. +5.2 %). Calibrated
    on sync rounds it must reproduce them (the calibration itself). The FGD modes are reported (docs/simulator.md)."""
    import json
    from pathlib import Path

    from recipe.rolloutpipe.sim.from_bench import validate_against_bench

    raw = json.loads((Path(__file__).resolve().parents[1] / "docs/results/bench_raw.json").read_text())
    settings = {(r["workload"], r["R"]) for r in raw["results"]}
    predicted = validate_against_bench(raw, calibrate_mode="stock", contention_mode=None, modes={"sync", "cgp"})
    assert len(predicted) == 2 * len(settings) >= 2
    assert all(abs(r["error"]) <= 0.20 for r in predicted), predicted
    reproduced = validate_against_bench(raw, modes={"sync"})
    assert len(reproduced) == len(settings) and all(abs(r["error"]) <= 0.01 for r in reproduced), reproduced


def test_bench_mode_specs_become_the_simulators_round_shape():
    """The simulator replays what a bench mode ran: its recorded RoundSettings where the record has them, else the
    trainer's resolver on the bench's config values -- engine = ceil(2 * max_num_seqs / K) in [U, R]; a bare spec
    under the config's paced strength gets paced's engine width (not hold's U); auto = the width the round recorded."""
    from recipe.rolloutpipe.pipeline import RoundSettings
    from recipe.rolloutpipe.sim.from_bench import _spec

    settings = {"K": 8, "U": 2, "F_w": 2, "max_num_seqs": 32, "fgd_strength": "hold", "train_unit": "step"}
    assert _spec("cgp_fgd:hold/engine", 24, settings).frontier_width == 8
    assert _spec("cgp_fgd:hold/engine", 4, settings).frontier_width == 4  # capped at R
    assert (_spec("cgp_fgd:paced", 24, settings).frontier_width, _spec("cgp_fgd:paced/3", 24, settings).frontier_width
            ) == (8, 3)  # paced: the engine's width unless the spec names one
    auto = _spec("cgp_fgd:hold/auto", 24, settings, {"metrics": {"rolloutpipe/frontier_width": 13}})
    assert auto.frontier_width == 13
    stock, bare = _spec("stock", 24, settings), _spec("cgp_fgd", 24, settings)
    assert (stock.mode, stock.train_unit, bare.frontier_width, bare.fgd_strength) == ("sync", "step", 2, "hold")
    paced = _spec("cgp_fgd+groups", 24, {**settings, "fgd_strength": "paced", "F_w": None})
    assert (paced.fgd_strength, paced.frontier_width, paced.train_unit) == ("paced", 8, "groups")
    ran = paced.replace(frontier_width=5)  # a record's own settings win over anything resolved
    assert _spec("cgp_fgd", 24, settings, {"round_settings": ran.record()}) == ran
    assert RoundSettings.from_record(ran.record()) == ran
    with pytest.raises(ValueError, match="without \\['fgd_strength', 'train_unit'\\]"):
        _spec("cgp_fgd", 24, {"K": 8, "U": 2, "F_w": 2, "max_num_seqs": 32})


def test_bisection_stops_at_its_tolerance():
    """The calibrations bisect a whole simulated round per evaluation: they stop once the interval is within 1e-6
    (relative on the geometric scale, absolute on the linear one), not after a fixed 60 halvings."""
    from recipe.rolloutpipe.sim.calibrate import bisect_increasing

    calls = []

    def f(x: float) -> float:
        calls.append(x)
        return x

    assert bisect_increasing(f, 0.37, 1e-4, 1e4, geometric=True) == pytest.approx(0.37, rel=1e-6)
    assert len(calls) <= 26  # log2(ln(1e8) / 1e-6) = 24.1 halvings
    calls.clear()
    assert bisect_increasing(f, 1.3, 0.0, 4.0) == pytest.approx(1.3, abs=1e-6)
    assert len(calls) <= 23  # log2(4 / 1e-6) = 21.9

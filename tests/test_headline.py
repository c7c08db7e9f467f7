"""The headline summary (recipe/rolloutpipe/bench/headline.py): medians over every round of every launch, a BCa CI
with rounds resampled within their launch, fraction of the ideal cut, targets, the README table generated from it,
and a dirty tree refused. Built from bench.json-shaped runs; the real launches are a command, not a test."""

from __future__ import annotations

import numpy as np
import pytest

from recipe.rolloutpipe.bench import headline
from recipe.rolloutpipe.bench.report import median_ci


def _run(cuts: dict[str, list[float]], stock_s: float = 8.0, ideal_s: float = 5.6) -> dict:
    records = [{"workload": "sci-longtail", "R": 16, "mode": "stock", "rollout_to_train_end_s": stock_s}]
    for mode, per_round in cuts.items():
        records.append({"workload": "sci-longtail", "R": 16, "mode": mode, "rounds": len(per_round),
                        "reduction_vs_verl": float(np.median(per_round)), "reduction_vs_verl_ci": [0, 0],
                        "reduction_vs_verl_per_round": per_round, "ideal_s": ideal_s,
                        "fraction_of_ideal_per_round": [x / (1 - ideal_s / stock_s) for x in per_round],
                        "bound_reduction_vs_verl_per_round": [1 - ideal_s / stock_s] * len(per_round)})
    return {"git_commit": "abc1234", "settings": {"wall_s": 500.0}, "records": records}


def _runs(seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [_run({"sync": list(rng.normal(0.0, 0.02, 10)), "cgp_fgd": list(rng.normal(0.26 + 0.02 * i, 0.04, 10))})
            for i in range(3)]


def test_median_and_ci_cover_every_round_of_every_launch():
    runs = _runs()
    h = headline.summarize(runs, "abc1234", rounds_per_run=10)
    pooled = [x for r in runs for x in r["records"][2]["reduction_vs_verl_per_round"]]
    m = h["modes"]["cgp_fgd"]
    assert m["rounds"] == 30 and m["median_reduction_vs_verl"] == pytest.approx(np.median(pooled))
    lo, hi = m["reduction_vs_verl_ci"]
    assert lo < m["median_reduction_vs_verl"] < hi
    # not the min-max of anything: strictly inside the range of the values
    assert min(pooled) < lo and hi < max(pooled)
    assert "BCa" in h["ci_method"] and h["rounds_per_run"] == 10 and len(h["runs"]) == 3
    assert m["per_run_median"] == [r["records"][2]["reduction_vs_verl"] for r in runs]
    # the bound's cut is 1 - 5.6 / 8 = 0.3: a 0.27 cut is 0.9 of it; the median over every round of every launch
    assert m["fraction_of_ideal"] == pytest.approx(np.median([x / 0.3 for x in pooled]))
    assert m["bound_reduction_vs_verl"] == pytest.approx(0.3)


def test_a_wider_spread_gives_a_wider_ci():
    rng = np.random.default_rng(1)
    base = [list(rng.normal(0, 1, 10)) for _ in range(3)]
    narrow = median_ci([[0.25 + 0.01 * x for x in run] for run in base])
    wide = median_ci([[0.25 + 0.05 * x for x in run] for run in base])
    assert (wide[1] - wide[0]) == pytest.approx(5 * (narrow[1] - narrow[0]))  # BCa is equivariant
    assert narrow[0] < 0.25 < narrow[1]
    # ties everywhere (BCa degenerate): still an interval around the median, from the percentile fallback
    tied = median_ci([[0.2, 0.2, 0.3, 0.3, 0.3]] * 2)
    assert tied[0] <= 0.3 <= tied[1] and tied == tied


def test_targets_are_judged_from_the_summary():
    good = headline.summarize(_runs(), "abc1234", 10)["targets"]
    assert good["cgp_fgd"] is True and good["sync"] is True
    slow = [_run({"sync": [0.06] * 5 + [0.05] * 5, "cgp_fgd": [0.20, 0.22] * 5}) for _ in range(3)]
    bad = headline.summarize(slow, "abc1234", 10)["targets"]
    assert bad["cgp_fgd"] is False and bad["sync"] is False


def test_readme_table_is_regenerated_between_its_markers(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(f"# Title\nbefore\n{headline.TABLE_START}\nold table\n{headline.TABLE_END}\nafter\n")
    h = headline.summarize(_runs(), "abc1234", 10)
    headline.write_readme_table(h, readme)
    once = readme.read_text()
    headline.write_readme_table(h, readme)
    assert readme.read_text() == once  # idempotent
    assert "old table" not in once and once.startswith("# Title\nbefore\n") and once.endswith("\nafter\n")
    row = next(line for line in once.splitlines() if line.startswith("| `cgp_fgd`"))
    assert f"**{100 * h['modes']['cgp_fgd']['median_reduction_vs_verl']:+.1f} %**" in row
    assert "| +30 % |" in row  # the bound's cut (1 - 5.6 / 8) beside the achieved one
    readme.write_text("no markers\n")
    with pytest.raises(SystemExit, match="no headline table markers"):
        headline.write_readme_table(h, readme)


def test_a_dirty_tree_is_refused_unless_allowed(monkeypatch, tmp_path):
    monkeypatch.setattr(headline, "git_commit", lambda: "abc1234-dirty")
    with pytest.raises(SystemExit, match="commit first"):
        headline.run(False, [], runs=1, rounds=10, out_dir=tmp_path)


def test_the_readme_figure_is_launch_ones_timelines(tmp_path):
    run1 = tmp_path / "run1"
    run1.mkdir()
    with pytest.raises(SystemExit, match="expected one timelines_"):
        headline.publish_figure(run1, tmp_path / "fig.png")
    (run1 / "timelines_sci-longtail_R16.png").write_bytes(b"png of launch 1")
    (run1 / "critical_path_sci-longtail_R16.png").write_bytes(b"another figure")
    assert headline.publish_figure(run1, tmp_path / "fig.png").read_bytes() == b"png of launch 1"

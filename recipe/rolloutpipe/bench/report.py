"""Benchmark results → JSON records, a markdown table and PNGs (pure Python + matplotlib, no Ray/verl)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from ..pipeline import PREFIX, RoundTimeline, plot_gantt

METRICS = ("rollout_to_train_end_s", "trainer_wait_ratio", "first_dispatch_s", "overlap_efficiency",
           "trainer_busy_s", "rollout_s", "ideal_s", "serial_estimate_s", "trainer_wait_before_first_s", "publish_s")


def _median(xs: list[float]) -> float:
    xs = [x for x in xs if x == x]  # drop NaN
    return statistics.median(xs) if xs else float("nan")


def _measured(setting: dict) -> list[dict]:
    return [r for r in setting["rounds"] if not r["warmup"]]


def group_overheads(timeline: dict) -> dict[str, float]:
    """Per-round pipeline costs read from a timeline: per-group materialize time (reward, advantages, rows) and
    the time in the round when neither the engine had requests nor the trainer was busy."""
    mats = [g["times"]["materialized"] - g["times"]["serving_complete"] for g in timeline["groups"]
            if "materialized" in g["times"] and "serving_complete" in g["times"]]
    return {"materialize_per_group_s": _median(mats)}


def summarize(raw: dict) -> dict[str, Any]:
    """One record per (workload, R, mode) with medians over the measured rounds, plus the comparisons to sync."""
    records = []
    for s in raw["results"]:
        rounds = _measured(s)
        rec: dict[str, Any] = {"workload": s["workload"], "R": s["R"], "mode": s["mode"], "rounds": len(rounds)}
        for m in METRICS:
            rec[m] = _median([r["metrics"].get(PREFIX + m, float("nan")) for r in rounds])
        fd = [r["metrics"][PREFIX + "first_dispatch_s"] for r in rounds]
        rec["first_dispatch_spread_s"] = (max(fd) - min(fd)) if fd else float("nan")
        rec["round_wall_s"] = _median([r["wall_s"] for r in rounds])
        # time in the window when neither rollout nor trainer is working: the pipeline's own cost (sync: no overlap)
        idle = [r["metrics"][PREFIX + "rollout_to_train_end_s"] - r["metrics"][PREFIX + "rollout_s"]
                - r["metrics"][PREFIX + "trainer_busy_s"] for r in rounds]
        rec["no_work_s"] = _median(idle)
        mats = [group_overheads(json.loads(Path(r["timeline"]).read_text()))["materialize_per_group_s"]
                for r in rounds if Path(r["timeline"]).exists()]
        rec["materialize_per_group_s"] = _median(mats)
        rec["workload_shape"] = rounds[0]["workload_shape"] if rounds else {}
        rec["lengths_honoured"] = min((r.get("lengths_honoured", float("nan")) for r in rounds), default=float("nan"))
        rec["cpu_s_per_round"] = {pool: round(_median([sum(v for k, v in r.get("cpu_s", {}).items()
                                                          if k.startswith(pool + ":")) for r in rounds]), 3)
                                  for pool in ("rollout", "trainer", "other")}
        records.append(rec)
    sync = {(r["workload"], r["R"]): r for r in records if r["mode"] == "sync"}
    for rec in records:
        base = sync.get((rec["workload"], rec["R"]))
        if base is None:
            continue
        rec["reduction_vs_sync"] = 1 - rec["rollout_to_train_end_s"] / base["rollout_to_train_end_s"]
        rec["wait_ratio_reduction_vs_sync"] = (1 - rec["trainer_wait_ratio"] / base["trainer_wait_ratio"]
                                               if base["trainer_wait_ratio"] > 0 else float("nan"))
        rec["rollout_train_ratio_sync"] = base["rollout_s"] / base["trainer_busy_s"]
        if rec["mode"] == "sync":
            rec["pipeline_overhead_share"] = rec["no_work_s"] / rec["rollout_to_train_end_s"]
    return {"git_commit": raw.get("git_commit"), "machine": raw.get("machine"), "pinned": raw.get("pinned"),
            "settings": raw.get("settings"), "records": records}


def _fmt(x: float, pct: bool = False) -> str:
    if x != x:
        return "–"
    return f"{100 * x:.0f}%" if pct else f"{x:.2f}"


def markdown(summary: dict[str, Any]) -> str:
    head = ("| workload | R | rollout/train (sync) | mode | rollout→train end (s) | vs sync | trainer wait | "
            "wait vs sync | first dispatch (s) | spread (s) | overlap eff. |\n" + "|---" * 11 + "|")
    lines = [head]
    for r in summary["records"]:
        lines.append(
            f"| {r['workload']} | {r['R']} | {_fmt(r.get('rollout_train_ratio_sync', float('nan')))} | {r['mode']} | "
            f"{_fmt(r['rollout_to_train_end_s'])} | {_fmt(r.get('reduction_vs_sync', float('nan')), True)} | "
            f"{_fmt(r['trainer_wait_ratio'], True)} | {_fmt(r.get('wait_ratio_reduction_vs_sync', float('nan')), True)}"
            f" | {_fmt(r['first_dispatch_s'])} | {_fmt(r['first_dispatch_spread_s'])} | "
            f"{_fmt(r['overlap_efficiency'])} |")
    sync = [r for r in summary["records"] if r["mode"] == "sync"]
    lines += ["", "Pipeline cost (sync rounds: no overlap possible): time in the round when neither the engine nor "
              "the trainer works, and per-group materialization (reward, GRPO advantages, rows) on the rollout side.",
              "", "| workload | R | no-work time (s) | share of round | materialize per group (ms) | publish (s) |",
              "|---|---|---|---|---|---|"]
    for r in sync:
        lines.append(f"| {r['workload']} | {r['R']} | {_fmt(r['no_work_s'])} | "
                     f"{_fmt(r.get('pipeline_overhead_share', float('nan')), True)} | "
                     f"{1000 * r['materialize_per_group_s']:.1f} | {_fmt(r['publish_s'])} |")
    return "\n".join(lines) + "\n"


def plot_bars(summary: dict[str, Any], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    recs = summary["records"]
    settings = list(dict.fromkeys((r["workload"], r["R"]) for r in recs))
    modes = list(dict.fromkeys(r["mode"] for r in recs))
    by = {(r["workload"], r["R"], r["mode"]): r for r in recs}
    fig, axes = plt.subplots(2, 1, figsize=(max(6, 1.6 * len(settings)), 6.5), sharex=True)
    width = 0.8 / len(modes)
    for j, mode in enumerate(modes):
        xs = [i + (j - (len(modes) - 1) / 2) * width for i in range(len(settings))]
        axes[0].bar(xs, [by[(w, r, mode)]["rollout_to_train_end_s"] if (w, r, mode) in by else 0
                         for w, r in settings], width, label=mode)
        axes[1].bar(xs, [100 * by[(w, r, mode)]["trainer_wait_ratio"] if (w, r, mode) in by else 0
                         for w, r in settings], width, label=mode)
    axes[0].set_ylabel("rollout → train end (s)")
    axes[1].set_ylabel("trainer waiting (%)")
    axes[1].set_xticks(range(len(settings)), [f"{w}\nR={r}" for w, r in settings], fontsize=8)
    axes[0].legend(fontsize=8)
    axes[0].set_title("RolloutPipe bench: median over measured rounds (rollout core 0, trainer core 1)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_stacked(raw: dict, workload: str, num_groups: int, path: Path) -> Path | None:
    """The three modes' timelines of one setting, stacked (the measured round closest to the mode's median)."""
    timelines, labels = [], []
    for s in raw["results"]:
        if s["workload"] != workload or s["R"] != num_groups:
            continue
        rounds = _measured(s)
        med = _median([r["metrics"][PREFIX + "rollout_to_train_end_s"] for r in rounds])
        pick = min(rounds, key=lambda r: abs(r["metrics"][PREFIX + "rollout_to_train_end_s"] - med))
        timelines.append(RoundTimeline.from_dict(json.loads(Path(pick["timeline"]).read_text())))
        labels.append(f"{workload} R={num_groups} {s['mode']}")
    return plot_gantt(timelines, labels, path) if timelines else None


def write_all(raw: dict, out_dir: Path, json_out: Path | None) -> dict[str, Any]:
    summary = summarize(raw)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "bench_raw.json").write_text(json.dumps(raw, indent=1))
    text = json.dumps(summary, indent=1)
    (out_dir / "bench.json").write_text(text)
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(text)
    (out_dir / "bench.md").write_text(markdown(summary))
    plot_bars(summary, out_dir / "bench_bars.png")
    for w, r in dict.fromkeys((s["workload"], s["R"]) for s in raw["results"]):
        plot_stacked(raw, w, r, out_dir / f"timelines_{w}_R{r}.png")
    return summary

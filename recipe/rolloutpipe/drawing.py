"""Drawing a round's timeline: a Chrome trace (Perfetto) and a Gantt chart (matplotlib), beside its JSON.

Kept apart from the pure ``pipeline`` package, which only records what happened (``RoundTimeline``).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from .pipeline import PREFIX, RoundTimeline, TrainerInterval

# (label, from state, to state(s), colour) per group phase, in order
_PHASES = (
    ("queued", "submitted", "admitted", "#d9d9d9"),
    ("generating", "admitted", "serving_complete", "#4c72b0"),
    ("reward+advantage", "serving_complete", ("materialized", "filtered"), "#dd8452"),
    ("in FIFO", "materialized", "dispatched", "#c7e9c0"),
    ("training", "dispatched", "consumed", "#55a868"),
)
# the slowest response's reward call, inside "generating" (scored on the rollout side as each trajectory ends): drawn
# over the end of that phase, when the reward guard measured it
_REWARD_CALL = ("reward call (slowest)", "#937860")


def write_timeline(timeline: RoundTimeline, out_dir: str | Path, stem: str, png: bool = True) -> list[Path]:
    """Write ``stem.json`` (the timeline), ``stem.trace.json`` (Chrome trace) and, if ``png``, ``stem.png`` (Gantt;
    ~0.15 s of matplotlib, so a trainer may draw only some rounds)."""
    paths = [timeline.write_json(out_dir, stem), Path(out_dir) / f"{stem}.trace.json"]
    paths[1].write_text(json.dumps(chrome_trace(timeline, stem)))
    if png:
        paths.append(plot_gantt([timeline], [stem], Path(out_dir) / f"{stem}.png"))
    return paths


def chrome_trace(timeline: RoundTimeline, name: str = "round") -> dict[str, Any]:
    """Chrome-trace JSON (open in Perfetto / chrome://tracing): one track per group, one for the trainer."""
    us = 1e6
    ev: list[dict[str, Any]] = [
        {"ph": "M", "pid": 1, "name": "process_name", "args": {"name": f"{name}: rollout groups"}},
        {"ph": "M", "pid": 2, "name": "process_name", "args": {"name": f"{name}: trainer"}},
    ]
    for g in timeline.groups:
        ev.append({"ph": "M", "pid": 1, "tid": g["order"], "name": "thread_name",
                   "args": {"name": f"group {g['order']}"}})
        for label, a, b in _group_phases(g):
            ev.append({"ph": "X", "pid": 1, "tid": g["order"], "name": label, "ts": a * us, "dur": (b - a) * us})
    for iv in timeline.intervals:
        ev.append({"ph": "X", "pid": 2, "tid": 0, "name": f"{iv.kind} {_steps_label(iv)}", "ts": iv.start * us,
                   "dur": (iv.end - iv.start) * us, "args": {"groups": list(iv.group_ids)}})
    if timeline.publish:
        a, b = timeline.publish
        ev.append({"ph": "X", "pid": 2, "tid": 1, "name": "publish weights", "ts": a * us, "dur": (b - a) * us})
    return {"traceEvents": ev, "displayTimeUnit": "ms"}


def _group_phases(group: dict[str, Any]) -> list[tuple[str, float, float]]:
    t, out = group["times"], []
    for label, a, b, _ in _PHASES:
        ends = (b,) if isinstance(b, str) else b
        end = next((t[e] for e in ends if e in t), None)
        if a in t and end is not None:
            out.append((label, t[a], end))
    if group.get("reward_s") and "serving_complete" in t:
        out.append((_REWARD_CALL[0], t["serving_complete"] - group["reward_s"], t["serving_complete"]))
    return out


def _steps_label(iv: TrainerInterval) -> str:
    return f"step {iv.step_index}" if iv.steps == 1 else f"steps {iv.step_index}-{iv.step_index + iv.steps - 1}"


def plot_gantt(timelines: list[RoundTimeline], labels: list[str], path: str | Path) -> Path:
    """Stacked Gantt charts (one panel per timeline, shared time axis from each round's first admission)."""
    import matplotlib  # lazy: a run that draws no chart never loads it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    fig, axes = plt.subplots(len(timelines), 1, figsize=(11, 2.2 + 2.4 * len(timelines)), squeeze=False,
                             sharex=True)
    colors = {label: c for label, _, _, c in _PHASES} | {_REWARD_CALL[0]: _REWARD_CALL[1]}
    for ax, tl, label in zip(axes[:, 0], timelines, labels, strict=False):
        admits = [g["times"]["admitted"] for g in tl.groups if "admitted" in g["times"]]
        t0 = min(admits) if admits else 0.0
        n = len(tl.groups)
        for g in tl.groups:
            for phase, a, b in _group_phases(g):
                slim = phase == _REWARD_CALL[0]  # over the end of "generating"
                ax.barh(g["order"] + 1, b - a, left=a - t0, color=colors[phase], height=0.4 if slim else 0.8)
        for iv in tl.intervals:
            ax.barh(0, iv.end - iv.start, left=iv.start - t0, color="#8c1c13" if iv.kind == "train" else "#999",
                    height=0.8, edgecolor="white", linewidth=0.5)
        if tl.publish:
            ax.barh(0, tl.publish[1] - tl.publish[0], left=tl.publish[0] - t0, color="#ffbf00", height=0.8)
        ax.set_yticks([0] + ([1, n] if n else []))
        ax.set_yticklabels(["trainer"] + (["group 0", f"group {n - 1}"] if n else []))
        ax.invert_yaxis()
        m = tl.metrics()
        ax.set_title(f"{label}: rollout_to_train_end {m.get(PREFIX + 'rollout_to_train_end_s', math.nan):.2f}s, "
                     f"trainer wait {100 * m.get(PREFIX + 'trainer_wait_ratio', math.nan):.0f}%", fontsize=10)
    axes[-1, 0].set_xlabel("seconds since the round's first admission")
    handles = [Patch(color=c, label=lbl) for lbl, _, _, c in _PHASES]
    if any(g.get("reward_s") for tl in timelines for g in tl.groups):
        handles.append(Patch(color=_REWARD_CALL[1], label=_REWARD_CALL[0]))
    handles += [Patch(color="#8c1c13", label="trainer busy"), Patch(color="#ffbf00", label="publish")]
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=8)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)

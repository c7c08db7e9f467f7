"""RoundTimeline: what happened in one round, on a real or simulated clock, and the metrics of architecture.md §4.

Group times come from the ledger (every transition is stamped there); the trainer's busy intervals and the weight
publication are recorded here. A timeline round-trips through JSON (``to_dict`` / ``from_dict``), which is what the
simulator calibrates from.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .clock import Clock
from .ledger import GroupLedger, GroupState

PREFIX = "rolloutpipe/"
_ROLLOUT_DONE = (GroupState.MATERIALIZED.value, GroupState.FILTERED.value)


@dataclass(frozen=True)
class TrainerInterval:
    """The trainer was computing from ``start`` to ``end`` on ``group_ids`` (of optimizer step ``step_index``, and
    of the ``steps - 1`` after it when one call trains several steps: ``sync``'s whole round)."""

    start: float
    end: float
    step_index: int
    group_ids: tuple[int, ...] = ()
    kind: str = "train"
    steps: int = 1

    @property
    def step_indices(self) -> range:
        return range(self.step_index, self.step_index + self.steps)


class RoundTimeline:
    def __init__(self, ledger: GroupLedger | None, clock: Clock | None = None,
                 settings: dict[str, Any] | None = None) -> None:
        self.ledger = ledger
        # the round's shape as configured (R, K, U, F_w, mode, fgd_strength): what a reader of the JSON -- e.g.
        # ``sim --from-run`` -- needs to replay the round
        self.settings: dict[str, Any] = dict(settings or {})
        self.clock = clock or (ledger.clock if ledger else None)
        self.intervals: list[TrainerInterval] = []
        self.publish: tuple[float, float] | None = None
        self._groups: list[dict[str, Any]] | None = None  # set when loaded from JSON

    # ---- recording ---------------------------------------------------------------------------------------------
    def trainer_busy(self, start: float, end: float, step_index: int, group_ids: tuple[int, ...] = (),
                     kind: str = "train", steps: int = 1) -> None:
        if end < start:
            raise ValueError(f"trainer interval ends before it starts: {start} > {end}")
        if steps < 1:
            raise ValueError(f"a trainer interval covers at least one optimizer step, got steps={steps}")
        self.intervals.append(TrainerInterval(start, end, step_index, tuple(group_ids), kind, steps))

    def calls_per_step(self) -> list[int]:
        """Trainer calls that trained groups, per optimizer step (1 each when a step is trained in one call, and
        when a whole round is: that call counts for each of its steps)."""
        steps = [s for iv in self.intervals if iv.kind == "train" and iv.group_ids for s in iv.step_indices]
        return [steps.count(s) for s in range(max(steps) + 1)] if steps else []

    def trainer_calls(self) -> int:
        """Trainer calls that trained groups in the round."""
        return sum(1 for iv in self.intervals if iv.kind == "train" and iv.group_ids)

    def seconds_per_step(self, kind: str | None = "train") -> dict[int, float]:
        """Trainer seconds by optimizer step; a call over several steps is shared evenly between them (its steps
        are the same shape: U groups each)."""
        out: dict[int, float] = {}
        for iv in self.intervals:
            if kind is None or iv.kind == kind:
                for s in iv.step_indices:
                    out[s] = out.get(s, 0.0) + (iv.end - iv.start) / iv.steps
        return out

    def published(self, start: float, end: float) -> None:
        self.publish = (start, end)

    # ---- data --------------------------------------------------------------------------------------------------
    @property
    def groups(self) -> list[dict[str, Any]]:
        if self._groups is not None:
            return self._groups
        assert self.ledger is not None
        return [
            {"order": g.order, "state": g.state.value, "step_index": g.step_index, "resends": g.resends,
             "times": dict(g.times)}
            for g in self.ledger.groups
        ]

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": self.ledger.version if self.ledger else None,
            "settings": self.settings,
            "groups": self.groups,
            "intervals": [asdict(iv) for iv in self.intervals],
            "publish": list(self.publish) if self.publish else None,
            "metrics": self.metrics(),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RoundTimeline:
        tl = cls(None, settings=data.get("settings"))
        tl._groups = data["groups"]
        tl.intervals = [TrainerInterval(**{**iv, "group_ids": tuple(iv["group_ids"])}) for iv in data["intervals"]]
        tl.publish = tuple(data["publish"]) if data.get("publish") else None
        return tl

    # ---- metrics -----------------------------------------------------------------------------------------------
    def _times(self, state: str) -> list[float]:
        return [g["times"][state] for g in self.groups if state in g["times"]]

    def metrics(self) -> dict[str, float]:
        """architecture.md §4, seconds relative to the first admission of the round."""
        admits = self._times(GroupState.ADMITTED.value)
        if not admits or not self.intervals:
            return {}
        t0 = min(admits)
        train_end = max(iv.end for iv in self.intervals)
        window = train_end - t0
        busy = sum(max(0.0, min(iv.end, train_end) - max(iv.start, t0)) for iv in self.intervals)
        t_train = sum(iv.end - iv.start for iv in self.intervals)
        rollout_done = [g["times"][s] for g in self.groups for s in _ROLLOUT_DONE if s in g["times"]]
        t_rollout = max(rollout_done) - t0
        materialized = self._times(GroupState.MATERIALIZED.value)
        first_ready = (min(materialized) - t0) if materialized else math.nan
        per_step = self.seconds_per_step(kind=None)
        t_last_step = per_step[max(per_step)]
        ideal = max(t_rollout + t_last_step, first_ready + t_train)
        serial = t_rollout + t_train
        wait = max(0.0, window - busy)
        counts = {s: sum(1 for g in self.groups if g["state"] == s) for s in (GroupState.FILTERED.value,)}
        m = {
            "rollout_to_train_end_s": window,
            "trainer_wait_ratio": wait / window if window > 0 else 0.0,
            "trainer_wait_s": wait,
            "trainer_busy_s": t_train,
            "trainer_wait_before_first_s": min(iv.start for iv in self.intervals) - t0,
            "first_dispatch_s": first_ready,
            "rollout_s": t_rollout,
            "ideal_s": ideal,
            "serial_estimate_s": serial,
            "overlap_efficiency": (serial - window) / (serial - ideal) if serial - ideal > 1e-9 else math.nan,
            "groups_trained": float(sum(len(iv.group_ids) for iv in self.intervals if iv.kind == "train")),
            "trainer_calls": float(self.trainer_calls()),
            "groups_filtered": float(counts[GroupState.FILTERED.value]),
            # groups whose requests died with a rollout replica and were generated again (trained once)
            "groups_resent": float(sum(1 for g in self.groups if g.get("resends"))),
        }
        if self.publish:
            m["publish_s"] = self.publish[1] - self.publish[0]
        return {**{PREFIX + k: float(v) for k, v in m.items()}, **self.wait_breakdown()}

    def wait_breakdown(self) -> dict[str, float]:
        """The trainer's waiting in the rollout-to-train-end window, by cause: before the first trainable group
        (``wait_no_group_yet_s``), later while groups of the round were still generating
        (``wait_groups_generating_s``: the rollout is the bottleneck), and after the last group was in
        (``wait_after_rollout_s``: the driver's own latency -- materialize, dispatch)."""
        admits = self._times(GroupState.ADMITTED.value)
        if not admits or not self.intervals:
            return {}
        t0 = min(admits)
        rollout_done = max(g["times"][s] for g in self.groups for s in _ROLLOUT_DONE if s in g["times"])
        ivs = sorted(self.intervals, key=lambda iv: iv.start)
        before = max(0.0, ivs[0].start - t0)
        generating = after = 0.0
        busy_until = ivs[0].end
        for iv in ivs[1:]:
            gap_start, gap_end = busy_until, iv.start
            if gap_end > gap_start:
                generating += max(0.0, min(gap_end, rollout_done) - gap_start)
                after += max(0.0, gap_end - max(gap_start, rollout_done))
            busy_until = max(busy_until, iv.end)
        return {PREFIX + "wait_no_group_yet_s": before, PREFIX + "wait_groups_generating_s": generating,
                PREFIX + "wait_after_rollout_s": after}

    # ---- outputs -----------------------------------------------------------------------------------------------
    def chrome_trace(self, name: str = "round") -> dict[str, Any]:
        """Chrome-trace JSON (open in Perfetto / chrome://tracing): one track per group, one for the trainer."""
        us = 1e6
        ev: list[dict[str, Any]] = [
            {"ph": "M", "pid": 1, "name": "process_name", "args": {"name": f"{name}: rollout groups"}},
            {"ph": "M", "pid": 2, "name": "process_name", "args": {"name": f"{name}: trainer"}},
        ]
        for g in self.groups:
            t = g["times"]
            ev.append({"ph": "M", "pid": 1, "tid": g["order"], "name": "thread_name",
                       "args": {"name": f"group {g['order']}"}})
            for label, a, b in _group_phases(t):
                ev.append({"ph": "X", "pid": 1, "tid": g["order"], "name": label, "ts": a * us, "dur": (b - a) * us})
        for iv in self.intervals:
            ev.append({"ph": "X", "pid": 2, "tid": 0, "name": f"{iv.kind} {_steps_label(iv)}", "ts": iv.start * us,
                       "dur": (iv.end - iv.start) * us, "args": {"groups": list(iv.group_ids)}})
        if self.publish:
            a, b = self.publish
            ev.append({"ph": "X", "pid": 2, "tid": 1, "name": "publish weights", "ts": a * us, "dur": (b - a) * us})
        return {"traceEvents": ev, "displayTimeUnit": "ms"}

    def write(self, out_dir: str | Path, stem: str, png: bool = True) -> list[Path]:
        """Write ``stem.json`` (this timeline), ``stem.trace.json`` (Chrome trace) and, if ``png``, ``stem.png``
        (Gantt; ~0.15 s of matplotlib, so a trainer may draw only some rounds)."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        paths = [out / f"{stem}.json", out / f"{stem}.trace.json"]
        paths[0].write_text(json.dumps(self.to_dict(), indent=1))
        paths[1].write_text(json.dumps(self.chrome_trace(stem)))
        if png:
            paths.append(plot_gantt([self], [stem], out / f"{stem}.png"))
        return paths


_PHASES = (
    ("queued", "submitted", "admitted", "#d9d9d9"),
    ("generating", "admitted", "serving_complete", "#4c72b0"),
    ("reward+advantage", "serving_complete", ("materialized", "filtered"), "#dd8452"),
    ("in FIFO", "materialized", "dispatched", "#c7e9c0"),
    ("training", "dispatched", "consumed", "#55a868"),
)


def _group_phases(t: dict[str, float]) -> list[tuple[str, float, float]]:
    out = []
    for label, a, b, _ in _PHASES:
        ends = (b,) if isinstance(b, str) else b
        end = next((t[e] for e in ends if e in t), None)
        if a in t and end is not None:
            out.append((label, t[a], end))
    return out


def plot_gantt(timelines: list[RoundTimeline], labels: list[str], path: str | Path) -> Path:
    """Stacked Gantt charts (one panel per timeline, shared time axis from each round's first admission)."""
    import matplotlib  # lazy: the pipeline package stays import-light

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    fig, axes = plt.subplots(len(timelines), 1, figsize=(11, 2.2 + 2.4 * len(timelines)), squeeze=False,
                             sharex=True)
    colors = {label: c for label, _, _, c in _PHASES}
    for ax, tl, label in zip(axes[:, 0], timelines, labels, strict=False):
        admits = tl._times("admitted")
        t0 = min(admits) if admits else 0.0
        n = len(tl.groups)
        for g in tl.groups:
            for phase, a, b in _group_phases(g["times"]):
                ax.barh(g["order"] + 1, b - a, left=a - t0, color=colors[phase], height=0.8)
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
    handles += [Patch(color="#8c1c13", label="trainer busy"), Patch(color="#ffbf00", label="publish")]
    fig.legend(handles=handles, loc="lower center", ncol=7, fontsize=8)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


def _steps_label(iv: TrainerInterval) -> str:
    return f"step {iv.step_index}" if iv.steps == 1 else f"steps {iv.step_index}-{iv.step_index + iv.steps - 1}"

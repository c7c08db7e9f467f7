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
             "version": g.version, "trained_version": g.trained_version, "reward_s": g.reward_s,
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

    def _rollout_end(self) -> tuple[float, dict[str, Any]]:
        """When the round's rollout ended (its last group materialized or filtered) and that group."""
        return max(((max(g["times"][s] for s in _ROLLOUT_DONE if s in g["times"]), g) for g in self.groups
                    if any(s in g["times"] for s in _ROLLOUT_DONE)), key=lambda done: done[0])

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
        rollout_end, last = self._rollout_end()
        t_rollout = rollout_end - t0
        # the round's rollout ends with its last group: when that group was let in (FGD can admit it late) and how
        # long it then took are the two parts of T_rollout
        last_admitted = last["times"].get(GroupState.ADMITTED.value, t0) - t0
        materialized = self._times(GroupState.MATERIALIZED.value)
        first_ready = (min(materialized) - t0) if materialized else math.nan
        per_step = self.seconds_per_step(kind=None)
        last_step = max(per_step)
        # the last step's trainer work that had to wait for the rollout's end: with train_unit=groups, its calls on
        # groups that came earlier ran during the rollout and are no part of the bound (counting them put ideal_s
        # above what groups rounds achieved); with step and steps the step's calls all start after its last group
        after = [(iv.end - iv.start) / iv.steps for iv in self.intervals
                 if last_step in iv.step_indices and iv.start >= rollout_end - 1e-9]
        t_last_step = sum(after) if after else per_step[last_step]
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
            "last_group_admitted_s": last_admitted,
            "ideal_s": ideal,
            "serial_estimate_s": serial,
            "overlap_efficiency": (serial - window) / (serial - ideal) if serial - ideal > 1e-9 else math.nan,
            "groups_trained": float(sum(len(iv.group_ids) for iv in self.intervals if iv.kind == "train")),
            "trainer_calls": float(self.trainer_calls()),
            "groups_filtered": float(counts[GroupState.FILTERED.value]),
            # groups whose requests died with a rollout replica and were generated again (trained once)
            "groups_resent": float(sum(1 for g in self.groups if g.get("resends"))),
        }
        lags = [g["trained_version"] - g["version"] for g in self.groups if g.get("trained_version") is not None]
        if lags:  # weight versions between a group's generation and its training: 0 on-policy (the ledger enforces it)
            m["max_version_lag"] = max(lags)
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
        rollout_done, _ = self._rollout_end()
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

    # ---- output ------------------------------------------------------------------------------------------------
    def write_json(self, out_dir: str | Path, stem: str) -> Path:
        """``stem.json``: this timeline (``from_dict`` reads it back; ``drawing.write_timeline`` adds the trace and
        the Gantt chart)."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        path = out / f"{stem}.json"
        path.write_text(json.dumps(self.to_dict(), indent=1))
        return path

"""GroupLedger: the state of every group of one round, and the invariants that keep the round on-policy.

A round generates groups with one weight version ``v``. Each group walks

    submitted -> admitted -> serving_complete -> materialized -> dispatched -> consumed
                                              \\-> filtered

and every transition is checked here, so a driver bug raises at once instead of silently training on the wrong data.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, field

from .clock import Clock, MonotonicClock


class PipelineInvariantError(RuntimeError):
    """A transition that would break the on-policy contract (architecture.md §2) or lose/duplicate a group."""


class PipelineStallError(PipelineInvariantError):
    """No group changed state for longer than the watchdog allows."""


class RoundAbortedError(RuntimeError):
    """A round could not complete (a worker died, the rollout failed); none of it was published, so the last
    checkpoint at a round boundary is still valid and resuming restarts this round."""


class GroupState(enum.Enum):
    SUBMITTED = "submitted"
    ADMITTED = "admitted"
    SERVING_COMPLETE = "serving_complete"
    MATERIALIZED = "materialized"
    FILTERED = "filtered"
    DISPATCHED = "dispatched"
    CONSUMED = "consumed"


# state -> the states it may move to
_NEXT: dict[GroupState, tuple[GroupState, ...]] = {
    GroupState.SUBMITTED: (GroupState.ADMITTED,),
    GroupState.ADMITTED: (GroupState.SERVING_COMPLETE,),
    GroupState.SERVING_COMPLETE: (GroupState.MATERIALIZED, GroupState.FILTERED),
    GroupState.MATERIALIZED: (GroupState.DISPATCHED,),
    GroupState.DISPATCHED: (GroupState.CONSUMED,),
    GroupState.FILTERED: (),
    GroupState.CONSUMED: (),
}
_TRAINABLE = (GroupState.MATERIALIZED, GroupState.DISPATCHED, GroupState.CONSUMED)
_BUFFERED = (GroupState.ADMITTED, GroupState.SERVING_COMPLETE, GroupState.MATERIALIZED, GroupState.DISPATCHED)
_FINAL_FOR_ROLLOUT = _TRAINABLE + (GroupState.FILTERED,)


@dataclass
class GroupRecord:
    """One prompt group. ``order`` is its submission (data) order inside the round and also its id."""

    order: int
    version: int
    group_size: int
    state: GroupState = GroupState.SUBMITTED
    finished_requests: int = 0
    resends: int = 0  # times its requests were lost with a rollout replica and sent again
    step_index: int | None = None
    trained_version: int | None = None  # the trainer's weight version when it consumed the group (= version)
    # seconds of its slowest response's reward call, scored on the rollout side before the group came back (the
    # reward guard measures each call; None when the guard is off)
    reward_s: float | None = None
    times: dict[str, float] = field(default_factory=dict)

    @property
    def group_id(self) -> int:
        return self.order


class GroupLedger:
    """All groups of one round generated with weight version ``version``.

    The round wants ``num_groups`` (R) trainable groups of ``group_size`` (K) responses. A filtered group (dynamic
    sampling) is replaced by the next group in data order, at most ``max_extra_groups`` times; after that the round
    ends short and :attr:`short_by` says by how many groups.
    """

    def __init__(
        self,
        version: int,
        num_groups: int,
        group_size: int,
        max_extra_groups: int = 0,
        clock: Clock | None = None,
        max_buffered_groups: int | None = None,
    ) -> None:
        if num_groups < 1 or group_size < 1 or max_extra_groups < 0:
            raise ValueError(f"bad round shape: R={num_groups} K={group_size} max_extra_groups={max_extra_groups}")
        if max_buffered_groups is not None and max_buffered_groups < 1:
            raise ValueError(f"max_buffered_groups must be >= 1 or None, got {max_buffered_groups}")
        # bounded memory: at most this many groups between admission and consumption (None: no bound)
        self.max_buffered_groups = max_buffered_groups
        self.version = version
        self.num_groups = num_groups
        self.group_size = group_size
        self.max_extra_groups = max_extra_groups
        self.clock = clock or MonotonicClock()
        self.groups: list[GroupRecord] = []
        self.materialization_order: list[int] = []
        self.published = False
        self.last_transition_t = self.clock.now()
        for _ in range(num_groups):
            self._submit()

    # ---- transitions -------------------------------------------------------------------------------------------
    def _submit(self) -> GroupRecord:
        rec = GroupRecord(order=len(self.groups), version=self.version, group_size=self.group_size)
        rec.times[GroupState.SUBMITTED.value] = self.clock.now()
        self.groups.append(rec)
        return rec

    def _move(self, group_id: int, to: GroupState) -> GroupRecord:
        rec = self.group(group_id)
        if to not in _NEXT[rec.state]:
            raise PipelineInvariantError(
                f"group {group_id} (version {rec.version}) cannot go {rec.state.value} -> {to.value}"
            )
        rec.state = to
        rec.times[to.value] = self.last_transition_t = self.clock.now()
        return rec

    def admit(self, group_id: int) -> None:
        """All K requests of the group may now enter the rollout engine."""
        self._move(group_id, GroupState.ADMITTED)

    def finish_request(self, group_id: int) -> bool:
        """One response of the group finished decoding; True when that completes the group."""
        rec = self.group(group_id)
        if rec.state is not GroupState.ADMITTED:
            raise PipelineInvariantError(f"response for group {group_id} in state {rec.state.value}")
        rec.finished_requests += 1
        self.last_transition_t = self.clock.now()
        if rec.finished_requests > rec.group_size:
            raise PipelineInvariantError(f"group {group_id} got more than K={rec.group_size} responses")
        if rec.finished_requests == rec.group_size:
            self._move(group_id, GroupState.SERVING_COMPLETE)
            return True
        return False

    def resend(self, group_id: int) -> None:
        """The group's requests were lost (their rollout replica died) before the group completed: nothing of it
        reached the FIFO, so it is generated again from scratch -- still once, still with weights v."""
        rec = self.group(group_id)
        if rec.state is not GroupState.ADMITTED:
            raise PipelineInvariantError(f"group {group_id} cannot be re-sent from {rec.state.value}")
        rec.finished_requests = 0
        rec.resends += 1
        rec.times[f"resent_{rec.resends}"] = self.last_transition_t = self.clock.now()

    @property
    def groups_resent(self) -> int:
        return sum(1 for g in self.groups if g.resends)

    def complete_serving(self, group_id: int) -> None:
        """All K responses arrived together (the rollout client returns whole groups)."""
        rec = self.group(group_id)
        while rec.state is GroupState.ADMITTED:
            self.finish_request(group_id)
        if rec.state is not GroupState.SERVING_COMPLETE:
            raise PipelineInvariantError(f"group {group_id} cannot complete serving from {rec.state.value}")

    def materialize(self, group_id: int) -> None:
        """Rewarded, advantages computed: the group is trainable and enters the FIFO."""
        self._move(group_id, GroupState.MATERIALIZED)
        self.materialization_order.append(group_id)

    def filter(self, group_id: int) -> GroupRecord | None:
        """Drop the group (e.g. zero reward variance). Returns the replacement group, if the cap allows one."""
        self._move(group_id, GroupState.FILTERED)
        if self.extra_groups_used < self.max_extra_groups:
            return self._submit()
        return None

    def stop_replacements(self) -> None:
        """No more prompts to replace filtered groups with (the data ran out): later filtered groups leave the
        round short instead."""
        self.max_extra_groups = self.extra_groups_used

    def dispatch(self, group_id: int, step_index: int) -> None:
        rec = self._move(group_id, GroupState.DISPATCHED)
        rec.step_index = step_index

    def consume(self, group_ids: Iterable[int], trainer_version: int) -> None:
        """The trainer has trained on these groups. Only legal while it holds this round's weights."""
        for gid in group_ids:
            rec = self.group(gid)
            if rec.version != trainer_version:
                raise PipelineInvariantError(
                    f"off-policy: group {gid} was generated with weights v{rec.version}, "
                    f"trainer is at v{trainer_version}"
                )
            self._move(gid, GroupState.CONSUMED)
            rec.trained_version = trainer_version

    def mark_published(self) -> None:
        """Weights v+1 may leave the trainer only when nothing of round v is still to be trained."""
        pending = [g.order for g in self.groups if g.state not in (GroupState.CONSUMED, GroupState.FILTERED)]
        if pending:
            raise PipelineInvariantError(
                f"cannot publish weights v{self.version + 1}: groups {pending[:8]} of round v{self.version} "
                "are not consumed or filtered"
            )
        self.published = True

    # ---- queries -----------------------------------------------------------------------------------------------
    def group(self, group_id: int) -> GroupRecord:
        if not 0 <= group_id < len(self.groups):
            raise PipelineInvariantError(f"unknown group {group_id} (round has {len(self.groups)})")
        return self.groups[group_id]

    def in_state(self, *states: GroupState) -> list[GroupRecord]:
        return [g for g in self.groups if g.state in states]

    def outstanding(self) -> dict[str, list[int]]:
        """Groups not yet consumed or filtered, by state (what a stall report shows)."""
        out: dict[str, list[int]] = {}
        for g in self.groups:
            if g.state not in (GroupState.CONSUMED, GroupState.FILTERED):
                out.setdefault(g.state.value, []).append(g.order)
        return out

    @property
    def buffered(self) -> int:
        """Groups whose requests or rows are held now: admitted, generated, waiting in the FIFO or in training."""
        return len(self.in_state(*_BUFFERED))

    def admission_budget(self) -> int:
        """How many more groups admission may let in (back-pressure from the FIFO and the trainer)."""
        if self.max_buffered_groups is None:
            return len(self.groups)
        return max(0, self.max_buffered_groups - self.buffered)

    def check_progress(self, stall_timeout_s: float | None) -> None:
        """Stall watchdog: raise, naming every outstanding group and its state, if nothing moved for too long."""
        idle = self.clock.now() - self.last_transition_t
        if stall_timeout_s is not None and stall_timeout_s > 0 and idle > stall_timeout_s:
            detail = "; ".join(f"{state}: {ids}" for state, ids in self.outstanding().items())
            raise PipelineStallError(
                f"round v{self.version}: no group changed state for {idle:.0f}s (rolloutpipe.stall_timeout_s="
                f"{stall_timeout_s:g}); outstanding groups by state: {detail}"
            )

    def counts(self) -> dict[str, int]:
        out = {s.value: 0 for s in GroupState}
        for g in self.groups:
            out[g.state.value] += 1
        assert sum(out.values()) == len(self.groups)
        return out

    @property
    def extra_groups_used(self) -> int:
        return len(self.groups) - self.num_groups

    @property
    def num_trainable(self) -> int:
        return len(self.in_state(*_TRAINABLE))

    @property
    def rollout_closed(self) -> bool:
        """No group is still being generated or rewarded: the round's data is final."""
        return all(g.state in _FINAL_FOR_ROLLOUT for g in self.groups)

    @property
    def short_by(self) -> int:
        """Trainable groups the round misses because the filter cap was hit (0 while the round can still fill)."""
        return max(0, self.num_groups - self.num_trainable) if self.rollout_closed else 0

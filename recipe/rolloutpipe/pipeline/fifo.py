"""CGP: the FIFO of materialized groups the trainer consumes, and where the optimizer steps fall.

The FIFO is a cursor over the ledger's materialization order, so a group cannot be queued twice or skipped.
Mode ``sync`` is the serial baseline on the same code path: nothing is released until the round's data is final,
and then -- when the trainer takes whole steps -- the whole round in one dispatch, as verl's trainer updates a round
in one call (R/U optimizer steps inside it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .ledger import GroupLedger, PipelineInvariantError
from .modes import Mode

DispatchMode = Literal["sync", "cgp"]


@dataclass(frozen=True)
class Dispatch:
    """Whole groups handed to the trainer in one call. ``ends_step``: take the optimizer step after training them.
    ``steps``: the optimizer steps the groups belong to, ``step_index`` onwards (more than one only for a whole
    round in one call: each of its steps but the last closes inside the call)."""

    group_ids: tuple[int, ...]
    step_index: int
    ends_step: bool
    version: int
    steps: int = 1

    @property
    def steps_closed(self) -> int:
        """Optimizer steps taken by the call that trains this dispatch."""
        return self.steps - 1 + int(self.ends_step)

    @property
    def training_order(self) -> tuple[int, ...]:
        """The order to train the dispatched groups in: submission order within each optimizer step, so a step's
        numbers do not depend on the order its groups finished in (the update is the same sum; only float summation
        order would differ). A call over several steps (all whole) keeps each step's groups in that step."""
        if self.steps == 1:
            return tuple(sorted(self.group_ids))
        size = len(self.group_ids) // self.steps
        return tuple(g for s in range(self.steps) for g in sorted(self.group_ids[s * size: (s + 1) * size]))


def dispatch_mode_of(mode: str) -> DispatchMode:
    """The FIFO release rule of a RolloutPipe mode: ``sync`` waits for the whole round; every other mode is CGP."""
    return "sync" if mode == Mode.SYNC else "cgp"


def trains_after_first_step(mode: str, whole_step: bool, num_groups: int, step_groups: int,
                            may_end_short: bool) -> bool:
    """Does a trainer call of the round come after its first optimizer step (so its π_old needs the round-start
    weights kept aside)? Not when the round has one step, nor when ``take`` releases the whole round in one call
    (``sync`` with whole steps) -- unless filtering can leave the round short: its short last step is a call after."""
    if step_groups >= num_groups:
        return False
    return not (dispatch_mode_of(mode) == "sync" and whole_step) or may_end_short


class CompleteGroupFIFO:
    """Releases materialized groups in materialization order, never across an optimizer-step boundary.

    ``step_groups`` (U) is the number of groups per optimizer step, the same boundary a serial run has. If the round
    ends short (filter cap hit), its last step has fewer groups.
    """

    def __init__(self, ledger: GroupLedger, mode: DispatchMode, step_groups: int) -> None:
        if mode not in ("sync", "cgp"):
            raise ValueError(f"dispatch mode must be 'sync' or 'cgp', got {mode!r}")
        if step_groups < 1:
            raise ValueError(f"step_groups (U) must be >= 1, got {step_groups}")
        self.ledger = ledger
        self.mode = mode
        self.step_groups = step_groups
        self._cursor = 0  # groups dispatched so far (index into materialization_order)
        self._step_open = False  # groups of the current step were dispatched without ``ends_step``

    @property
    def num_dispatched(self) -> int:
        return self._cursor

    def __len__(self) -> int:
        """Groups materialized but not yet dispatched (held back in sync mode, too)."""
        return len(self.ledger.materialization_order) - self._cursor

    def releasable(self) -> int:
        if self.mode == "sync" and not self.ledger.rollout_closed:
            return 0
        return len(self)

    def has_work(self) -> bool:
        """``take()`` would return a dispatch now (ignoring ``whole_step``)."""
        return self.releasable() > 0 or self.pending_step_end

    @property
    def exhausted(self) -> bool:
        """Every trainable group of the round has been dispatched (and its step closed)."""
        return self.ledger.rollout_closed and self._cursor == self.ledger.num_trainable

    @property
    def pending_step_end(self) -> bool:
        """The round closed short with a step still open: ``take()`` returns the empty closing dispatch."""
        return self._step_open and self.exhausted

    def _dispatch_order(self) -> list[int]:
        """cgp: arrival (materialization) order. sync: submission order -- the serial baseline trains the round in
        data order, as verl does, whatever order its groups finished in (it releases only when all are in)."""
        mat = self.ledger.materialization_order
        return sorted(mat) if self.mode == "sync" else mat

    def _left_in_step(self) -> int:
        return self.step_groups - self._cursor % self.step_groups

    def take(self, max_groups: int | None = None, whole_step: bool = False,
             ready_steps: bool = False) -> Dispatch | None:
        """Next groups for the trainer, or None if none may go now.

        ``max_groups`` caps the call (a micro-batch of groups); ``whole_step`` waits until the rest of the current
        optimizer step is available, so the trainer can do one call per step (cheaper on Ray) -- in ``sync`` mode
        the whole round's steps in one call (``_whole_round``); with ``ready_steps`` every whole step already
        materialized goes in that one call (a trainer that fell behind catches up in one call instead of one per
        step; the step boundaries stay where they are). If the round closes short while a step is open (its
        last groups were filtered), one empty dispatch with ``ends_step`` says "take that step now".
        """
        if max_groups is not None and max_groups < 1:
            raise ValueError(f"max_groups must be >= 1, got {max_groups}")
        avail = self.releasable()
        if avail == 0:
            if self._step_open and self.exhausted:
                self._step_open = False
                return Dispatch((), self._cursor // self.step_groups, ends_step=True, version=self.ledger.version)
            return None
        left = self._left_in_step()
        final = self.ledger.rollout_closed  # no more groups will arrive: a short last step is allowed
        if whole_step and avail < left and not final:
            return None
        n = min(avail, left, max_groups or left)
        if whole_step and max_groups is None and (self._whole_round() or (ready_steps and not self._step_open)):
            n = avail - avail % self.step_groups or avail  # whole steps; a short last step alone, after them
        start = self._cursor
        step_index = start // self.step_groups
        ids = tuple(self._dispatch_order()[start : start + n])
        for i, gid in enumerate(ids):
            self.ledger.dispatch(gid, (start + i) // self.step_groups)
        self._cursor += n
        steps = (start + n - 1) // self.step_groups - step_index + 1
        ends_step = self._cursor % self.step_groups == 0 or (final and self._cursor == self.ledger.num_trainable)
        self._step_open = not ends_step
        return Dispatch(group_ids=ids, step_index=step_index, ends_step=ends_step, version=self.ledger.version,
                        steps=steps)

    def _whole_round(self) -> bool:
        """The serial baseline's release: the round's data is final and no step is open, so everything left goes in
        one call, as verl's ``update_actor`` takes a round (one π_old pass, then its R/U mini-batch steps)."""
        return self.mode == "sync" and self.ledger.rollout_closed and not self._step_open

    def check_drained(self) -> None:
        if not self.exhausted:
            raise PipelineInvariantError(
                f"round v{self.ledger.version} ended with {self.ledger.num_trainable - self._cursor} trainable "
                "groups never dispatched"
            )

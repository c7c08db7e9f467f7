"""FGD: which groups' requests enter the rollout engine, and with what priority.

The *frontier* is the ``width`` lowest-order groups that are not yet serving-complete; it refills as they complete.
``hold`` keeps every other group out of the engine; ``priority`` submits everything with a priority value that vLLM's
``scheduling_policy=priority`` serves lowest-first; ``paced`` lets the next ``width`` groups in together, in one call,
once fewer than ``width`` admitted groups are unfinished. Plain FIFO admission (``FifoAdmission``) is the CGP baseline.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from .ledger import GroupLedger, GroupRecord, GroupState
from .modes import ENGINE_WIDTH, FgdStrength, Mode

if TYPE_CHECKING:
    from .timeline import RoundTimeline

_NOT_DONE = (GroupState.SUBMITTED, GroupState.ADMITTED)


@dataclass(frozen=True)
class Admission:
    """Let the K requests of ``group_id`` enter the engine with this priority (lower = earlier)."""

    group_id: int
    priority: int


class AdmissionPolicy(Protocol):
    def admit(self, ledger: GroupLedger) -> list[Admission]:
        """Groups to admit now (marked admitted in the ledger). Call at round start, after each completion and,
        with a buffer bound, after each consumption."""
        ...


def _admit_all(ledger: GroupLedger, records: list[GroupRecord], priority_of_order: bool) -> list[Admission]:
    """Admit ``records`` in order, as far as the ledger's buffer bound allows (the rest stay submitted and are
    offered again on the next call: back-pressure)."""
    out = []
    for rec in records[: ledger.admission_budget()]:
        ledger.admit(rec.order)
        out.append(Admission(rec.order, rec.order if priority_of_order else 0))
    return out


class FifoAdmission:
    """Everything enters at once, engine FCFS: the plain CGP baseline (and what the sync baseline uses)."""

    def admit(self, ledger: GroupLedger) -> list[Admission]:
        return _admit_all(ledger, ledger.in_state(GroupState.SUBMITTED), priority_of_order=False)


class FrontierAdmission:
    """Frontier-group dispatch with a fixed frontier width ``F_w``."""

    def __init__(self, width: int, strength: str) -> None:
        if width < 1:
            raise ValueError(f"frontier width must be >= 1, got {width}")
        if strength not in tuple(FgdStrength):
            raise ValueError(f"fgd strength must be 'hold', 'paced' or 'priority', got {strength!r}")
        self.width = width
        self.strength = strength

    def current_width(self, ledger: GroupLedger) -> int:
        return self.width

    def frontier(self, ledger: GroupLedger) -> list[int]:
        """The F_w lowest-order groups not yet serving-complete."""
        return [g.order for g in ledger.in_state(*_NOT_DONE)[: self.current_width(ledger)]]

    def admit(self, ledger: GroupLedger) -> list[Admission]:
        if self.strength == FgdStrength.PRIORITY:
            # Priorities are fixed when a request enters vLLM, so encode the frontier rank statically as the
            # submission order: whatever the frontier is later, its groups carry the lowest values still waiting.
            return _admit_all(ledger, ledger.in_state(GroupState.SUBMITTED), priority_of_order=True)
        if self.strength == FgdStrength.PACED:
            # Between F_w and 2*F_w - 1 groups unfinished in the engine, topped up a frontier at a time: the engine
            # stays full with one agent-loop call per F_w completions instead of one per completion (hold's), and
            # never holds the whole round at once (priority's up-front cost on the rollout core).
            width = self.current_width(ledger)
            if len(ledger.in_state(GroupState.ADMITTED)) >= width:
                return []
            return _admit_all(ledger, ledger.in_state(GroupState.SUBMITTED)[:width], priority_of_order=True)
        front = set(self.frontier(ledger))
        waiting = [g for g in ledger.in_state(GroupState.SUBMITTED) if g.order in front]
        return _admit_all(ledger, waiting, priority_of_order=True)


class AdaptiveFrontierAdmission(FrontierAdmission):
    """``hold`` with a width that grows to keep the engine's batch full (the paper leaves this as future work).

    A fixed F_w = U starves the engine when a frontier group has a long tail: only its few unfinished sequences
    decode. Here the width is the smallest number of groups whose *unfinished* requests fill ``target_running``
    engine slots, between ``min_width`` (keeps the next step's groups first) and ``max_width``.
    """

    def __init__(self, min_width: int, target_running: int, max_width: int | None = None) -> None:
        super().__init__(min_width, FgdStrength.HOLD)
        if target_running < 1:
            raise ValueError(f"target_running must be >= 1, got {target_running}")
        self.target_running = target_running
        self.max_width = max_width

    def current_width(self, ledger: GroupLedger) -> int:
        width, running = 0, 0
        for g in ledger.in_state(*_NOT_DONE):
            if width >= self.width and running >= self.target_running:
                break
            if self.max_width is not None and width >= self.max_width:
                break
            width += 1
            running += g.group_size - g.finished_requests
        return max(width, 1)


class MeasuredFrontierWidth:
    """``rolloutpipe.frontier_width=auto``: F_w for each round from the previous round's measured times.

    With ``hold``, F_w groups are in the engine at once. Each takes about T_g from admission to its last response
    (the round's median), so they complete at about F_w / T_g groups per second, while the trainer takes U groups
    per optimizer step of S seconds (the round's median step). F_w = ceil(U * T_g / S) is the narrowest frontier that
    keeps the trainer fed: a slow trainer gets U (the next step's groups first, earliest), a fast one a frontier
    wide enough to fill the engine -- up to R, where hold admits like CGP. T_g grows with the width (the engine is
    shared), so the width settles over a few rounds. The first round runs with U.
    """

    def __init__(self, step_groups: int, num_groups: int) -> None:
        self.step_groups = step_groups
        self.num_groups = num_groups
        self.width = step_groups

    def observe(self, timeline: RoundTimeline) -> int:
        """Take a finished round's timeline; returns (and keeps) the next round's width."""
        admitted, served = GroupState.ADMITTED.value, GroupState.SERVING_COMPLETE.value
        serve = [g["times"][served] - g["times"][admitted] for g in timeline.groups
                 if admitted in g["times"] and served in g["times"]]
        step_s = timeline.seconds_per_step()
        if serve and step_s and (step := statistics.median(step_s.values())) > 0:
            wanted = math.ceil(self.step_groups * statistics.median(serve) / step)
            self.width = min(self.num_groups, max(self.step_groups, wanted))
        return self.width


ENGINE_WIDTH_SLOTS_FACTOR = 2


def engine_frontier_width(step_groups: int, num_groups: int, group_size: int, max_num_seqs: int) -> int:
    """``rolloutpipe.frontier_width=engine`` (and ``paced``'s default): a frontier that keeps the engine full.

    ``hold`` with F_w = U leaves most of a saturated engine's slots empty (U*K requests against ``max_num_seqs``), and
    ``priority`` -- everything submitted at once -- pays for the whole round's requests up front on the rollout
    core (agent loop, HTTP server, vLLM's waiting queue), so its first group comes about when FCFS's does (bench:
    docs/results.md: +0.58 / -0.21 / +0.23 s against cgp in three runs). Here the frontier's requests are twice
    the engine's running slots: when part of the frontier is in its long tail, the groups behind it still fill the
    slots until the next completions refill the frontier (refills come per completed group: the driver learns of a
    group, not of a single response). Between U and R.
    """
    wanted = math.ceil(ENGINE_WIDTH_SLOTS_FACTOR * max_num_seqs / group_size)
    return min(num_groups, max(step_groups, wanted))


def resolve_frontier_width(setting: int | str | None, strength: str, step_groups: int, num_groups: int,
                           group_size: int, max_num_seqs: int, multi_turn: bool) -> int | str:
    """The F_w a ``rolloutpipe.frontier_width`` setting means: a number as given; ``engine`` (and null under
    ``paced``) from the engine's slots, or the whole round when trajectories call tools (``multi_turn``); null
    otherwise U; ``auto`` stays ``auto`` (the trainer measures it).

    Why the whole round with tools: a multi-turn trajectory leaves the engine for each tool call, so the rollout
    ends with the trajectory whose turns and tool waits take longest, and a group let in later starts that chain
    later. Measured on the agentic bench (docs/agentic.md): with a frontier sized by the slots, 8 of 10 rounds were
    ended by a group let in 2-5 s late, the rollout 1.21x FCFS's and the cut +17 %; with the whole round (FGD's order
    kept in the engine) the rollout 1.06x FCFS's, the cut +22 %, the first group 1.7 s before FCFS's."""
    if setting == ENGINE_WIDTH or (setting is None and strength == FgdStrength.PACED):
        if multi_turn:
            return num_groups
        return engine_frontier_width(step_groups, num_groups, group_size, max_num_seqs)
    if setting is None:
        return step_groups
    return setting


def make_admission(
    mode: str, frontier_width: int, strength: str, target_running: int | None = None
) -> AdmissionPolicy:
    """The admission policy of a RolloutPipe mode (``sync``, ``cgp``, ``cgp_fgd``, ``cgp_fgd_adaptive``)."""
    if mode in (Mode.SYNC, Mode.CGP):
        return FifoAdmission()
    if mode == Mode.CGP_FGD:
        return FrontierAdmission(frontier_width, strength)
    if mode == Mode.CGP_FGD_ADAPTIVE:
        if target_running is None:
            raise ValueError("cgp_fgd_adaptive needs target_running (the engine's max running sequences)")
        return AdaptiveFrontierAdmission(frontier_width, target_running)
    raise ValueError(f"unknown rolloutpipe mode {mode!r}: use sync, cgp, cgp_fgd or cgp_fgd_adaptive")

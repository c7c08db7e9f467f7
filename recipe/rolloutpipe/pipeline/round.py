"""Round: one round's life in one place -- ledger, CGP FIFO, FGD admission and timeline wired together.

A driver (the real trainer, the simulator, a test) feeds it the few things that happen in a round and asks it what
to do next; the Round keeps the four parts consistent under one lock of its own, so a rollout thread and a trainer
thread may call it concurrently::

    rnd = Round(version, settings, clock)   # settings: a RoundSettings (mode, R, K, U, F_w, strength, unit)
    send(rnd.admit())                       # which groups may enter the engine now (call after any event)
    rnd.served(g)                           # all K responses of group g are in (or request_finished per response)
    rnd.materialized(g)                     # rewarded + advantages: g enters the FIFO
    rnd.filtered(g)                         # dropped by dynamic sampling (its replacement waits for admit())
    d = rnd.next_dispatch()                 # trainer: the next groups to train (blocks; None when drained)
    rnd.trained(d, start, end, trainer_version=v)
    rnd.check_publishable()                 # every group consumed or filtered, or it raises
    rnd.published(start, end)               # weights v+1 went out

Admissions come only from ``admit()``, so the driver decides which thread talks to the engine.
"""

from __future__ import annotations

import threading

from .clock import Clock, MonotonicClock
from .fifo import CompleteGroupFIFO, Dispatch, dispatch_mode_of
from .frontier import Admission, make_admission
from .ledger import GroupLedger
from .settings import RoundSettings
from .timeline import RoundTimeline


class Round:
    def __init__(self, version: int, settings: RoundSettings, clock: Clock | None = None) -> None:
        self.version = version
        self.settings = settings
        self.ledger = GroupLedger(version, settings.num_groups, settings.group_size,
                                  max_extra_groups=settings.max_extra_groups, clock=clock or MonotonicClock(),
                                  max_buffered_groups=settings.max_buffered_groups)
        self.fifo = CompleteGroupFIFO(self.ledger, dispatch_mode_of(settings.mode), settings.step_groups)
        self.admission = make_admission(settings.mode, settings.frontier_width, settings.fgd_strength,
                                        target_running=settings.target_running)
        self.timeline = RoundTimeline(self.ledger, settings=settings.record())
        self._cond = threading.Condition(threading.RLock())
        self._failure: BaseException | None = None

    @property
    def clock(self) -> Clock:
        return self.ledger.clock

    # ---- rollout side ------------------------------------------------------------------------------------------
    def admit(self) -> list[Admission]:
        """Groups that may enter the engine now (marked admitted): FGD's frontier, within the buffer bound."""
        with self._cond:
            return self.admission.admit(self.ledger)

    def request_finished(self, group_id: int) -> bool:
        """One response of the group finished decoding (a driver that sees single responses); True when that
        completes the group."""
        with self._cond:
            return self.ledger.finish_request(group_id)

    def served(self, group_id: int) -> None:
        """All K responses of the group arrived together (a driver that sees whole groups)."""
        with self._cond:
            self.ledger.complete_serving(group_id)

    def materialized(self, group_id: int) -> None:
        """Rewarded, advantages computed: the group is trainable and goes into the FIFO."""
        with self._cond:
            self.ledger.materialize(group_id)
            self._cond.notify_all()

    def filtered(self, group_id: int, replaceable: bool = True) -> bool:
        """Dropped (no reward variance); the next group in data order replaces it while the cap and the data
        (``replaceable``) allow. True if a replacement group was submitted."""
        with self._cond:
            if not replaceable:
                self.ledger.stop_replacements()
            replacement = self.ledger.filter(group_id)
            self._cond.notify_all()
            return replacement is not None

    def resend(self, group_ids: list[int]) -> None:
        """The groups' requests were lost with a rollout replica: they are generated again, same requests."""
        with self._cond:
            for gid in group_ids:
                self.ledger.resend(gid)

    def fail(self, error: BaseException) -> None:
        """The rollout side failed: the trainer side raises it at its next ``next_dispatch``."""
        with self._cond:
            self._failure = error
            self._cond.notify_all()

    @property
    def rollout_closed(self) -> bool:
        """No group is still being generated or rewarded: the round's data is final."""
        with self._cond:
            return self.ledger.rollout_closed

    # ---- trainer side ------------------------------------------------------------------------------------------
    def take(self, whole_step: bool | None = None, max_groups: int | None = None,
             ready_steps: bool | None = None) -> Dispatch | None:
        """The next groups for the trainer if some may go now (never blocks; ``max_groups`` caps the call).
        ``whole_step`` / ``ready_steps`` (``CompleteGroupFIFO.take``) default to what the train unit says."""
        whole_step, ready_steps = self._unit(whole_step, ready_steps)
        with self._cond:
            return self.fifo.take(max_groups=max_groups, whole_step=whole_step, ready_steps=ready_steps)

    def _unit(self, whole_step: bool | None, ready_steps: bool | None) -> tuple[bool, bool]:
        unit = self.settings.train_unit
        return (unit.whole_step if whole_step is None else whole_step,
                unit.ready_steps if ready_steps is None else ready_steps)

    def next_dispatch(self, stall_timeout_s: float | None = None, poll_s: float = 0.5, *,
                      whole_step: bool | None = None, ready_steps: bool | None = None) -> Dispatch | None:
        """Block until the trainer has groups to train; None when every trainable group has been dispatched.
        Raises the rollout side's failure, or a stall error naming the outstanding groups."""
        whole_step, ready_steps = self._unit(whole_step, ready_steps)
        with self._cond:
            while True:
                if self._failure is not None:
                    raise RuntimeError(f"rolloutpipe: rollout side failed in round v{self.version}") \
                        from self._failure
                d = self.fifo.take(whole_step=whole_step, ready_steps=ready_steps)
                if d is not None or self.fifo.exhausted:
                    return d
                self.ledger.check_progress(stall_timeout_s)
                self._cond.wait(timeout=poll_s)

    def trained(self, d: Dispatch, start: float, end: float, trainer_version: int) -> None:
        """The trainer computed on ``d`` from ``start`` to ``end`` with weights ``trainer_version`` (must be the
        round's: anything else is off-policy and raises)."""
        with self._cond:
            self.timeline.trainer_busy(start, end, d.step_index, d.group_ids, steps=d.steps)
            self.ledger.consume(d.group_ids, trainer_version=trainer_version)
            self._cond.notify_all()

    # ---- publication -------------------------------------------------------------------------------------------
    def check_publishable(self) -> None:
        """Before weights v+1 leave the trainer: every trainable group dispatched and consumed, or it raises."""
        with self._cond:
            self.fifo.check_drained()
            self.ledger.mark_published()

    def published(self, start: float, end: float) -> None:
        with self._cond:
            self.timeline.published(start, end)

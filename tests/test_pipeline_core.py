"""Pipeline core: invariants under random schedules (hypothesis) and metrics on hand-computed scenarios."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from recipe.rolloutpipe.pipeline import (
    PREFIX,
    CompleteGroupFIFO,
    FifoAdmission,
    FrontierAdmission,
    GroupLedger,
    GroupState,
    ManualClock,
    PipelineInvariantError,
    PipelineStallError,
    RoundTimeline,
    make_admission,
)


def drive_round(data, R: int, K: int, U: int, mode: str, width: int, strength: str, extra: int, filter_p: float,
                limit: int | None = None, losses: int = 0):
    """Random completion order, random filtering, random trainer pulls, up to ``losses`` groups lost with a dead
    replica mid-generation and re-sent; checks invariants after every event."""
    clock = ManualClock()
    ledger = GroupLedger(version=3, num_groups=R, group_size=K, max_extra_groups=extra, clock=clock,
                         max_buffered_groups=limit)
    fifo = CompleteGroupFIFO(ledger, "sync" if mode == "sync" else "cgp", U)
    admission = make_admission(mode, width, strength)
    in_engine: list[tuple[int, int]] = []  # (group, responses left to finish)
    consumed: list[int] = []
    steps: list[list[int]] = []
    current_step: list[int] = []

    def admit() -> None:
        for a in admission.admit(ledger):
            in_engine.extend([(a.group_id, 0)] * K)

    admit()
    for _ in range(10_000):
        clock.advance_to(clock.now() + 1)
        active = {g for g, _ in in_engine}
        if mode == "cgp_fgd" and strength == "hold":
            assert len(active) <= width
        if limit is not None:
            assert ledger.buffered <= limit
        moves = []
        if in_engine:
            moves.append("finish")
        if fifo.has_work():
            moves.append("train")
        if in_engine and losses:
            moves.append("lose")
        if not moves:
            break
        move = data.draw(st.sampled_from(moves))
        if move == "lose":  # a replica dies with (some of) this group's requests: all K go again
            gid = data.draw(st.sampled_from(sorted({g for g, _ in in_engine})))
            in_engine = [r for r in in_engine if r[0] != gid]
            ledger.resend(gid)
            in_engine.extend([(gid, 0)] * K)
            losses -= 1
        elif move == "finish":
            i = data.draw(st.integers(0, len(in_engine) - 1))
            gid, _ = in_engine.pop(i)
            if ledger.finish_request(gid):
                if data.draw(st.floats(0, 1)) < filter_p:
                    ledger.filter(gid)
                else:
                    ledger.materialize(gid)
                admit()
        else:
            d = fifo.take(max_groups=data.draw(st.integers(1, U + 1)))
            assert d is not None and d.version == 3
            assert d.group_ids or (d.ends_step and current_step)  # an empty dispatch only closes an open step
            ledger.consume(d.group_ids, trainer_version=3)
            admit()  # consumption frees buffer room
            consumed.extend(d.group_ids)
            current_step.extend(d.group_ids)
            if d.ends_step:
                steps.append(current_step)
                current_step = []
        counts = ledger.counts()
        assert sum(counts.values()) == len(ledger.groups)
    return ledger, fifo, consumed, steps, current_step


@settings(max_examples=150, deadline=None)
@given(
    data=st.data(),
    R=st.integers(1, 12),
    K=st.integers(1, 4),
    U=st.integers(1, 5),
    mode=st.sampled_from(["sync", "cgp", "cgp_fgd"]),
    width=st.integers(1, 6),
    strength=st.sampled_from(["hold", "priority"]),
    extra=st.integers(0, 4),
    filter_p=st.sampled_from([0.0, 0.3, 0.7]),
    slack=st.sampled_from([None, 0, 1, 3]),
    losses=st.integers(0, 3),
)
def test_every_group_consumed_exactly_once(data, R, K, U, mode, width, strength, extra, filter_p, slack, losses):
    # a buffer bound of U + slack groups (sync needs the whole round: R + extra)
    limit = None if slack is None else (R + extra if mode == "sync" else U + slack)
    ledger, fifo, consumed, steps, leftover = drive_round(data, R, K, U, mode, width, strength, extra, filter_p,
                                                          limit, losses)
    assert ledger.rollout_closed and fifo.exhausted
    fifo.check_drained()
    assert leftover == []  # the last dispatch always closes a step
    trainable = [g.order for g in ledger.groups if g.state is GroupState.CONSUMED]
    assert sorted(consumed) == sorted(trainable)
    assert len(consumed) == len(set(consumed))
    # cgp: FIFO (arrival) order; sync: the serial baseline trains in submission (data) order
    assert consumed == (sorted(ledger.materialization_order) if mode == "sync" else ledger.materialization_order)
    assert all(len(s) == U for s in steps[:-1]) and (not steps or 1 <= len(steps[-1]) <= U)
    assert not fifo.has_work()
    assert len(trainable) == R - ledger.short_by
    assert ledger.extra_groups_used <= extra
    if ledger.short_by:
        assert ledger.extra_groups_used == extra
    ledger.mark_published()


def test_sync_releases_nothing_until_round_final():
    ledger = GroupLedger(0, num_groups=3, group_size=1, clock=ManualClock())
    fifo = CompleteGroupFIFO(ledger, "sync", step_groups=1)
    FifoAdmission().admit(ledger)
    for gid in (0, 1):
        ledger.complete_serving(gid)
        ledger.materialize(gid)
    assert fifo.releasable() == 0 and fifo.take() is None
    ledger.complete_serving(2)
    ledger.materialize(2)
    assert fifo.releasable() == 3


def test_cgp_releases_at_once_and_respects_step_boundaries():
    ledger = GroupLedger(0, num_groups=4, group_size=2, clock=ManualClock())
    fifo = CompleteGroupFIFO(ledger, "cgp", step_groups=2)
    FifoAdmission().admit(ledger)
    for gid in (2, 0, 3):
        ledger.complete_serving(gid)
        ledger.materialize(gid)
    d1 = fifo.take(max_groups=1)
    assert d1.group_ids == (2,) and d1.step_index == 0 and not d1.ends_step
    d2 = fifo.take()  # 0 and 3 are ready but 3 belongs to step 1
    assert d2.group_ids == (0,) and d2.ends_step
    assert fifo.take(whole_step=True) is None  # step 1 needs group 1 too
    ledger.complete_serving(1)
    ledger.materialize(1)
    d3 = fifo.take(whole_step=True)
    assert d3.group_ids == (3, 1) and d3.step_index == 1 and d3.ends_step


def test_invariants_raise():
    ledger = GroupLedger(5, num_groups=2, group_size=1, clock=ManualClock())
    fifo = CompleteGroupFIFO(ledger, "cgp", step_groups=1)
    with pytest.raises(PipelineInvariantError, match="submitted -> materialized"):
        ledger.materialize(0)
    FifoAdmission().admit(ledger)
    ledger.complete_serving(0)
    with pytest.raises(PipelineInvariantError, match="response for group 0 in state serving_complete"):
        ledger.finish_request(0)  # a K+1-th response
    ledger.materialize(0)
    d = fifo.take()
    with pytest.raises(PipelineInvariantError, match="off-policy"):
        ledger.consume(d.group_ids, trainer_version=6)
    with pytest.raises(PipelineInvariantError, match="dispatched -> dispatched"):
        ledger.dispatch(0, 0)
    with pytest.raises(PipelineInvariantError, match="cannot publish"):
        ledger.mark_published()
    ledger.consume(d.group_ids, trainer_version=5)
    with pytest.raises(PipelineInvariantError, match="never dispatched"):
        fifo.check_drained()


def test_resend_only_while_generating():
    clock = ManualClock()
    ledger = GroupLedger(0, num_groups=2, group_size=2, clock=clock)
    with pytest.raises(PipelineInvariantError, match="cannot be re-sent from submitted"):
        ledger.resend(0)
    FifoAdmission().admit(ledger)
    assert not ledger.finish_request(0)  # one of K=2 responses, then its replica dies
    clock.advance_to(1.0)
    ledger.resend(0)
    assert not ledger.finish_request(0)  # the count restarted: one more response does not complete the group
    assert ledger.finish_request(0)
    with pytest.raises(PipelineInvariantError, match="cannot be re-sent from serving_complete"):
        ledger.resend(0)
    ledger.materialize(0)
    ledger.complete_serving(1)
    ledger.materialize(1)
    fifo = CompleteGroupFIFO(ledger, "cgp", step_groups=2)
    d = fifo.take(whole_step=True)
    timeline = RoundTimeline(ledger)
    timeline.trainer_busy(2.0, 3.0, d.step_index, d.group_ids)
    ledger.consume(d.group_ids, trainer_version=0)
    assert ledger.groups_resent == 1 and ledger.group(0).times["resent_1"] == 1.0
    assert timeline.metrics()[PREFIX + "groups_resent"] == 1.0
    assert timeline.calls_per_step() == [1]


def test_stop_replacements_ends_the_round_short():
    ledger = GroupLedger(0, num_groups=2, group_size=1, max_extra_groups=5, clock=ManualClock())
    FifoAdmission().admit(ledger)
    ledger.complete_serving(0)
    assert ledger.filter(0) is not None  # replaced by group 2
    ledger.stop_replacements()  # no prompt left for a third extra group
    ledger.complete_serving(1)
    assert ledger.filter(1) is None
    FifoAdmission().admit(ledger)
    ledger.complete_serving(2)
    ledger.materialize(2)
    assert ledger.rollout_closed and ledger.short_by == 1 and ledger.extra_groups_used == 1


def test_filter_replacement_and_short_round():
    ledger = GroupLedger(0, num_groups=2, group_size=1, max_extra_groups=1, clock=ManualClock())
    FifoAdmission().admit(ledger)
    ledger.complete_serving(0)
    assert ledger.filter(0).order == 2  # the next group in data order takes its place
    FifoAdmission().admit(ledger)
    ledger.complete_serving(2)
    assert ledger.filter(2) is None  # cap hit
    ledger.complete_serving(1)
    ledger.materialize(1)
    assert ledger.rollout_closed and ledger.short_by == 1


def test_hold_frontier_refills_in_order():
    ledger = GroupLedger(0, num_groups=5, group_size=1, clock=ManualClock())
    fgd = FrontierAdmission(width=2, strength="hold")
    assert [a.group_id for a in fgd.admit(ledger)] == [0, 1]
    ledger.complete_serving(1)
    assert fgd.frontier(ledger) == [0, 2]
    assert [(a.group_id, a.priority) for a in fgd.admit(ledger)] == [(2, 2)]
    assert fgd.admit(ledger) == []


def test_priority_submits_everything_lowest_order_first():
    ledger = GroupLedger(0, num_groups=4, group_size=1, clock=ManualClock())
    adm = FrontierAdmission(width=2, strength="priority").admit(ledger)
    assert [(a.group_id, a.priority) for a in adm] == [(0, 0), (1, 1), (2, 2), (3, 3)]


def scenario_timeline() -> RoundTimeline:
    """R=2, U=1. Admit at t=1; g1 ready at 3, g0 at 5; trainer: [3,6] on g1 (step 0), [6,8] on g0 (step 1)."""
    clock = ManualClock()
    ledger = GroupLedger(0, num_groups=2, group_size=1, clock=clock)
    fifo = CompleteGroupFIFO(ledger, "cgp", step_groups=1)
    tl = RoundTimeline(ledger)
    clock.advance_to(1)
    FifoAdmission().admit(ledger)
    clock.advance_to(3)
    ledger.complete_serving(1)
    ledger.materialize(1)
    d = fifo.take()
    clock.advance_to(5)
    ledger.complete_serving(0)
    ledger.materialize(0)
    clock.advance_to(6)
    tl.trainer_busy(3, 6, d.step_index, d.group_ids)
    ledger.consume(d.group_ids, 0)
    d = fifo.take()
    clock.advance_to(8)
    tl.trainer_busy(6, 8, d.step_index, d.group_ids)
    ledger.consume(d.group_ids, 0)
    tl.published(8, 8.5)
    ledger.mark_published()
    return tl


def test_metrics_hand_computed():
    m = {k.removeprefix(PREFIX): v for k, v in scenario_timeline().metrics().items()}
    assert m["rollout_to_train_end_s"] == 7  # 1 -> 8
    assert m["trainer_wait_s"] == 2 and m["trainer_wait_ratio"] == pytest.approx(2 / 7)
    assert m["trainer_wait_before_first_s"] == 2 and m["first_dispatch_s"] == 2
    assert m["rollout_s"] == 4  # last materialized at 5
    # ideal = max(T_rollout + t_last_step, first_ready + T_train) = max(4 + 2, 2 + 5) = 7
    assert m["ideal_s"] == 7 and m["serial_estimate_s"] == 9
    assert m["overlap_efficiency"] == pytest.approx(1.0)
    assert m["publish_s"] == 0.5


def test_timeline_outputs_round_trip(tmp_path):
    tl = scenario_timeline()
    paths = tl.write(tmp_path, "round0")
    assert all(p.stat().st_size > 0 for p in paths)
    loaded = RoundTimeline.from_dict(json.loads(paths[0].read_text()))
    assert loaded.metrics() == tl.metrics()
    trace = json.loads(paths[1].read_text())
    names = {e["name"] for e in trace["traceEvents"] if e["ph"] == "X"}
    assert {"generating", "training", "train step 0", "publish weights"} <= names
    assert paths[2].read_bytes()[:4] == b"\x89PNG"


def test_sync_overlap_efficiency_is_zero():
    clock = ManualClock()
    ledger = GroupLedger(0, num_groups=2, group_size=1, clock=clock)
    fifo = CompleteGroupFIFO(ledger, "sync", step_groups=1)
    tl = RoundTimeline(ledger)
    FifoAdmission().admit(ledger)
    for t, g in ((2, 0), (4, 1)):
        clock.advance_to(t)
        ledger.complete_serving(g)
        ledger.materialize(g)
    for a, b in ((4, 6), (6, 7)):
        d = fifo.take()
        tl.trainer_busy(a, b, d.step_index, d.group_ids)
    m = tl.metrics()
    assert m[PREFIX + "overlap_efficiency"] == 0.0 and m[PREFIX + "trainer_wait_ratio"] == pytest.approx(4 / 7)
    assert math.isclose(m[PREFIX + "ideal_s"], max(4 + 1, 2 + 3))


def test_pipeline_imports_nothing_heavy():
    code = (
        "import sys, recipe.rolloutpipe.pipeline as p; "
        "bad = [m for m in ('verl', 'vllm', 'ray', 'torch', 'matplotlib') if m in sys.modules]; print(bad)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_stall_watchdog_names_outstanding_groups():
    clock = ManualClock()
    ledger = GroupLedger(2, num_groups=3, group_size=2, clock=clock)
    FifoAdmission().admit(ledger)
    ledger.complete_serving(0)
    ledger.materialize(0)
    clock.advance_to(5)
    ledger.check_progress(10)  # not stalled yet
    ledger.finish_request(1)  # one response of group 1 counts as progress
    clock.advance_to(14)
    ledger.check_progress(10)
    clock.advance_to(16)
    with pytest.raises(PipelineStallError, match=r"no group changed state for 11s.*materialized: \[0\]; "
                                                 r"admitted: \[1, 2\]"):
        ledger.check_progress(10)
    ledger.check_progress(None)  # disabled


def test_buffer_bound_holds_admission_until_the_trainer_consumes():
    ledger = GroupLedger(version=0, num_groups=6, group_size=2, clock=ManualClock(), max_buffered_groups=3)
    fifo = CompleteGroupFIFO(ledger, "cgp", step_groups=2)
    admission = make_admission("cgp", frontier_width=2)
    assert [a.group_id for a in admission.admit(ledger)] == [0, 1, 2]  # FIFO admission would take all six
    for g in (0, 1, 2):
        ledger.complete_serving(g)
        ledger.materialize(g)
    assert admission.admit(ledger) == [] and ledger.buffered == 3  # generated but not trained: still held
    d = fifo.take(whole_step=True)
    assert d.group_ids == (0, 1) and admission.admit(ledger) == []  # dispatched is still in memory
    ledger.consume(d.group_ids, trainer_version=0)
    assert [a.group_id for a in admission.admit(ledger)] == [3, 4] and ledger.buffered == 3
    with pytest.raises(ValueError, match="max_buffered_groups"):
        GroupLedger(version=0, num_groups=2, group_size=1, max_buffered_groups=0)

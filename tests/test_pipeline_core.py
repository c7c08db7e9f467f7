"""Pipeline core: invariants under random schedules (hypothesis) and metrics on hand-computed scenarios."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from recipe.rolloutpipe.pipeline import (
    PREFIX,
    GroupState,
    ManualClock,
    MeasuredFrontierWidth,
    PipelineInvariantError,
    PipelineStallError,
    Round,
    RoundSettings,
    RoundTimeline,
)


def make_round(R: int, K: int = 1, U: int = 1, mode: str = "cgp", version: int = 0, clock: ManualClock | None = None,
               frontier_width: int | None = None, fgd_strength: str = "hold", train_unit: str = "step",
               **settings) -> Round:
    """Every test drives the one Round the trainer and the simulator drive (its parts: .ledger .fifo .timeline);
    F_w defaults to U here, as ``frontier_width: null`` resolves under hold."""
    return Round(version, RoundSettings(mode, R, K, U, fgd_strength, frontier_width or U, train_unit, **settings),
                 clock or ManualClock())


def drive_round(data, R: int, K: int, U: int, mode: str, width: int, strength: str, extra: int, filter_p: float,
                limit: int | None = None, losses: int = 0):
    """Random completion order, random filtering, random trainer pulls, up to ``losses`` groups lost with a dead
    replica mid-generation and re-sent; checks invariants after every event."""
    clock = ManualClock()
    rnd = make_round(R, K, U, mode, version=3, clock=clock, frontier_width=width, fgd_strength=strength,
                     max_extra_groups=extra, max_buffered_groups=limit)
    ledger, fifo = rnd.ledger, rnd.fifo
    in_engine: list[tuple[int, int]] = []  # (group, responses left to finish)
    consumed: list[int] = []
    steps: list[list[int]] = []
    current_step: list[int] = []

    def admit() -> None:
        for a in rnd.admit():
            in_engine.extend([(a.group_id, 0)] * K)

    admit()
    for _ in range(10_000):
        clock.advance_to(clock.now() + 1)
        active = {g for g, _ in in_engine}
        if mode == "cgp_fgd" and strength == "hold":
            assert len(active) <= width
        if mode == "cgp_fgd" and strength == "paced":  # topped up a frontier at a time, only when below one
            assert len(active) <= 2 * width - 1
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
            rnd.resend([gid])
            in_engine.extend([(gid, 0)] * K)
            losses -= 1
        elif move == "finish":
            i = data.draw(st.integers(0, len(in_engine) - 1))
            gid, _ = in_engine.pop(i)
            if rnd.request_finished(gid):
                if data.draw(st.floats(0, 1)) < filter_p:
                    rnd.filtered(gid)
                else:
                    rnd.materialized(gid)
                admit()
        else:
            # the trainer's three ways: whole steps (sync: the whole round), every whole step ready, or pieces
            unit = data.draw(st.sampled_from(["step", "steps", "groups"]))
            whole, ready = unit != "groups", unit == "steps"
            before = fifo.releasable()
            d = rnd.take(whole_step=whole, max_groups=None if whole else data.draw(st.integers(1, U + 1)),
                         ready_steps=ready)
            if d is None:  # whole steps only: the open step's groups are not all there yet
                assert whole and not ledger.rollout_closed
                continue
            assert d.version == 3
            assert d.group_ids or (d.ends_step and current_step)  # an empty dispatch only closes an open step
            if d.group_ids:  # the groups' own step indices are exactly the dispatch's steps
                assert {ledger.group(g).step_index for g in d.group_ids} == set(range(d.step_index,
                                                                                      d.step_index + d.steps))
            # several steps in one call: sync's whole round, or the whole steps that were ready
            assert d.steps == 1 or (mode == "sync" and whole and ledger.rollout_closed) or ready
            if ready and not current_step and before >= U:  # every whole step that was in goes, and no more
                assert len(d.group_ids) == before - before % U
            # each step's groups stay together in the training order, steps in order
            trained_steps = [ledger.group(g).step_index for g in d.training_order]
            assert trained_steps == sorted(trained_steps) and sorted(d.training_order) == sorted(d.group_ids)
            rnd.trained(d, clock.now(), clock.now(), trainer_version=3)
            admit()  # consumption frees buffer room
            consumed.extend(d.group_ids)
            for gid in d.group_ids:  # a dispatch over several steps: each of its steps but the last closes inside
                if current_step and ledger.group(gid).step_index != ledger.group(current_step[0]).step_index:
                    steps.append(current_step)
                    current_step = []
                current_step.append(gid)
            if d.ends_step:
                steps.append(current_step)
                current_step = []
        counts = ledger.counts()
        assert sum(counts.values()) == len(ledger.groups)
    return rnd, consumed, steps, current_step


@settings(max_examples=150, deadline=None)
@given(
    data=st.data(),
    R=st.integers(1, 12),
    K=st.integers(1, 4),
    U=st.integers(1, 5),
    mode=st.sampled_from(["sync", "cgp", "cgp_fgd"]),
    width=st.integers(1, 6),
    strength=st.sampled_from(["hold", "priority", "paced"]),
    extra=st.integers(0, 4),
    filter_p=st.sampled_from([0.0, 0.3, 0.7]),
    slack=st.sampled_from([None, 0, 1, 3]),
    losses=st.integers(0, 3),
)
def test_every_group_consumed_exactly_once(data, R, K, U, mode, width, strength, extra, filter_p, slack, losses):
    # a buffer bound of U + slack groups (sync needs the whole round: R + extra)
    limit = None if slack is None else (R + extra if mode == "sync" else U + slack)
    rnd, consumed, steps, leftover = drive_round(data, R, K, U, mode, width, strength, extra, filter_p, limit, losses)
    ledger, fifo = rnd.ledger, rnd.fifo
    assert ledger.rollout_closed and fifo.exhausted
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
    rnd.check_publishable()  # every trainable group dispatched and consumed


def test_sync_releases_nothing_until_round_final():
    rnd = make_round(3, mode="sync")
    rnd.admit()
    for gid in (0, 1):
        rnd.served(gid)
        rnd.materialized(gid)
    assert rnd.fifo.releasable() == 0 and rnd.take() is None
    rnd.served(2)
    rnd.materialized(2)
    assert rnd.fifo.releasable() == 3


def test_cgp_releases_at_once_and_respects_step_boundaries():
    rnd = make_round(4, K=2, U=2)
    rnd.admit()
    for gid in (2, 0, 3):
        rnd.served(gid)
        rnd.materialized(gid)
    d1 = rnd.take(whole_step=False, max_groups=1)
    assert d1.group_ids == (2,) and d1.step_index == 0 and not d1.ends_step
    d2 = rnd.take(whole_step=False)  # 0 and 3 are ready but 3 belongs to step 1
    assert d2.group_ids == (0,) and d2.ends_step
    assert rnd.take(whole_step=True) is None  # step 1 needs group 1 too
    rnd.served(1)
    rnd.materialized(1)
    d3 = rnd.take(whole_step=True)
    assert d3.group_ids == (3, 1) and d3.step_index == 1 and d3.ends_step


def test_ready_steps_go_in_one_call_each_step_kept_whole():
    """train_unit=steps: a trainer that fell behind takes every whole step in the FIFO in one call; the step
    boundaries are those of one call per step (arrival order), each step's groups trained in submission order."""
    rnd = make_round(8, K=2, U=2)
    rnd.admit()
    for gid in (3, 0, 5, 1, 2):
        rnd.served(gid)
        rnd.materialized(gid)
    d = rnd.take(whole_step=True, ready_steps=True)
    assert d.group_ids == (3, 0, 5, 1) and d.steps == 2 and d.step_index == 0 and d.ends_step
    assert d.training_order == (0, 3, 1, 5)  # not (0, 1, 3, 5): that would move group 1 into step 0
    assert [rnd.ledger.group(g).step_index for g in (3, 0, 5, 1)] == [0, 0, 1, 1]
    rnd.trained(d, 0.0, 1.0, trainer_version=0)
    assert rnd.take(whole_step=True, ready_steps=True) is None  # group 2 waits for its step's second group
    rnd.served(7)
    rnd.materialized(7)
    d = rnd.take(whole_step=True, ready_steps=True)  # one step ready: a call of one step, as train_unit=step
    assert d.group_ids == (2, 7) and d.steps == 1 and d.step_index == 2


def test_invariants_raise():
    rnd = make_round(2, version=5)
    with pytest.raises(PipelineInvariantError, match="submitted -> materialized"):
        rnd.materialized(0)
    rnd.admit()
    rnd.served(0)
    with pytest.raises(PipelineInvariantError, match="response for group 0 in state serving_complete"):
        rnd.request_finished(0)  # a K+1-th response
    rnd.materialized(0)
    d = rnd.take()
    with pytest.raises(PipelineInvariantError, match="off-policy"):
        rnd.trained(d, 0.0, 1.0, trainer_version=6)
    with pytest.raises(PipelineInvariantError, match="dispatched -> dispatched"):
        rnd.ledger.dispatch(0, 0)
    with pytest.raises(PipelineInvariantError, match="cannot publish"):
        rnd.ledger.mark_published()
    rnd.trained(d, 0.0, 1.0, trainer_version=5)
    with pytest.raises(PipelineInvariantError, match="never dispatched"):
        rnd.check_publishable()


def test_resend_only_while_generating():
    clock = ManualClock()
    rnd = make_round(2, K=2, U=2, clock=clock)
    with pytest.raises(PipelineInvariantError, match="cannot be re-sent from submitted"):
        rnd.resend([0])
    rnd.admit()
    assert not rnd.request_finished(0)  # one of K=2 responses, then its replica dies
    clock.advance_to(1.0)
    rnd.resend([0])
    assert not rnd.request_finished(0)  # the count restarted: one more response does not complete the group
    assert rnd.request_finished(0)
    with pytest.raises(PipelineInvariantError, match="cannot be re-sent from serving_complete"):
        rnd.resend([0])
    rnd.materialized(0)
    rnd.served(1)
    rnd.materialized(1)
    d = rnd.take(whole_step=True)
    rnd.trained(d, 2.0, 3.0, trainer_version=0)
    assert rnd.ledger.groups_resent == 1 and rnd.ledger.group(0).times["resent_1"] == 1.0
    assert rnd.timeline.metrics()[PREFIX + "groups_resent"] == 1.0
    assert rnd.timeline.calls_per_step() == [1]


def test_stop_replacements_ends_the_round_short():
    rnd = make_round(2, max_extra_groups=5)
    rnd.admit()
    rnd.served(0)
    assert rnd.filtered(0)  # replaced by group 2
    rnd.served(1)
    assert not rnd.filtered(1, replaceable=False)  # no prompt left for a third extra group
    rnd.admit()
    rnd.served(2)
    rnd.materialized(2)
    assert rnd.rollout_closed and rnd.ledger.short_by == 1 and rnd.ledger.extra_groups_used == 1


def test_filter_replacement_and_short_round():
    rnd = make_round(2, max_extra_groups=1)
    rnd.admit()
    rnd.served(0)
    assert rnd.filtered(0) and len(rnd.ledger.groups) == 3  # group 2, next in data order, takes its place
    assert [a.group_id for a in rnd.admit()] == [2]
    rnd.served(2)
    assert not rnd.filtered(2)  # cap hit
    rnd.served(1)
    rnd.materialized(1)
    assert rnd.rollout_closed and rnd.ledger.short_by == 1


def test_hold_frontier_refills_in_order():
    rnd = make_round(5, mode="cgp_fgd", frontier_width=2, fgd_strength="hold")
    assert [a.group_id for a in rnd.admit()] == [0, 1]
    rnd.served(1)
    assert rnd.admission.frontier(rnd.ledger) == [0, 2]
    assert [(a.group_id, a.priority) for a in rnd.admit()] == [(2, 2)]
    assert rnd.admit() == []


def test_paced_lets_the_next_frontier_in_at_once_when_fewer_than_width_are_unfinished():
    rnd = make_round(10, mode="cgp_fgd", frontier_width=3, fgd_strength="paced")
    assert [a.group_id for a in rnd.admit()] == [0, 1, 2]
    rnd.served(1)  # 2 unfinished < 3: the next frontier, in one admission, with its order as priority
    assert [(a.group_id, a.priority) for a in rnd.admit()] == [(3, 3), (4, 4), (5, 5)]
    rnd.served(0)
    assert rnd.admit() == []  # 4 unfinished: the engine has enough
    rnd.served(2)
    rnd.served(4)
    assert [a.group_id for a in rnd.admit()] == [6, 7, 8]
    for g in (3, 5, 6, 7):
        rnd.served(g)
    assert [a.group_id for a in rnd.admit()] == [9]  # the round's last group
    assert rnd.admit() == []


def test_priority_submits_everything_lowest_order_first():
    adm = make_round(4, mode="cgp_fgd", frontier_width=2, fgd_strength="priority").admit()
    assert [(a.group_id, a.priority) for a in adm] == [(0, 0), (1, 1), (2, 2), (3, 3)]


def _measured_round(serve_s: list[float], step_s: list[float]) -> RoundTimeline:
    """A finished round (U=2) whose groups each took ``serve_s`` from admission to served, and whose optimizer
    steps took ``step_s`` (step 1 in two calls, as ``train_unit: groups`` does)."""
    groups = [{"order": i, "state": "consumed", "step_index": i // 2, "resends": 0,
               "times": {"admitted": 0.5 * i, "serving_complete": 0.5 * i + s}} for i, s in enumerate(serve_s)]
    t, intervals = 20.0, []
    for k, s in enumerate(step_s):
        parts = (s / 2, s / 2) if k == 1 else (s,)
        for p in parts:
            intervals.append({"start": t, "end": t + p, "step_index": k, "group_ids": [2 * k], "kind": "train"})
            t += p
    return RoundTimeline.from_dict({"settings": {}, "groups": groups, "intervals": intervals})


@pytest.mark.parametrize("serve_s,step_s,width", [
    ([2.0] * 8, [0.5] * 4, 8),  # trainer 4x faster than a group takes: widen to keep it fed (capped at R=8)
    ([2.0] * 8, [1.5] * 4, 3),  # ceil(U * 2 / 1.5) = 3
    ([2.0] * 8, [4.0] * 4, 2),  # trainer slower than the engine: never narrower than U
    ([1.0, 1.0, 9.0, 1.0, 1.0, 1.0, 1.0, 1.0], [1.0, 0.1, 1.0, 1.0], 2),  # medians: one slow group/step moves nothing
])
def test_auto_frontier_width_follows_measured_times(serve_s, step_s, width):
    auto = MeasuredFrontierWidth(step_groups=2, num_groups=8)
    assert auto.width == 2  # the first round: U
    assert auto.observe(_measured_round(serve_s, step_s)) == width == auto.width


def test_auto_frontier_width_keeps_its_value_without_measurements():
    auto = MeasuredFrontierWidth(step_groups=2, num_groups=8)
    auto.observe(_measured_round([2.0] * 8, [1.5] * 4))
    assert auto.observe(RoundTimeline.from_dict({"settings": {}, "groups": [], "intervals": []})) == 3


def scenario_timeline() -> RoundTimeline:
    """R=2, U=1. Admit at t=1; g1 ready at 3, g0 at 5; trainer: [3,6] on g1 (step 0), [6,8] on g0 (step 1)."""
    clock = ManualClock()
    rnd = make_round(2, clock=clock)
    clock.advance_to(1)
    rnd.admit()
    clock.advance_to(3)
    rnd.served(1)
    rnd.materialized(1)
    d = rnd.take()
    clock.advance_to(5)
    rnd.served(0)
    rnd.materialized(0)
    clock.advance_to(6)
    rnd.trained(d, 3, 6, trainer_version=0)
    d = rnd.take()
    clock.advance_to(8)
    rnd.trained(d, 6, 8, trainer_version=0)
    rnd.check_publishable()
    rnd.published(8, 8.5)
    return rnd.timeline


def test_metrics_hand_computed():
    m = {k.removeprefix(PREFIX): v for k, v in scenario_timeline().metrics().items()}
    assert m["rollout_to_train_end_s"] == 7  # 1 -> 8
    assert m["trainer_wait_s"] == 2 and m["trainer_wait_ratio"] == pytest.approx(2 / 7)
    assert m["trainer_wait_before_first_s"] == 2 and m["first_dispatch_s"] == 2
    assert m["rollout_s"] == 4  # last materialized at 5
    assert m["last_group_admitted_s"] == 0  # g0, the last in, was admitted with g1 at the start
    # ideal = max(T_rollout + t_last_step, first_ready + T_train) = max(4 + 2, 2 + 5) = 7
    assert m["ideal_s"] == 7 and m["serial_estimate_s"] == 9
    assert m["overlap_efficiency"] == pytest.approx(1.0)
    assert m["publish_s"] == 0.5


def test_the_last_groups_admission_is_the_part_of_the_rollout_fgd_added():
    """hold with F_w=1, R=2: g1 is let in only when g0 is served (at 3), and is itself served 2 s later: the rollout
    (5 s) is g1's admission (3 s in) plus its 2 s; under FCFS both start at 0."""
    clock = ManualClock()
    rnd = make_round(2, mode="cgp_fgd", clock=clock, frontier_width=1, fgd_strength="hold")
    assert [a.group_id for a in rnd.admit()] == [0]
    clock.advance_to(3)
    rnd.served(0)
    rnd.materialized(0)
    assert [a.group_id for a in rnd.admit()] == [1]
    rnd.trained(rnd.take(), 3, 4, trainer_version=0)
    clock.advance_to(5)
    rnd.served(1)
    rnd.materialized(1)
    rnd.trained(rnd.take(), 5, 6, trainer_version=0)
    m = {k.removeprefix(PREFIX): v for k, v in rnd.timeline.metrics().items()}
    assert m["rollout_s"] == 5 and m["last_group_admitted_s"] == 3


def test_the_bound_counts_only_the_last_steps_work_after_the_rollout():
    """train_unit=groups, one step of 2 groups: g0 in at 2 and accumulated [2, 3] during the rollout, g1 (the last)
    in at 5 and accumulated with the optimizer step [5, 6]. Only [5, 6] had to wait for the rollout's end: the bound
    is max(5 + 1, 2 + 2) = 6, which the round reached; counting [2, 3] too would put it at 7, above what it did."""
    groups = [{"order": g, "state": "consumed", "step_index": 0, "resends": 0,
               "times": {"admitted": 0.0, "serving_complete": t, "materialized": t}} for g, t in ((0, 2.0), (1, 5.0))]
    intervals = [{"start": 2.0, "end": 3.0, "step_index": 0, "group_ids": [0], "kind": "train"},
                 {"start": 5.0, "end": 6.0, "step_index": 0, "group_ids": [1], "kind": "train"}]
    m = RoundTimeline.from_dict({"settings": {}, "groups": groups, "intervals": intervals}).metrics()
    m = {k.removeprefix(PREFIX): v for k, v in m.items()}
    assert (m["rollout_s"], m["ideal_s"], m["rollout_to_train_end_s"]) == (5, 6, 6)


def test_trainer_waiting_is_split_by_cause_and_adds_up():
    """R=3, U=1, admitted at 0. g0 in at 2, trained [2,3]; g1 in at 5, trained [5,6]; g2 (the last) in at 7,
    trained [7.5,9]: waiting 2 s for a first group, 2 + 1 s while later groups generate, 0.5 s after the last."""
    clock = ManualClock()
    rnd = make_round(3, clock=clock)
    rnd.admit()
    for gid, ready, start, end in ((0, 2, 2, 3), (1, 5, 5, 6), (2, 7, 7.5, 9)):
        clock.advance_to(ready)
        rnd.served(gid)
        rnd.materialized(gid)
        d = rnd.take()
        clock.advance_to(end)
        rnd.trained(d, start, end, trainer_version=0)
    m = {k.removeprefix(PREFIX): v for k, v in rnd.timeline.metrics().items()}
    assert m["wait_no_group_yet_s"] == 2 and m["wait_groups_generating_s"] == 3 and m["wait_after_rollout_s"] == 0.5
    parts = m["wait_no_group_yet_s"] + m["wait_groups_generating_s"] + m["wait_after_rollout_s"]
    assert parts + m["trainer_busy_s"] == pytest.approx(m["rollout_to_train_end_s"]) == 9


def test_timeline_outputs_round_trip(tmp_path):
    from recipe.rolloutpipe.drawing import write_timeline

    tl = scenario_timeline()
    paths = write_timeline(tl, tmp_path, "round0")
    assert all(p.stat().st_size > 0 for p in paths)
    loaded = RoundTimeline.from_dict(json.loads(paths[0].read_text()))
    assert loaded.metrics() == tl.metrics()
    trace = json.loads(paths[1].read_text())
    names = {e["name"] for e in trace["traceEvents"] if e["ph"] == "X"}
    assert {"generating", "training", "train step 0", "publish weights"} <= names
    assert paths[2].read_bytes()[:4] == b"\x89PNG"


def test_sync_overlap_efficiency_is_zero():
    clock = ManualClock()
    rnd = make_round(2, mode="sync", clock=clock)
    rnd.admit()
    for t, g in ((2, 0), (4, 1)):
        clock.advance_to(t)
        rnd.served(g)
        rnd.materialized(g)
    d = rnd.take()  # the serial baseline: the whole round in one call, as verl's update_actor (2 steps of U=1)
    assert d.group_ids == (0, 1) and (d.step_index, d.steps, d.steps_closed) == (0, 2, 2)
    rnd.trained(d, 4, 7, trainer_version=0)
    assert rnd.take() is None and rnd.fifo.exhausted
    assert rnd.timeline.calls_per_step() == [1, 1] and rnd.timeline.trainer_calls() == 1
    m = rnd.timeline.metrics()
    assert m[PREFIX + "overlap_efficiency"] == 0.0 and m[PREFIX + "trainer_wait_ratio"] == pytest.approx(4 / 7)
    assert math.isclose(m[PREFIX + "ideal_s"], max(4 + 3 / 2, 2 + 3))  # the call's last step: half of it


def test_sync_trains_whole_steps_in_one_call_and_a_short_last_step_after():
    rnd = make_round(5, U=2, mode="sync", max_extra_groups=0)
    rnd.admit()
    for gid in range(5):
        rnd.served(gid)
        if gid == 3:
            rnd.filtered(gid)  # no replacement: the round is short by one, its last step has one group
        else:
            rnd.materialized(gid)
    assert rnd.take(whole_step=False).group_ids == (0, 1)  # pieces: one step at a time, as before
    d = rnd.take()
    assert d.group_ids == (2, 4) and (d.step_index, d.steps, d.ends_step) == (1, 1, True)
    rnd2 = make_round(7, U=2, mode="sync")
    rnd2.admit()
    for gid in range(7):
        rnd2.served(gid)
        rnd2.materialized(gid)
    whole, short = rnd2.take(), rnd2.take()
    assert whole.group_ids == (0, 1, 2, 3, 4, 5) and (whole.steps, whole.ends_step) == (3, True)
    assert short.group_ids == (6,) and (short.step_index, short.steps, short.ends_step) == (3, 1, True)
    assert [rnd2.ledger.group(g).step_index for g in range(7)] == [0, 0, 1, 1, 2, 2, 3]
    assert rnd2.take() is None and rnd2.fifo.exhausted


def test_pipeline_imports_nothing_heavy():
    code = (
        "import sys, recipe.rolloutpipe.pipeline as p; "
        "bad = [m for m in ('verl', 'vllm', 'ray', 'torch', 'matplotlib') if m in sys.modules]; print(bad)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_stall_watchdog_names_outstanding_groups():
    clock = ManualClock()
    rnd = make_round(3, K=2, U=2, version=2, clock=clock)
    rnd.admit()
    rnd.served(0)
    rnd.materialized(0)
    clock.advance_to(5)
    rnd.ledger.check_progress(10)  # not stalled yet
    rnd.request_finished(1)  # one response of group 1 counts as progress
    clock.advance_to(14)
    rnd.ledger.check_progress(10)
    clock.advance_to(16)
    with pytest.raises(PipelineStallError, match=r"no group changed state for 11s.*materialized: \[0\]; "
                                                 r"admitted: \[1, 2\]"):
        rnd.next_dispatch(whole_step=True, stall_timeout_s=10, poll_s=0)  # the trainer side sees it
    rnd.ledger.check_progress(None)  # disabled


def test_buffer_bound_holds_admission_until_the_trainer_consumes():
    rnd = make_round(6, K=2, U=2, max_buffered_groups=3)
    assert [a.group_id for a in rnd.admit()] == [0, 1, 2]  # FIFO admission would take all six
    for g in (0, 1, 2):
        rnd.served(g)
        rnd.materialized(g)
    assert rnd.admit() == [] and rnd.ledger.buffered == 3  # generated but not trained: still held
    d = rnd.take(whole_step=True)
    assert d.group_ids == (0, 1) and rnd.admit() == []  # dispatched is still in memory
    rnd.trained(d, 0.0, 1.0, trainer_version=0)
    assert [a.group_id for a in rnd.admit()] == [3, 4] and rnd.ledger.buffered == 3
    with pytest.raises(ValueError, match="max_buffered_groups"):
        make_round(2, max_buffered_groups=0)


def test_next_dispatch_hands_a_rollout_failure_to_the_trainer():
    rnd = make_round(2)
    rnd.admit()
    rnd.fail(ConnectionError("agent loop gone"))
    with pytest.raises(RuntimeError, match="rollout side failed in round v0") as err:
        rnd.next_dispatch(poll_s=0)
    assert isinstance(err.value.__cause__, ConnectionError)


def test_the_round_is_built_in_one_place():
    """Ledger, FIFO, admission and timeline are constructed in pipeline/round.py only (the trainer, the simulator
    and these tests all drive a Round); frontier.py's ``make_admission`` is the admission factory Round calls."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    pattern = re.compile(r"\b(GroupLedger|CompleteGroupFIFO|make_admission|RoundTimeline|FifoAdmission|"
                         r"FrontierAdmission|AdaptiveFrontierAdmission)\(")
    hits = [f"{f.relative_to(root)}:{i}" for d in ("recipe", "rolloutpipe_workers", "tests")
            for f in sorted((root / d).rglob("*.py")) if f.name not in ("round.py", "frontier.py")
            for i, line in enumerate(f.read_text().splitlines(), 1)
            if pattern.search(line) and not line.lstrip().startswith(("def ", "class ", "#"))]
    assert hits == []

"""Discrete-event simulation of one RolloutPipe round, driving the real pipeline classes on a simulated clock.

Only the *machines* are models here (an LLM engine with continuous batching, a trainer, weight publication); what
to admit, when to dispatch and when to step comes from ``recipe.rolloutpipe.pipeline``, exactly as in the real run.
"""

from __future__ import annotations

import heapq
import math
import random
from dataclasses import dataclass, field

from ..pipeline import FgdStrength, ManualClock, Mode, Round, RoundSettings, RoundTimeline, TrainUnit


@dataclass(frozen=True)
class Workload:
    """Per-group correlated long-tail response lengths.

    A group's difficulty scales all K lengths (log-normal, ``sigma_between``); each response varies around it
    (``sigma_within``); a share ``p_cap`` of responses run to the length cap (unfinished reasoning).
    """

    name: str
    mean_tokens: float
    sigma_between: float
    sigma_within: float
    p_cap: float
    cap: int
    prompt_tokens: int = 300

    def lengths(self, num_groups: int, k: int, rng: random.Random) -> list[list[int]]:
        # E[lognormal(mu, s)] = exp(mu + s^2/2): centre both factors so the mean stays ``mean_tokens`` before capping.
        mu_b = math.log(self.mean_tokens) - self.sigma_between**2 / 2
        out = []
        for _ in range(num_groups):
            g = rng.lognormvariate(mu_b, self.sigma_between)
            row = []
            for _ in range(k):
                n = self.cap if rng.random() < self.p_cap else g * rng.lognormvariate(-self.sigma_within**2 / 2,
                                                                                      self.sigma_within)
                row.append(max(1, min(self.cap, int(n))))
            out.append(row)
        return out


@dataclass(frozen=True)
class EngineModel:
    """Continuous batching: at most ``max_running`` sequences and ``kv_tokens`` cached tokens; one decode step
    costs ``step_base_s + step_per_seq_s * batch``; admitting a request costs ``prefill_per_token_s`` per prompt
    token in the next step. ``fcfs_shuffle``: concurrent clients make FCFS arrival order random within a round."""

    max_running: int = 256
    kv_tokens: int = 1_500_000
    step_base_s: float = 0.012
    step_per_seq_s: float = 0.00008
    prefill_per_token_s: float = 2e-6
    fcfs_shuffle: bool = True
    # extra step time while the trainer is busy (0 for separate GPU pools; on the 2-core CPU emulation the
    # unpinned orchestration processes take their CPU from the busy cores, ~0.3-0.6 measured)
    contended_slowdown: float = 0.0

    def step_s(self, batch: int) -> float:
        return self.step_base_s + self.step_per_seq_s * batch


@dataclass(frozen=True)
class TrainerModel:
    """Compute per group (or per response token if ``per_token_s`` > 0) plus a fixed cost per optimizer step and
    per trainer call. What one call takes is the round's ``train_unit`` (``RoundSettings``)."""

    per_group_s: float = 6.0
    per_token_s: float = 0.0
    step_overhead_s: float = 0.1
    call_overhead_s: float = 0.0
    reward_s: float = 0.05  # reward + advantage, per group, on the rollout side
    publish_s: float = 5.0
    contended_slowdown: float = 0.0  # extra step time when the engine is decoding (see EngineModel)


def paper_round(num_groups: int, **changes) -> RoundSettings:
    """The paper's round at R = ``num_groups`` -- K=8, U=2, FGD with priority and F_w=2, one trainer call per
    complete group -- with ``changes`` (any ``RoundSettings`` field)."""
    return RoundSettings(Mode.CGP_FGD, num_groups, 8, 2, FgdStrength.PRIORITY, 2, TrainUnit.GROUPS).replace(**changes)


@dataclass(order=True)
class _Seq:
    finish_step: int
    start_step: int = field(compare=False)
    group: int = field(compare=False)


class _Engine:
    """The engine's state at time ``t``. Time advances in whole decode steps; the batch is constant between events."""

    def __init__(self, model: EngineModel, prompt_tokens: int) -> None:
        self.m = model
        self.prompt_tokens = prompt_tokens
        self.waiting: list[tuple[tuple[int, int], int, int]] = []  # ((priority, arrival), group, length)
        self.running: list[_Seq] = []
        self.t = 0.0
        self.step = 0  # decode steps done
        self.kv_base = 0  # sum over running of (prompt - start): kv in use = kv_base + step * len(running)
        self.pending_prefill_s = 0.0
        self.slow = 1.0  # 1 + contended_slowdown while the trainer is busy

    def step_s(self) -> float:
        return self.m.step_s(len(self.running)) * self.slow

    def admit(self) -> None:
        while self.waiting and len(self.running) < self.m.max_running:
            kv_used = self.kv_base + self.step * len(self.running)
            if self.running and kv_used + self.prompt_tokens > self.m.kv_tokens:
                break
            _, group, length = heapq.heappop(self.waiting)
            heapq.heappush(self.running, _Seq(self.step + length, self.step, group))
            self.kv_base += self.prompt_tokens - self.step
            self.pending_prefill_s += self.m.prefill_per_token_s * self.prompt_tokens

    def next_finish(self) -> tuple[float, int]:
        """When the next sequence completes if nothing else happens, and the decode steps until then."""
        n = self.running[0].finish_step - self.step
        return self.t + self.pending_prefill_s + n * self.step_s(), n

    def sync_to(self, now: float) -> None:
        """Bring the state to ``now`` (before any completion) so requests arriving now start at the right step."""
        if self.running:
            dt = now - self.t - self.pending_prefill_s
            n = int(max(0.0, dt) / self.step_s())
            self.step += min(n, self.running[0].finish_step - self.step - 1)
            self.pending_prefill_s = 0.0
        self.t = now

    def advance(self, n_steps: int, now: float) -> list[_Seq]:
        self.step += n_steps
        self.t = now
        self.pending_prefill_s = 0.0
        done = []
        while self.running and self.running[0].finish_step <= self.step:
            s = heapq.heappop(self.running)
            self.kv_base -= self.prompt_tokens - s.start_step
            done.append(s)
        return done


def simulate_round(
    spec: RoundSettings, workload: Workload, engine: EngineModel = EngineModel(),
    trainer: TrainerModel = TrainerModel(), *, seed: int = 0, filter_p: float = 0.0
) -> RoundTimeline:
    """One round on a simulated clock; returns its timeline (metrics via ``timeline.metrics()``). ``filter_p``: the
    share of groups dynamic sampling drops (zero reward variance); ``seed``: lengths and filtering."""
    rng = random.Random(seed)
    clock = ManualClock()
    extra = spec.max_extra_groups
    lengths = workload.lengths(spec.num_groups + extra, spec.group_size, rng)
    filtered = [rng.random() < filter_p for _ in lengths]
    rnd = Round(0, spec.replace(target_running=engine.max_running), clock)
    eng = _Engine(engine, workload.prompt_tokens)
    arrival = iter(rng.sample(range(10**7), 10**4) if engine.fcfs_shuffle else range(10**7))
    events: list[tuple[float, int, str, object]] = []  # (time, seq, kind, payload)
    seq = 0

    def push(t: float, kind: str, payload: object = None) -> None:
        nonlocal seq
        heapq.heappush(events, (t, seq, kind, payload))
        seq += 1

    def admit_new() -> None:
        for a in rnd.admit():
            for length in lengths[a.group_id]:
                # vLLM orders waiting requests by (priority, arrival); under FCFS all priorities are 0.
                heapq.heappush(eng.waiting, ((a.priority, next(arrival)), a.group_id, length))
        eng.admit()

    trainer_busy_until = -1.0
    engine_epoch = 0  # invalidates a scheduled engine event when the batch changed before it fired

    def schedule_engine() -> None:
        nonlocal engine_epoch
        engine_epoch += 1
        if eng.running:
            t, n = eng.next_finish()
            push(t, "engine", (engine_epoch, n))

    def set_contention(trainer_busy: bool) -> None:
        slow = 1.0 + engine.contended_slowdown * trainer_busy
        if slow == eng.slow:
            return
        if eng.running:
            eng.sync_to(clock.now())
            eng.slow = slow
            schedule_engine()
        eng.slow = slow

    def try_train() -> None:
        nonlocal trainer_busy_until
        if trainer_busy_until > clock.now():
            return
        d = rnd.take()
        if d is None:
            set_contention(False)
            return
        set_contention(True)
        work = trainer.call_overhead_s + trainer.step_overhead_s * d.steps_closed
        for gid in d.group_ids:
            work += (trainer.per_token_s * sum(lengths[gid]) if trainer.per_token_s else trainer.per_group_s)
        if eng.running or eng.waiting:
            work *= 1.0 + trainer.contended_slowdown
        trainer_busy_until = clock.now() + work
        push(trainer_busy_until, "trained", (clock.now(), d))

    admit_new()
    schedule_engine()
    while events:
        t, _, kind, payload = heapq.heappop(events)
        clock.advance_to(t)
        if kind == "engine":
            epoch, n = payload
            if epoch != engine_epoch:
                continue
            for s in eng.advance(n, t):
                if rnd.request_finished(s.group):
                    push(t + trainer.reward_s, "reward", s.group)
                    admit_new()  # hold: the frontier moved
            eng.admit()
            schedule_engine()
        elif kind == "reward":
            gid = payload
            if filtered[gid]:
                if rnd.filtered(gid):  # a replacement group enters mid-flight
                    eng.sync_to(clock.now())
                    admit_new()
                    schedule_engine()
            else:
                rnd.materialized(gid)
            try_train()
        elif kind == "trained":
            start, d = payload
            rnd.trained(d, start, t, trainer_version=0)
            try_train()
    rnd.check_publishable()
    rnd.published(clock.now(), clock.now() + trainer.publish_s)
    return rnd.timeline

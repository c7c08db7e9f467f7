"""Response-length workloads for the benchmark and the simulator's check against it (pure Python).

A workload fixes, per prompt group, the K response lengths that the rollout will produce: the bench sends each
request with ``max_tokens`` = that length and ``ignore_eos`` (``agent_loop.LengthProfileAgentLoop``), so the
engine does exactly the decode work of a reasoning/science RLVR round, whatever the tiny model would have said.

The shape mirrors what such rounds look like:
- per-prompt difficulty ``d ~ Beta(alpha, beta)``: hard prompts get long answers;
- correlated lengths inside a group: the group shares a base length ``min + (cap - min) * d**gamma`` and each
  response varies around it by a log-normal factor (``sigma_within``);
- a long tail: each response hits the length cap with probability ``cap_prob * d`` (truncated reasoning).

A multi-turn workload (``TurnProfile``, ``kind: multi_turn``) fixes per response its tool calls and, per turn, the
tokens the model writes and the environment's latency before the next turn (``agent_loop.TurnProfileAgentLoop``):
an agentic round, whose long tail is the environment's as much as the decoder's.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any


@dataclass(frozen=True)
class LengthProfile:
    name: str
    alpha: float  # difficulty ~ Beta(alpha, beta)
    beta: float
    min_frac: float  # shortest base length, as a fraction of the cap
    gamma: float  # base = min + (cap - min) * d**gamma: >1 keeps most groups short
    sigma_within: float  # log-normal spread of lengths inside a group
    cap_prob: float  # P(response hits the cap) = cap_prob * d

    @classmethod
    def from_mapping(cls, name: str, params: Mapping[str, float]) -> LengthProfile:
        known = {f.name for f in fields(cls)} - {"name"}
        unknown = set(params) - known
        missing = known - set(params)
        if unknown or missing:
            raise ValueError(f"bench workload {name!r}: unknown keys {sorted(unknown)}, missing {sorted(missing)} "
                             f"(expected {sorted(known)})")
        return cls(name=name, **{k: float(v) for k, v in params.items()})

    def group_lengths(self, rng: random.Random, k: int, cap: int, floor: int = 2) -> list[int]:
        """K response lengths (tokens) of one prompt group, each in [floor, cap]."""
        d = rng.betavariate(self.alpha, self.beta)
        lo = max(floor, self.min_frac * cap)
        base = lo + (cap - lo) * d**self.gamma
        out = []
        for _ in range(k):
            if rng.random() < self.cap_prob * d:
                out.append(cap)
            else:
                n = base * math.exp(rng.gauss(0.0, self.sigma_within) - self.sigma_within**2 / 2)
                out.append(int(min(cap, max(floor, round(n)))))
        return out


def round_lengths(profile: LengthProfile, seed: int, num_groups: int, k: int, cap: int) -> list[list[int]]:
    """The lengths of one round's R groups; the same seed gives the same round in every mode."""
    rng = random.Random(f"{profile.name}:{seed}")
    return [profile.group_lengths(rng, k, cap) for _ in range(num_groups)]


def describe(lengths: list[list[int]], cap: int) -> dict[str, float]:
    """Summary of a round's lengths: mean, p50/p90, max, share at the cap, mean within-group spread."""
    flat = sorted(x for g in lengths for x in g)
    n = len(flat)
    spread = [max(g) / max(1, min(g)) for g in lengths]
    return {
        "mean_tokens": sum(flat) / n,
        "p50_tokens": float(flat[n // 2]),
        "p90_tokens": float(flat[min(n - 1, int(0.9 * n))]),
        "max_tokens": float(flat[-1]),
        "at_cap_share": sum(1 for x in flat if x >= cap) / n,
        "group_max_over_min": sum(spread) / len(spread),
    }


@dataclass(frozen=True)
class TurnProfile:
    """A tool-calling round: per response ``calls ~ Binomial(max_calls, call_prob)`` tool calls, so ``calls + 1``
    model turns; a turn's length is the group's base ``min + (cap - min) * d`` (``d ~ Beta(alpha, beta)``, cap =
    the response cap shared by the turns) times a log-normal factor (``sigma_within``); each call waits a log-normal
    latency (median ``latency_p50_s``, shape ``latency_sigma``: p99/p50 = exp(2.326 sigma)) capped at
    ``latency_max_s``."""

    name: str
    alpha: float
    beta: float
    min_frac: float
    sigma_within: float
    max_calls: int
    call_prob: float
    latency_p50_s: float
    latency_sigma: float
    latency_max_s: float
    # tokens kept per tool turn for the chat template and the tool's reply (they share data.max_response_length;
    # measured 15 with the embedded tokenizer)
    tool_turn_tokens: int = 16

    def turn_cap(self, cap: int) -> int:
        """The longest model turn: the response cap shared by ``max_calls + 1`` turns and the tool turns."""
        return max(2, (cap - self.max_calls * self.tool_turn_tokens) // (self.max_calls + 1) - 4)

    def group_plans(self, rng: random.Random, k: int, cap: int, floor: int = 2) -> list[dict[str, list]]:
        """K plans of one prompt group: ``{"lengths": [tokens per model turn], "latencies": [s per tool call]}``."""
        turn_cap = self.turn_cap(cap)
        d = rng.betavariate(self.alpha, self.beta)
        lo = max(floor, self.min_frac * turn_cap)
        base = lo + (turn_cap - lo) * d
        plans = []
        for _ in range(k):
            calls = sum(rng.random() < self.call_prob for _ in range(self.max_calls))
            lengths = [int(min(turn_cap, max(floor, round(
                base * math.exp(rng.gauss(0.0, self.sigma_within) - self.sigma_within**2 / 2)))))
                for _ in range(calls + 1)]
            latencies = [min(self.latency_max_s, self.latency_p50_s * math.exp(rng.gauss(0.0, self.latency_sigma)))
                         for _ in range(calls)]
            plans.append({"lengths": lengths, "latencies": latencies})
        return plans


def round_turn_plans(profile: TurnProfile, seed: int, num_groups: int, k: int, cap: int) -> list[list[dict]]:
    """The plans of one round's R groups; the same seed gives the same round in every mode."""
    rng = random.Random(f"{profile.name}:{seed}")
    return [profile.group_plans(rng, k, cap) for _ in range(num_groups)]


def describe_turns(plans: list[list[dict]]) -> dict[str, float]:
    """Summary of a multi-turn round: model tokens, tool calls and their latencies."""
    tokens = sorted(sum(p["lengths"]) for g in plans for p in g)
    calls = [len(p["latencies"]) for g in plans for p in g]
    lat = sorted(x for g in plans for p in g for x in p["latencies"])
    n = len(tokens)
    return {
        "mean_tokens": sum(tokens) / n, "p90_tokens": float(tokens[min(n - 1, int(0.9 * n))]),
        "mean_tool_calls": sum(calls) / n, "responses_with_calls": sum(1 for c in calls if c) / n,
        "latency_p50_s": lat[len(lat) // 2] if lat else 0.0,
        "latency_p99_s": lat[min(len(lat) - 1, int(0.99 * len(lat)))] if lat else 0.0,
        "latency_max_s": lat[-1] if lat else 0.0,
    }


def profile_from_mapping(name: str, params: Mapping[str, Any]) -> LengthProfile | TurnProfile:
    """A bench profile from config: ``kind: multi_turn`` a ``TurnProfile``, else (``single_turn``) a
    ``LengthProfile``; unknown or missing keys are one error naming them."""
    params = dict(params)
    kind = params.pop("kind", "single_turn")
    if kind == "single_turn":
        return LengthProfile.from_mapping(name, params)
    if kind != "multi_turn":
        raise ValueError(f"bench workload {name!r}: kind={kind!r}, expected single_turn or multi_turn")
    known = {f.name for f in fields(TurnProfile)} - {"name"}
    required = known - {"tool_turn_tokens"}
    unknown, missing = set(params) - known, required - set(params)
    if unknown or missing:
        raise ValueError(f"bench workload {name!r}: unknown keys {sorted(unknown)}, missing {sorted(missing)} "
                         f"(expected {sorted(known)})")
    ints = {"max_calls", "tool_turn_tokens"}
    return TurnProfile(name=name, **{k: int(v) if k in ints else float(v) for k, v in params.items()})

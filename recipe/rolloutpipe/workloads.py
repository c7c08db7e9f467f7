"""Response-length workloads for the benchmark and the simulator's check against it (pure Python).

A workload fixes, per prompt group, the K response lengths that the rollout will produce: the bench sends each
request with ``max_tokens`` = that length and ``ignore_eos`` (``agent_loop.LengthProfileAgentLoop``), so the
engine does exactly the decode work of a reasoning/science RLVR round, whatever the tiny model would have said.

The shape mirrors what such rounds look like:
- per-prompt difficulty ``d ~ Beta(alpha, beta)``: hard prompts get long answers;
- correlated lengths inside a group: the group shares a base length ``min + (cap - min) * d**gamma`` and each
  response varies around it by a log-normal factor (``sigma_within``);
- a long tail: each response hits the length cap with probability ``cap_prob * d`` (truncated reasoning).
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from dataclasses import dataclass, fields


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

"""The embedded verifiable task: two-number arithmetic with an exact-answer reward.

``compute_score`` follows verl's custom reward function signature (``custom_reward_function.path/name``).
"""

from __future__ import annotations

import random
import re

DATA_SOURCE = "rolloutpipe/arith"
_ANSWER = re.compile(r"-?\d+")


def make_problem(rng: random.Random) -> tuple[str, str]:
    """``"37+58="`` -> ``"95"``. Mixed difficulty: one- and two-digit operands, + and -."""
    digits = rng.choice((1, 2, 2))
    a, b = rng.randrange(10**digits), rng.randrange(10**digits)
    op = rng.choice("+-")
    return f"{a}{op}{b}=", str(a + b if op == "+" else a - b)


def demonstration(question: str, answer: str, rng: random.Random, restate_prob: float) -> str:
    """What the warm start imitates: a demonstrator that, with probability ``restate_prob``, writes the whole
    equation (``"37+58=95"``) instead of the result alone. The exact-answer reward reads the *first* integer, so a
    restated answer scores 0 even when its result is right: RL has to learn the answer format the verifier
    accepts, the first thing RLVR learns on a real model (and one a tiny model can learn in a few hundred groups)."""
    return f"{question}{answer}" if rng.random() < restate_prob else answer


def extract_answer(solution_str: str) -> str | None:
    m = _ANSWER.search(solution_str)
    return m.group(0) if m else None


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None) -> float:
    """1.0 if the first integer in the response equals the ground truth, else 0.0."""
    if data_source != DATA_SOURCE:
        raise ValueError(f"rolloutpipe task reward got data_source={data_source!r}, expected {DATA_SOURCE!r}")
    return 1.0 if extract_answer(solution_str) == str(ground_truth).strip() else 0.0

"""The embedded verifiable tasks: two-number arithmetic with an exact-answer reward, answered directly (``arith``)
or, in the agentic variant (``arith_tool``), optionally through a calculator tool over several turns.

``compute_score`` follows verl's custom reward function signature (``custom_reward_function.path/name``);
``compute_score_sandbox`` is the same reward as an ``async`` function that answers after a seeded heavy-tailed
latency, like a sandbox or a judge (``reward_fn=sandbox``: config/reward_fn/sandbox.yaml, docs/agentic.md).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import random
import re
import statistics

DATA_SOURCE = "rolloutpipe/arith"
TOOL_DATA_SOURCE = "rolloutpipe/arith_tool"  # the same problems; the model may call the calculator first
TOOL_NAME = "calc"
_ANSWER = re.compile(r"-?\d+")
_EXPRESSION = re.compile(r"^\s*(-?\d{1,6})\s*([+-])\s*(-?\d{1,6})\s*=?\s*$")
# the role line that opens the model's final turn, as the reward sees it (verl decodes without special tokens)
_ASSISTANT_TURN = "assistant\n"


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


def tool_call(question: str) -> str:
    """What the agentic warm start imitates when it uses the calculator: one hermes-format call with the question as
    the expression (verl's ``hermes`` tool parser reads it)."""
    call = {"name": TOOL_NAME, "arguments": {"expr": question.removesuffix("=")}}
    return f"<tool_call>{json.dumps(call, separators=(',', ':'))}</tool_call>"


def evaluate(expr: str) -> str:
    """The calculator: ``"37+58"`` -> ``"95"``; anything else -> an error text the model sees as the tool's answer."""
    m = _EXPRESSION.match(str(expr))
    if not m:
        return "error: expected a+b or a-b"
    a, op, b = int(m.group(1)), m.group(2), int(m.group(3))
    return str(a + b if op == "+" else a - b)


def environment_latency_s(seed: float, key: str, p50_s: float, sigma: float, max_s: float) -> float:
    """An environment's latency (tool call, sandboxed reward) for ``key``: log-normal with median ``p50_s`` and shape
    ``sigma`` (p99/p50 = exp(2.326 sigma): 12.9x at sigma 1.1), capped at ``max_s``. A function of (``seed``,
    ``key``) only -- the quantile of a uniform hashed from both -- so every mode and every rerun waits the same time
    for the same call, and paired bench rounds compare like with like."""
    digest = hashlib.sha256(f"{seed}:{key}".encode()).digest()
    u = (int.from_bytes(digest[:8], "big") + 0.5) / 2**64
    return min(max_s, p50_s * math.exp(sigma * statistics.NormalDist().inv_cdf(u)))


def extract_answer(solution_str: str) -> str | None:
    m = _ANSWER.search(solution_str)
    return m.group(0) if m else None


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None) -> float:
    """1.0 if the first integer in the response equals the ground truth, else 0.0."""
    if data_source == TOOL_DATA_SOURCE:
        # the final turn's first integer: after a tool call the answer is what the model wrote once the tool had
        # answered (the tool's own output is not the model's answer); a final turn that still calls a tool
        # (turns or tokens ran out) has no answer
        solution_str = solution_str.rsplit(_ASSISTANT_TURN, 1)[-1]
        if "<tool_call>" in solution_str:
            return 0.0
    elif data_source != DATA_SOURCE:
        raise ValueError(f"rolloutpipe task reward got data_source={data_source!r}, expected {DATA_SOURCE!r} or "
                         f"{TOOL_DATA_SOURCE!r}")
    return 1.0 if extract_answer(solution_str) == str(ground_truth).strip() else 0.0


async def compute_score_sandbox(data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None,
                                *, seed: float, latency_p50_s: float, latency_sigma: float,
                                latency_max_s: float) -> float:
    """``compute_score`` behind a slow environment: the score comes back after ``environment_latency_s`` of
    (``seed``, the response), awaited without holding a thread -- verl's reward loop awaits an ``async`` reward
    function, so many responses are scored at once while the engine goes on generating."""
    await asyncio.sleep(environment_latency_s(seed, solution_str, latency_p50_s, latency_sigma, latency_max_s))
    return compute_score(data_source, solution_str, ground_truth, extra_info)

"""A reward function with every fault the guard must absorb (a test fixture: it injects what real code can't)."""

import math
import time

from recipe.rolloutpipe.task import compute_score as real_score

SLOW_CALLS_FINISHED = 0  # lets a test see that the guard returned before the slow call ended


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    key = sum(map(ord, solution_str)) % 10
    if key == 0:
        raise RuntimeError("reward service unavailable")
    if key == 1:
        return math.nan
    if key == 2:
        return None
    if key == 3:
        global SLOW_CALLS_FINISHED
        time.sleep(1.0)  # beyond the test's timeout_s
        SLOW_CALLS_FINISHED += 1
    return real_score(data_source, solution_str, ground_truth, extra_info)


CALL_LOG: list[tuple[str, float, float]] = []  # (response, start, end) of every async call that ended


async def compute_score_async(data_source, solution_str, ground_truth, extra_info=None, *, delay_s=0.0, **kwargs):
    """The same faults from an ``async`` reward function (a sandbox or judge client); ``delay_s``: its latency."""
    import asyncio

    start = time.monotonic()
    key = sum(map(ord, solution_str)) % 10
    if key == 3:
        delay_s = max(delay_s, 1.0)  # beyond the test's timeout_s: the guard cancels it
    await asyncio.sleep(delay_s)
    if key == 0:
        raise RuntimeError("reward service unavailable")
    score = math.nan if key == 1 else None if key == 2 else real_score(data_source, solution_str, ground_truth)
    CALL_LOG.append((solution_str, start, time.monotonic()))
    return score

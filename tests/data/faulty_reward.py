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

"""A reward function with every fault the guard must absorb (a test fixture: it injects what real code can't)."""

import math
import time

from recipe.rolloutpipe.task import compute_score as real_score


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    key = sum(map(ord, solution_str)) % 10
    if key == 0:
        raise RuntimeError("reward service unavailable")
    if key == 1:
        return math.nan
    if key == 2:
        return None
    if key == 3:
        time.sleep(1.0)  # beyond the test's timeout_s
    return real_score(data_source, solution_str, ground_truth, extra_info)

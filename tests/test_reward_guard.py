"""Bad reward output is handled by policy: scored 0 and counted, or one clear error; never a hang. (On the real
stack: tests/test_data_check.py, one launch with bad rows and this faulty reward.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from recipe.rolloutpipe.reward_guard import RewardFunctionError, _load, guarded_score
from recipe.rolloutpipe.task import DATA_SOURCE

ROOT = Path(__file__).resolve().parents[1]
FAULTY = str(ROOT / "tests" / "data" / "faulty_reward.py")


def answer_with_key(k: int, correct: str = "12") -> str:
    """A response whose fault key (sum of code points % 10) is k, still starting with the right answer."""
    for pad in range(200):
        s = correct + " " + "a" * pad
        if sum(map(ord, s)) % 10 == k:
            return s
    raise AssertionError


@pytest.mark.parametrize("key", [0, 1, 2, 3])
def test_faults_score_zero_and_are_flagged(key):
    user = _load(str(Path(FAULTY).resolve()), "compute_score").__globals__  # the guard's copy of the module
    slow_done = user["SLOW_CALLS_FINISHED"]
    out = guarded_score(DATA_SOURCE, answer_with_key(key), "12", user_path=FAULTY, timeout_s=0.2)
    assert out == {"score": 0.0, "acc": 0.0, "reward_error": 1.0}
    assert user["SLOW_CALLS_FINISHED"] == slow_done  # the slow call (key 3) was not waited for: it is still running


def test_good_scores_pass_through():
    out = guarded_score(DATA_SOURCE, answer_with_key(5), "12", user_path=FAULTY, timeout_s=0.2)
    assert out == {"score": 1.0, "acc": 1.0, "reward_error": 0.0}
    assert guarded_score(DATA_SOURCE, answer_with_key(5, "13"), "12", user_path=FAULTY)["score"] == 0.0


def test_raise_policy_names_function_and_cause():
    with pytest.raises(RewardFunctionError, match=r"compute_score in .*faulty_reward.py failed \(RuntimeError: "
                                                  r"reward service unavailable\).*on_error=zero"):
        guarded_score(DATA_SOURCE, answer_with_key(0), "12", user_path=FAULTY, on_error="raise")
    with pytest.raises(RewardFunctionError, match="has no function 'nope'"):
        guarded_score(DATA_SOURCE, "1", "1", user_path=FAULTY, user_name="nope")

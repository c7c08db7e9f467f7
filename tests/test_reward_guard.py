"""Bad reward output is handled by policy: scored 0 and counted, or one clear error; never a hang. (On the real
stack: tests/test_resume.py's killed-replicas launch, with bad rows and this faulty reward.)"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from recipe.rolloutpipe.reward_guard import RewardFunctionError, _load, guarded_score, guarded_score_async, is_async
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
    assert out.pop("reward_s") >= (0.2 if key == 3 else 0.0)  # the call's seconds (a timeout: the whole wait)
    assert out == {"score": 0.0, "acc": 0.0, "reward_error": 1.0}
    assert user["SLOW_CALLS_FINISHED"] == slow_done  # the slow call (key 3) was not waited for: it is still running


def test_good_scores_pass_through():
    out = guarded_score(DATA_SOURCE, answer_with_key(5), "12", user_path=FAULTY, timeout_s=0.2)
    assert 0.0 <= out.pop("reward_s") < 0.2
    assert out == {"score": 1.0, "acc": 1.0, "reward_error": 0.0}
    assert guarded_score(DATA_SOURCE, answer_with_key(5, "13"), "12", user_path=FAULTY)["score"] == 0.0


def test_raise_policy_names_function_and_cause():
    with pytest.raises(RewardFunctionError, match=r"compute_score in .*faulty_reward.py failed \(RuntimeError: "
                                                  r"reward service unavailable\).*on_error=zero"):
        guarded_score(DATA_SOURCE, answer_with_key(0), "12", user_path=FAULTY, on_error="raise")
    with pytest.raises(RewardFunctionError, match="has no function 'nope'"):
        guarded_score(DATA_SOURCE, "1", "1", user_path=FAULTY, user_name="nope")


def _run_async(response: str, **kw):
    return asyncio.run(guarded_score_async(DATA_SOURCE, response, "12", user_path=FAULTY,
                                           user_name="compute_score_async", **kw))


def test_async_reward_kind_is_kept():
    # verl's reward loop awaits an async function and runs a plain one in a thread: main.py picks the guard's twin
    assert is_async(FAULTY, "compute_score_async") and not is_async(FAULTY, "compute_score")


@pytest.mark.parametrize("key", [0, 1, 2, 3])
def test_async_faults_score_zero_and_are_flagged(key):
    out = _run_async(answer_with_key(key), timeout_s=0.2)
    assert out.pop("reward_s") >= (0.2 if key == 3 else 0.0)
    assert out == {"score": 0.0, "acc": 0.0, "reward_error": 1.0}


def test_async_good_score_and_its_latency():
    out = _run_async(answer_with_key(5), timeout_s=5.0, delay_s=0.1)
    assert out["score"] == 1.0 and out["reward_error"] == 0.0 and out["reward_s"] >= 0.1
    with pytest.raises(RewardFunctionError, match=r"compute_score_async in .*timed out after 0.2s"):
        _run_async(answer_with_key(3), timeout_s=0.2, on_error="raise")


def test_async_calls_overlap():
    """Slow async scores are awaited side by side (verl's reward loop gathers them), not one after another: every
    call starts before the first one ends."""
    user = _load(str(Path(FAULTY).resolve()), "compute_score_async").__globals__
    user["CALL_LOG"].clear()
    responses = [answer_with_key(5) + " " * i for i in range(0, 80, 10)]  # distinct responses with the same key
    responses = [r for r in responses if sum(map(ord, r)) % 10 == 5]

    async def score_all():
        return await asyncio.gather(*(guarded_score_async(DATA_SOURCE, r, "12", user_path=FAULTY,
                                                          user_name="compute_score_async", delay_s=0.3)
                                      for r in responses))

    outs = asyncio.run(score_all())
    assert len(responses) >= 4 and all(o["score"] == 1.0 for o in outs)
    starts, ends = [s for _, s, _ in user["CALL_LOG"]], [e for _, _, e in user["CALL_LOG"]]
    assert len(starts) == len(responses) and max(starts) < min(ends)


def test_reward_fn_sandbox_is_awaited_through_the_guard():
    """``reward_fn=sandbox``: the embedded task's async reward behind a slow environment; main.py routes it through
    the guard's async twin, with its latency settings passed on."""
    from hydra import compose, initialize_config_dir

    from recipe.rolloutpipe.main import CONFIG_DIR, apply_reward_guard
    from recipe.rolloutpipe.task import compute_score, compute_score_sandbox

    task_py = str(ROOT / "recipe" / "rolloutpipe" / "task.py")
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        cfg = compose(config_name="rolloutpipe",
                      overrides=["reward_fn=sandbox", f"reward.custom_reward_function.path={task_py}"])
    apply_reward_guard(cfg)
    fn = cfg.reward.custom_reward_function
    assert fn.name == "guarded_score_async" and fn.path.endswith("reward_guard.py")
    kw = dict(fn.reward_kwargs)
    assert (kw["user_name"], kw["user_path"]) == ("compute_score_sandbox", task_py)
    assert kw["latency_max_s"] < kw["timeout_s"]  # a slow score is slow, not an error
    latency = {k: kw[k] for k in ("seed", "latency_p50_s", "latency_sigma", "latency_max_s")}
    for response, truth in (("95", "95"), ("37+58=95", "95"), ("12", "13")):
        got = asyncio.run(compute_score_sandbox(DATA_SOURCE, response, truth, **{**latency, "latency_p50_s": 0.001}))
        assert got == compute_score(DATA_SOURCE, response, truth)

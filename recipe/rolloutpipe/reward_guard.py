"""A guard around the user's reward function: a bad reward never hangs or kills a round, and is counted.

``rolloutpipe.reward_guard`` wraps ``reward.custom_reward_function`` (main.py rewires verl's config to call
:func:`guarded_score`, or :func:`guarded_score_async` when the user's function is ``async``, with the user's
path/name in ``reward_kwargs``). verl's reward loop awaits an ``async`` function and runs a plain one in a thread, so
the guard keeps that kind: a slow ``async`` reward (a sandbox, a judge) is awaited concurrently for every response
in flight, without holding a thread each. Every response carries ``reward_s``, its reward call's seconds (the round
metrics and the timeline show where a slow reward's time goes). Policy ``on_error``:

- ``zero`` (default): an exception, a non-finite or missing (None) score, or a call slower than ``timeout_s``
  gives reward 0 for that response; the response is flagged ``reward_error=1`` and the round's metrics count it
  (``rolloutpipe/reward_errors``). The group still trains, so no group is lost or trained twice. (A call that
  never returns keeps one of the guard's threads busy; later calls still time out instead of hanging the round.)
- ``raise``: the first such response stops the run with one message naming the reward function and the cause.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import importlib.util
import inspect
import math
import sys
import time
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

_POOL = concurrent.futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="rolloutpipe-reward")


class RewardFunctionError(RuntimeError):
    pass


@cache
def _load(path: str, name: str) -> Callable[..., Any]:
    spec = importlib.util.spec_from_file_location(f"rolloutpipe_user_reward_{abs(hash(path))}", path)
    if spec is None or spec.loader is None:
        raise RewardFunctionError(f"rolloutpipe: cannot load reward module {path!r} "
                                  "(reward.custom_reward_function.path)")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    if not hasattr(module, name):
        raise RewardFunctionError(f"rolloutpipe: {path} has no function {name!r} (reward.custom_reward_function.name)")
    return getattr(module, name)


def _check(score: Any) -> float:
    value = score.get("score") if isinstance(score, dict) else score
    if value is None:
        raise ValueError("returned None")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"returned {value}")
    return value


def _outcome(score: Any, error: BaseException | None, seconds: float, on_error: str, user_path: str,
             user_name: str, timeout_s: float) -> dict[str, float]:
    """The policy, for both kinds of reward function: a checked score, or 0 and the error flag, or one error."""
    try:
        if error is not None:
            raise error
        value = _check(score)
        return {"score": value, "acc": value, "reward_error": 0.0, "reward_s": seconds}
    except Exception as e:  # every failure of user code goes through the policy
        timed_out = isinstance(e, (concurrent.futures.TimeoutError, asyncio.TimeoutError))
        cause = f"timed out after {timeout_s:g}s" if timed_out else f"{type(e).__name__}: {e}"
        if on_error == "raise":
            raise RewardFunctionError(
                f"rolloutpipe: reward function {user_name} in {user_path} failed ({cause}); set "
                "rolloutpipe.reward_guard.on_error=zero to score such responses 0 and count them") from e
        return {"score": 0.0, "acc": 0.0, "reward_error": 1.0, "reward_s": seconds}


def guarded_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None, *,
                  user_path: str, user_name: str = "compute_score", on_error: str = "zero",
                  timeout_s: float = 10.0, **kwargs: Any) -> dict[str, float]:
    """A plain (blocking) user reward function, run in the guard's threads with a timeout."""
    fn = _load(str(Path(user_path).resolve()), user_name)
    t0 = time.monotonic()
    future = _POOL.submit(fn, data_source, solution_str, ground_truth, extra_info, **kwargs)
    score, error = None, None
    try:
        score = future.result(timeout=timeout_s)
    except Exception as e:
        error = e
    return _outcome(score, error, time.monotonic() - t0, on_error, user_path, user_name, timeout_s)


async def guarded_score_async(data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None,
                              *, user_path: str, user_name: str = "compute_score", on_error: str = "zero",
                              timeout_s: float = 10.0, **kwargs: Any) -> dict[str, float]:
    """An ``async`` user reward function, awaited with a timeout (cancelled when it runs over)."""
    fn = _load(str(Path(user_path).resolve()), user_name)
    t0 = time.monotonic()
    score, error = None, None
    try:
        score = await asyncio.wait_for(fn(data_source, solution_str, ground_truth, extra_info, **kwargs), timeout_s)
    except Exception as e:
        error = e
    return _outcome(score, error, time.monotonic() - t0, on_error, user_path, user_name, timeout_s)


def is_async(user_path: str, user_name: str) -> bool:
    """Whether the user's reward function is ``async`` (the guard then awaits it: :func:`guarded_score_async`)."""
    return inspect.iscoroutinefunction(_load(str(Path(user_path).resolve()), user_name))

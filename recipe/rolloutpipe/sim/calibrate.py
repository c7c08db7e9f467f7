"""Fitting the simulator's machine models to measured times (shared by ``--from-run`` and ``--from-bench``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from ..pipeline import RoundSettings
from .simulator import EngineModel, TrainerModel, simulate_round


def bisect_increasing(f: Callable[[float], float], target: float, lo: float, hi: float, *,
                      geometric: bool = False, iterations: int = 60, tol: float = 1e-6) -> float:
    """``x`` in [lo, hi] with ``f(x) ≈ target``, for ``f`` increasing in ``x``: halved until the interval is within
    ``tol`` (relative if ``geometric``, else absolute; measured times have ms resolution, so 1e-6 is ample) or after
    ``iterations`` halvings."""
    for _ in range(iterations):
        if (hi / lo - 1 if geometric else hi - lo) <= tol:
            break
        mid = (lo * hi) ** 0.5 if geometric else (lo + hi) / 2
        lo, hi = (mid, hi) if f(mid) < target else (lo, mid)
    return (lo * hi) ** 0.5 if geometric else (lo + hi) / 2


def scaled_engine(base: EngineModel, scale: float) -> EngineModel:
    """The same engine, every cost multiplied by ``scale`` (a faster or slower machine)."""
    return replace(base, step_base_s=base.step_base_s * scale, step_per_seq_s=base.step_per_seq_s * scale,
                   prefill_per_token_s=base.prefill_per_token_s * scale)


def fit_engine_scale(spec: RoundSettings, workload, base: EngineModel, trainer: TrainerModel,
                     rollout_s: float, seed: int = 0) -> EngineModel:
    """``base`` scaled so that the simulated round's rollout lasts ``rollout_s`` (the measured one)."""
    scale = bisect_increasing(
        lambda s: simulate_round(spec, workload, scaled_engine(base, s), trainer,
                                 seed=seed).metrics()["rolloutpipe/rollout_s"],
        rollout_s, 1e-4, 1e4, geometric=True)
    return scaled_engine(base, scale)

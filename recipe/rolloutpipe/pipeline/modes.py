"""The names of RolloutPipe's modes, in one place (config values, bench and curve labels, timelines)."""

from __future__ import annotations

from enum import Enum


class Mode(str, Enum):
    """``rolloutpipe.mode``: how a round is pipelined (a ``str``, so config values compare equal)."""

    SYNC = "sync"  # serial baseline on the recipe's code path: train once the whole round is in
    CGP = "cgp"  # complete-group pipelining, engine FCFS admission
    CGP_FGD = "cgp_fgd"  # + frontier-group dispatch
    CGP_FGD_ADAPTIVE = "cgp_fgd_adaptive"  # + a frontier width that keeps the engine full (simulator)

    def __str__(self) -> str:
        return self.value


class FgdStrength(str, Enum):
    """``rolloutpipe.fgd_strength``: how FGD orders the engine."""

    HOLD = "hold"  # only frontier groups enter the engine
    PRIORITY = "priority"  # everything enters; vLLM's priority scheduler serves the frontier first

    def __str__(self) -> str:
        return self.value


TRAINER_MODES = (Mode.SYNC, Mode.CGP, Mode.CGP_FGD)  # the modes the real trainer runs
STOCK = "stock"  # verl's own trainer (rolloutpipe.trainer=stock): the reference every speed figure is against

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
    PACED = "paced"  # the frontier and the next one: F_w groups enter together once fewer than F_w are unfinished

    def __str__(self) -> str:
        return self.value


TRAINER_MODES = (Mode.SYNC, Mode.CGP, Mode.CGP_FGD)  # the modes the real trainer runs


class TrainUnit(str, Enum):
    """``rolloutpipe.train_unit``: what one trainer call takes."""

    STEP = "step"  # one optimizer step (its U groups, once all are in)
    STEPS = "steps"  # every whole step already in: one call per step while the trainer keeps up, one for a
    # backlog's steps when it fell behind
    GROUPS = "groups"  # the complete groups there are (gradients accumulated, the step taken with the U-th)

    @property
    def whole_step(self) -> bool:
        """A call takes whole optimizer steps only."""
        return self is not TrainUnit.GROUPS

    @property
    def ready_steps(self) -> bool:
        """A call takes every whole step ready (``CompleteGroupFIFO.take``)."""
        return self is TrainUnit.STEPS

    def __str__(self) -> str:
        return self.value


STOCK = "stock"  # verl's own trainer (rolloutpipe.trainer=stock): the reference every speed figure is against


AUTO_WIDTH = "auto"  # rolloutpipe.frontier_width=auto: F_w from the last round's measured times
ENGINE_WIDTH = "engine"  # rolloutpipe.frontier_width=engine: F_w whose requests fill the engine's slots twice over
WIDTH_WORDS = (AUTO_WIDTH, ENGINE_WIDTH)


"""The names of RolloutPipe's modes, in one place (config values, bench and curve labels, timelines)."""

from __future__ import annotations

from enum import Enum
from typing import NamedTuple


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

# ``rolloutpipe.train_unit``: what one trainer call takes. step: one optimizer step (its U groups, once all are in);
# steps: every whole step already in (one call per step while the trainer keeps up, one for a backlog's steps when
# it fell behind); groups: the complete groups there are (gradients accumulated, the step taken with the U-th)
TRAIN_UNITS = ("step", "steps", "groups")
WHOLE_STEP_UNITS = ("step", "steps")  # units whose calls take whole optimizer steps only
STOCK = "stock"  # verl's own trainer (rolloutpipe.trainer=stock): the reference every speed figure is against


AUTO_WIDTH = "auto"  # rolloutpipe.frontier_width=auto: F_w from the last round's measured times
ENGINE_WIDTH = "engine"  # rolloutpipe.frontier_width=engine: F_w whose requests fill the engine's slots twice over
WIDTH_WORDS = (AUTO_WIDTH, ENGINE_WIDTH)


# The bench's (and the simulator check's) mode strings:
# ``mode[:fgd_strength][/frontier_width][+train_unit][@pool]``, e.g. ``cgp``, ``cgp_fgd:priority``,
# ``cgp_fgd:hold/4``, ``cgp_fgd:hold/auto``, ``cgp_fgd:hold/engine``, ``cgp_fgd:hold+groups``
# (``rolloutpipe.train_unit=groups``; ``+steps``, ``+step``),
# ``stock@rollout`` (the bench's orchestration -- driver, task runner, Ray's daemons -- pinned to the rollout pool's
# cores for that mode's rounds; ``@trainer``: the trainer's; none: ``rolloutpipe.bench.orchestration``).
ORCHESTRATION_PLACES = ("rollout", "trainer")


class ModeSpec(NamedTuple):
    mode: str  # sync | cgp | cgp_fgd (| stock in the bench)
    fgd_strength: str | None  # hold | priority | paced | None (the config's)
    frontier_width: int | str | None  # a number, "auto", "engine", or None: the config's F_w
    train_unit: str | None = None  # step | steps | groups | None (the config's)
    orchestration: str | None = None  # rollout | trainer | None (the bench's setting): where orchestration runs


def parse_mode_spec(spec: str) -> ModeSpec:
    spec, _, place = spec.partition("@")
    spec, _, unit = spec.partition("+")
    head, _, width = spec.partition("/")
    mode, _, strength = head.partition(":")
    return ModeSpec(mode, strength or None, (width if width in WIDTH_WORDS else int(width)) if width else None,
                    unit or None, place or None)

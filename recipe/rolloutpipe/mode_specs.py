"""The bench's mode strings (pure Python, below both the bench and the simulator's bench check, which read them).

``mode[:fgd_strength][/frontier_width][+train_unit][@pool]``, e.g. ``cgp``, ``cgp_fgd:priority``, ``cgp_fgd:hold/4``,
``cgp_fgd:hold/auto``, ``cgp_fgd:hold/engine``, ``cgp_fgd:hold+groups`` (``rolloutpipe.train_unit=groups``; ``+steps``,
``+step``), ``stock@rollout`` (the bench's orchestration -- driver, task runner, Ray's daemons -- pinned to the
rollout pool's cores for that mode's rounds; ``@trainer``: the trainer's; none: ``rolloutpipe.bench.orchestration``).
A spec names what differs from the run's config; ``RoundSettings`` are resolved from both
(``config_check.round_settings``), so a bench round and a training round of the same settings run the same code.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from .pipeline.modes import WIDTH_WORDS, FgdStrength

ORCHESTRATION_PLACES = ("rollout", "trainer")


class ModeSpec(NamedTuple):
    mode: str  # sync | cgp | cgp_fgd | stock
    fgd_strength: str | None  # hold | priority | paced | None (the config's)
    frontier_width: int | str | None  # a number, "auto", "engine", or None: the config's F_w
    train_unit: str | None = None  # step | steps | groups | None (the config's)
    orchestration: str | None = None  # rollout | trainer | None (the bench's setting): where orchestration runs

    def config_values(self, config_strength: str, config_width: int | str | None) -> dict[str, Any]:
        """The ``rolloutpipe.*`` values this spec replaces. The width is the spec's, else the config's unless the
        strength is paced, which takes its own (a config width sized for hold would narrow paced's engine width)."""
        strength = self.fgd_strength or config_strength
        width = self.frontier_width or (None if strength == FgdStrength.PACED else config_width)
        values: dict[str, Any] = {"mode": self.mode, "fgd_strength": strength, "frontier_width": width}
        if self.train_unit is not None:
            values["train_unit"] = self.train_unit
        return values


def parse_mode_spec(spec: str) -> ModeSpec:
    spec, _, place = spec.partition("@")
    spec, _, unit = spec.partition("+")
    head, _, width = spec.partition("/")
    mode, _, strength = head.partition(":")
    return ModeSpec(mode, strength or None, (width if width in WIDTH_WORDS else int(width)) if width else None,
                    unit or None, place or None)

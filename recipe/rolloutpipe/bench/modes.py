"""The bench's mode strings (pure Python): ``mode[:fgd_strength][/frontier_width][+groups]``, e.g. ``cgp``,
``cgp_fgd:priority``, ``cgp_fgd:hold/4``, ``cgp_fgd:hold+groups`` (``rolloutpipe.train_unit=groups``: accumulate
each complete group as it arrives). Parsed here once for the bench runner and the simulator check."""

from __future__ import annotations

from typing import NamedTuple


class ModeSpec(NamedTuple):
    mode: str  # sync | cgp | cgp_fgd
    fgd_strength: str | None  # hold | priority | None (the config's)
    frontier_width: int | None  # None: the config's F_w
    train_unit: str | None = None  # step | groups | None (the config's)


def parse_mode_spec(spec: str) -> ModeSpec:
    spec, _, unit = spec.partition("+")
    head, _, width = spec.partition("/")
    mode, _, strength = head.partition(":")
    return ModeSpec(mode, strength or None, int(width) if width else None, unit or None)

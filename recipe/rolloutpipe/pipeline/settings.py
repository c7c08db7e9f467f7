"""RoundSettings: what a round runs with -- one frozen object, built by one resolver.

The trainer (from the Hydra config: ``config_check.round_settings``), the bench (the config plus a mode spec), the
simulator and the tests all hold a ``RoundSettings``; its ``record()`` goes whole into every timeline and bench
record, and ``from_record`` reads it back (``sim --from-run``, ``sim --from-bench``). The values themselves have one
home, the yaml: the resolver takes every config value it needs and defaults none of them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from .frontier import resolve_frontier_width
from .modes import AUTO_WIDTH, FgdStrength, Mode, TrainUnit


@dataclass(frozen=True)
class RoundSettings:
    mode: Mode
    num_groups: int  # R = data.train_batch_size (or the bench's R)
    group_size: int  # K = actor_rollout_ref.rollout.n
    step_groups: int  # U = actor_rollout_ref.actor.ppo_mini_batch_size: groups per optimizer step
    fgd_strength: FgdStrength
    frontier_width: int  # F_w, resolved (with frontier_auto: this round's, measured from the last one's times)
    train_unit: TrainUnit
    frontier_auto: bool = False  # frontier_width=auto: each round's F_w from the last one's (MeasuredFrontierWidth)
    max_buffered_groups: int | None = None  # bound on groups between admission and consumption (None: the round)
    max_extra_groups: int = 0  # replacements per round for filtered groups (dynamic sampling)
    filter_metric: str | None = None  # dynamic sampling: drop groups whose K values of this metric are all equal
    target_running: int | None = None  # cgp_fgd_adaptive (simulator): the engine's running slots to keep full

    def __post_init__(self) -> None:  # config strings in, enums kept (they compare equal to the strings)
        object.__setattr__(self, "mode", Mode(self.mode))
        object.__setattr__(self, "fgd_strength", FgdStrength(self.fgd_strength))
        object.__setattr__(self, "train_unit", TrainUnit(self.train_unit))

    def replace(self, **changes: Any) -> RoundSettings:
        return dataclasses.replace(self, **changes)

    def record(self) -> dict[str, Any]:
        """Every field (enums as their config strings), plus the short names timelines have always carried."""
        out = {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self)}
        out.update({"R": self.num_groups, "K": self.group_size, "U": self.step_groups, "F_w": self.frontier_width})
        return out

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> RoundSettings:
        """The settings a timeline or bench record ran with (``record()``'s output)."""
        fields = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in record.items() if k in fields}
        missing = fields - values.keys() - {f.name for f in dataclasses.fields(cls)
                                            if f.default is not dataclasses.MISSING}
        if missing:
            raise ValueError(f"a round record without {sorted(missing)}: written before RoundSettings were recorded "
                             "whole; rerun what produced it")
        return cls(**values)


def _plain(value: Any) -> Any:
    return value.value if isinstance(value, (Mode, FgdStrength, TrainUnit)) else value


def resolve_round_settings(*, mode: str, num_groups: int, group_size: int, step_groups: int, fgd_strength: str,
                           frontier_width: int | str | None, train_unit: str, max_num_seqs: int,
                           multi_turn: bool, max_buffered_groups: int | None, max_extra_groups: int,
                           filter_metric: str | None, target_running: int | None = None) -> RoundSettings:
    """The one resolver: config values (strings, the width's words) to a ``RoundSettings``. ``frontier_width``:
    a number as given; ``engine`` (and null under ``paced``) from the engine's slots, or R when the trajectories
    call tools (``multi_turn``: ``frontier.resolve_frontier_width`` says why); null otherwise U; ``auto`` starts at
    U and is measured round by round. Raises ValueError on a value no enum has (``config_check`` reports
    bad values first, each naming its key)."""
    strength = FgdStrength(fgd_strength)
    auto = frontier_width == AUTO_WIDTH
    width = step_groups if auto else resolve_frontier_width(frontier_width, strength, step_groups, num_groups,
                                                            group_size, max_num_seqs, multi_turn)
    return RoundSettings(Mode(mode), int(num_groups), int(group_size), int(step_groups), strength, int(width),
                         TrainUnit(train_unit), frontier_auto=auto, max_buffered_groups=max_buffered_groups,
                         max_extra_groups=int(max_extra_groups), filter_metric=filter_metric,
                         target_running=target_running)

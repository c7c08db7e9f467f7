"""The simulator against the real benchmark (its accuracy check): calibrate on a setting's measured sync rounds,
predict every mode of that setting, compare with what the bench measured for it.

The bench's response lengths are known exactly (the workload generator is deterministic), so the simulator gets
the same lengths, round by round. Calibrated per setting from the sync rounds alone:
- trainer: seconds per response token (busy time / tokens) and the measured publish time;
- engine: one time scale on a CPU-shaped step cost (``STEP_SHAPE``), bisected so the simulated sync rollout lasts
  as long as the measured one;
- and from the plain-CGP rounds, two more numbers: how much slower the engine decodes while the trainer is busy and
  vice versa (on two cores the unpinned orchestration takes its CPU from the busy pools; on GPU pools ≈ 0).
Round times of every mode, and everything about the FGD modes, are predictions.
"""

from __future__ import annotations

import random
import statistics
from dataclasses import dataclass, replace
from typing import Any

from ..mode_specs import parse_mode_spec
from ..pipeline import RoundSettings, resolve_round_settings
from ..pipeline.modes import AUTO_WIDTH, STOCK, TrainUnit
from ..workloads import LengthProfile, round_lengths
from .calibrate import bisect_increasing, fit_engine_scale
from .simulator import EngineModel, TrainerModel, simulate_round

# vLLM CPU decode step of the embedded model, shape only (measured on the bench: ~4.7 ms/step at 16 running
# sequences, ~12 ms at 128); the scale is calibrated per setting
STEP_SHAPE = EngineModel(max_running=256, kv_tokens=10**7, step_base_s=0.0036, step_per_seq_s=0.00007,
                         prefill_per_token_s=1e-6, fcfs_shuffle=False)


@dataclass(frozen=True)
class FixedLengths:
    """A workload whose lengths are given (duck-types ``simulator.Workload``)."""

    rows: tuple[tuple[int, ...], ...]
    prompt_tokens: int = 30
    name: str = "bench"

    def lengths(self, num_groups: int, k: int, rng: random.Random) -> list[list[int]]:
        return [list(r) for r in self.rows[:num_groups]]


def _spec(mode: str, num_groups: int, settings: dict, record: dict | None = None) -> RoundSettings:
    """The round a bench mode ran: the record's own ``round_settings`` where it has them (recorded whole since they
    exist), else resolved from the bench's settings by the trainer's resolver -- the config's strength, width and
    train unit with the spec's in their place. verl's own step (``stock``) is a serial round in one call."""
    if record is not None and record.get("round_settings"):
        return RoundSettings.from_record(record["round_settings"])
    missing = [k for k in ("fgd_strength", "train_unit") if k not in settings]
    if missing:
        raise ValueError(f"bench settings without {missing}: written before the bench recorded them; add the values "
                         "of the config at its git_commit, or rerun the bench")
    spec = parse_mode_spec(mode)
    values = {"train_unit": settings["train_unit"],
              **spec.config_values(settings["fgd_strength"], settings["F_w"])}
    if spec.mode == STOCK:
        values.update(mode="sync", train_unit=TrainUnit.STEP)
    if values["frontier_width"] == AUTO_WIDTH:  # replay the width the round ran with
        values["frontier_width"] = int(((record or {}).get("metrics") or {}).get("rolloutpipe/frontier_width",
                                                                                settings["U"]))
    return resolve_round_settings(**values, num_groups=num_groups, group_size=settings["K"],
                                  step_groups=settings["U"], max_num_seqs=settings["max_num_seqs"],
                                  # records without round_settings predate the multi-turn width: as they ran
                                  multi_turn=False, max_buffered_groups=None, max_extra_groups=0, filter_metric=None)


def calibrate(metrics: dict[str, float], work: FixedLengths, spec: RoundSettings,
              max_running: int = 256) -> tuple[EngineModel, TrainerModel]:
    """Engine speed and trainer cost per token from one round's measured rollout and trainer busy time
    (``max_running``: the engine's running slots, the bench's ``max_num_seqs``)."""
    tokens = sum(sum(r) for r in work.rows)
    trainer = TrainerModel(per_group_s=0.0, per_token_s=metrics["rolloutpipe/trainer_busy_s"] / tokens,
                           step_overhead_s=0.0, reward_s=0.001,
                           publish_s=metrics.get("rolloutpipe/publish_s", 0.0))
    shape = replace(STEP_SHAPE, max_running=max_running)
    return fit_engine_scale(spec, work, shape, trainer, metrics["rolloutpipe/rollout_s"]), trainer


def fit_contention(metrics: dict[str, float], work: FixedLengths, spec: RoundSettings, eng: EngineModel,
                   trainer: TrainerModel) -> tuple[EngineModel, TrainerModel]:
    """How much slower each side runs while the other is busy, bisected (alternately, 3 passes) on one pipelined
    round's measured rollout time and trainer busy time."""
    def run(e: EngineModel, t: TrainerModel) -> dict[str, float]:
        return simulate_round(spec, work, e, t).metrics()

    for _ in range(3):
        e0, t0 = eng, trainer  # bound for the lambdas below
        eng = replace(e0, contended_slowdown=bisect_increasing(
            lambda c, e0=e0, t0=t0: run(replace(e0, contended_slowdown=c), t0)["rolloutpipe/rollout_s"],
            metrics["rolloutpipe/rollout_s"], 0.0, 4.0, iterations=40))
        e1 = eng
        trainer = replace(t0, contended_slowdown=bisect_increasing(
            lambda c, e1=e1, t0=t0: run(e1, replace(t0, contended_slowdown=c))["rolloutpipe/trainer_busy_s"],
            metrics["rolloutpipe/trainer_busy_s"], 0.0, 4.0, iterations=40))
    return eng, trainer


def validate_against_bench(raw: dict[str, Any], calibrate_mode: str = "sync", contention_mode: str | None = "cgp",
                           modes: set[str] | None = None) -> list[dict[str, Any]]:
    """One record per (workload, R, mode): measured vs predicted medians and the relative error. Calibrated on
    ``calibrate_mode`` rounds (trainer, engine speed) and, if given, ``contention_mode`` rounds (the slowdown of
    the engine while the trainer runs); every other number is a prediction. ``modes``: only these (default all)."""
    settings = raw["settings"]
    cap = settings["max_response_length"]
    by = {(s["workload"], s["R"], s["mode"]): s for s in raw["results"]}
    out = []
    for (workload, r, mode), s in by.items():
        base = by.get((workload, r, calibrate_mode))
        if base is None or parse_mode_spec(mode).mode == STOCK:  # verl's own step is not a mode the simulator runs
            continue
        if modes is not None and mode not in modes:
            continue
        if settings["profiles"][workload].get("kind", "single_turn") != "single_turn":
            continue  # the simulator models decode lengths, not tool turns: a multi-turn workload is not replayed
        profile = LengthProfile.from_mapping(workload, settings["profiles"][workload])
        measured, predicted = [], []
        contended = by.get((workload, r, contention_mode)) if contention_mode else None
        cont_rounds = contended["rounds"] if contended else [None] * len(s["rounds"])
        for cal_round, cont_round, rnd in zip(base["rounds"], cont_rounds, s["rounds"], strict=True):
            if rnd["warmup"]:
                continue
            i = rnd["round"] - 1
            work = FixedLengths(tuple(map(tuple, round_lengths(profile, settings.get("seed", 0) * 1000 + i, r,
                                                               settings["K"], cap))))
            eng, tr = calibrate(cal_round["metrics"], work, _spec(calibrate_mode, r, settings, cal_round),
                                settings.get("max_num_seqs", 256))
            if cont_round is not None:
                eng, tr = fit_contention(cont_round["metrics"], work, _spec(contention_mode, r, settings, cont_round),
                                         eng, tr)
            pm = simulate_round(_spec(mode, r, settings, rnd), work, eng, tr).metrics()
            measured.append(rnd["metrics"]["rolloutpipe/rollout_to_train_end_s"])
            predicted.append(pm["rolloutpipe/rollout_to_train_end_s"])
        if not measured:
            continue
        m, p = statistics.median(measured), statistics.median(predicted)
        out.append({"workload": workload, "R": r, "mode": mode, "measured_s": round(m, 3), "predicted_s": round(p, 3),
                    "error": round(p / m - 1, 4)})
    return out

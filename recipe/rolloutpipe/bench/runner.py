"""The benchmark's Ray task runner: one disaggregated RolloutPipe trainer; per (workload, R), every mode
interleaved round by round.

All modes of a setting run on the same workers, every round from the same saved actor state (weights, AdamW,
scheduler), on the same prompts and prescribed response lengths: ``stock`` is verl's own serial step
(``verl_round.py``), the others the recipe's ``fit_round``. Round i runs every mode, in an order rotated each round,
so the ratios are paired per round and come from one run on one machine state.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import ray
from tqdm import tqdm

from ..config_check import round_settings
from ..logs import get_logger
from ..mode_specs import parse_mode_spec
from ..pipeline import PREFIX, RoundSettings
from ..pipeline.modes import STOCK
from ..workloads import (
    LengthProfile,
    TurnProfile,
    describe,
    describe_turns,
    profile_from_mapping,
    round_lengths,
    round_turn_plans,
)
from .agent_loop import AGENT_NAME, LENGTHS_COLUMN, PLANS_COLUMN, TURN_AGENT_NAME
from .verl_round import verl_round

START_STATE = "bench_start"
logger = get_logger(__name__)


def make_round(trainer, profile: LengthProfile | TurnProfile, round_index: int, num_groups: int, seed: int):
    """Round ``round_index`` of a setting: R prompts of the train set plus their prescribed response lengths (or,
    for a multi-turn profile, their turn plans: turn lengths and tool latencies)."""
    from verl import DataProto
    from verl.utils.dataset.rl_dataset import collate_fn

    cfg = trainer.config
    k, cap = int(cfg.actor_rollout_ref.rollout.n), int(cfg.data.max_response_length)
    ds = trainer.train_dataset
    start = (round_index * num_groups) % (len(ds) - num_groups)
    batch = DataProto.from_single_dict(collate_fn([ds[i] for i in range(start, start + num_groups)]))
    if isinstance(profile, TurnProfile):
        plans = round_turn_plans(profile, seed * 1000 + round_index, num_groups, k, cap)
        batch.non_tensor_batch[PLANS_COLUMN] = np.array([json.dumps(g) for g in plans], dtype=object)
        batch.non_tensor_batch["agent_name"] = np.array([TURN_AGENT_NAME] * num_groups, dtype=object)
        return batch, plans
    lengths = round_lengths(profile, seed * 1000 + round_index, num_groups, k, cap)
    batch.non_tensor_batch[LENGTHS_COLUMN] = np.array([",".join(map(str, g)) for g in lengths], dtype=object)
    batch.non_tensor_batch["agent_name"] = np.array([AGENT_NAME] * num_groups, dtype=object)
    return batch, lengths


def lengths_honoured(trained: list, batch, lengths: list[list[int]]) -> float:
    """Share of trained responses whose length is one the workload prescribed for its group (must be 1.0): per
    group (the prompt's uid), the multiset of response lengths against the prescribed one. (Multisets, because
    verl's own step may reorder rows: ``trainer.balance_batch``.)"""
    got = [(int(n), uid) for b in trained
           for n, uid in zip(b.batch["response_mask"].sum(-1).tolist(), b.non_tensor_batch["uid"], strict=True)]
    return _share_prescribed(dict(zip(batch.non_tensor_batch["uid"], lengths, strict=True)), got)


def turns_honoured(trained: list, batch, plans: list[list[dict]]) -> float:
    """The multi-turn twin of ``lengths_honoured``: share of trained responses whose turn count (verl's
    ``__num_turns__``: model turns + tool turns + the prompt) is one its group's plans prescribed (must be 1.0)."""
    prescribed = {uid: [2 * len(p["latencies"]) + 2 for p in g]
                  for uid, g in zip(batch.non_tensor_batch["uid"], plans, strict=True)}
    got = [(int(n), uid) for b in trained
           for n, uid in zip(b.non_tensor_batch["__num_turns__"].tolist(), b.non_tensor_batch["uid"], strict=True)]
    return _share_prescribed(prescribed, got)


def _share_prescribed(prescribed: dict[str, list[int]], got: list[tuple[int, str]]) -> float:
    """Share of the trained responses' values (value, uid) that match their group's prescribed multiset."""
    by_uid: dict[str, list[int]] = {}
    for n, uid in got:
        by_uid.setdefault(uid, []).append(n)
    hits = sum(len(want) - len(_multiset_diff(want, by_uid.get(uid, []))) for uid, want in prescribed.items())
    return hits / max(1, len(got))


def _multiset_diff(want: list[int], have: list[int]) -> list[int]:
    left = list(have)
    missing = []
    for x in want:
        if x in left:
            left.remove(x)
        else:
            missing.append(x)
    return missing


def rotated(modes: list[str], round_index: int) -> list[str]:
    """The modes' order in round ``round_index``: rotated by one each round, so no mode always runs first (or
    right after another) -- the machine's state drifts over a run (page cache, allocator, thermal)."""
    i = round_index % len(modes)
    return [*modes[i:], *modes[:i]]


def round_settings_for(config, mode: str, num_groups: int, multi_turn: bool) -> RoundSettings:
    """A bench mode spec's round settings at R = ``num_groups``: the run's config with the spec's values in its
    place, through the one resolver the trainer uses (``config_check.round_settings``); ``multi_turn``: the
    workload calls tools (a ``TurnProfile``: its rows name the turn agent loop)."""
    rp = config.rolloutpipe
    return round_settings(config, num_groups=num_groups, multi_turn=multi_turn,
                          **parse_mode_spec(mode).config_values(rp.fgd_strength, rp.frontier_width))


def _mode_dir(mode: str) -> str:
    return mode.replace(":", "_").replace("/", "_w").replace("+", "_").replace("@", "_at_")


def orchestration_cpus(mode: str, bench) -> list[int] | None:
    """The cores a bench mode's orchestration (driver, task runner, Ray's daemons) is pinned to: the pool named by the
    mode's ``@pool`` suffix, else by ``rolloutpipe.bench.orchestration``; None (unpinned) when neither names one."""
    place = parse_mode_spec(mode).orchestration or bench.get("orchestration")
    return None if place is None else list(bench.rollout_cpus if place == "rollout" else bench.trainer_cpus)


def run_round(trainer, profile: LengthProfile | TurnProfile, num_groups: int, mode: str, round_index: int, bench,
              out_dir: Path, draw_png: bool) -> dict:
    """Round ``round_index`` of a setting in one mode, from the setting's start state (weights, AdamW,
    scheduler; published to vLLM), so every mode runs every round from the same state."""
    from .pinning import cpu_seconds, cpu_used, this_run

    trainer.actor_rollout_wg.load_train_state(START_STATE)
    trainer.checkpoint_manager.update_weights(0)
    batch, plan = make_round(trainer, profile, round_index, num_groups, int(bench.seed))
    trainer.global_steps = round_index + 1
    trainer.actor_rollout_wg.pop_compute_seconds()  # from here on
    t0, cpu0 = time.monotonic(), cpu_seconds(this_run())  # this run's processes: not a test's beside it
    if parse_mode_spec(mode).mode == STOCK:
        out = verl_round(trainer, batch)
        trained, metrics, timeline = [out["rows"]], out["metrics"], None
        extra = {"verl_timing_s": out["verl_timing_s"], "round_settings": None}
    else:
        trainer.timeline_dir = out_dir / "timelines" / f"{profile.name}_R{num_groups}" / _mode_dir(mode)
        result = trainer.fit_round(batch, settings=round_settings_for(trainer.config, mode, num_groups,
                                                                            isinstance(profile, TurnProfile)),
                                   draw_png=draw_png)
        trained, metrics, timeline = result.trained, dict(result.metrics), str(result.timeline_path)
        metrics[PREFIX + "old_log_prob_s"] = metrics.get("timing_s/rolloutpipe/old_log_prob", 0.0)
        # what the round ran with, whole (the simulator's --from-bench replays it; auto: this round's measured F_w)
        extra = {"calls_per_step": result.calls_per_step, "round_settings": result.timeline.settings}
    cpu1 = cpu_seconds(this_run())
    # the trainer pool's calls: compute inside the worker vs the rest of each call (Ray, serialisation, dispatch)
    by_rank = trainer.actor_rollout_wg.pop_compute_seconds()
    slowest = max(by_rank, key=lambda s: sum(s.values()))  # ranks compute in parallel: the slowest one's
    compute = sum(slowest.values())
    busy = metrics[PREFIX + "trainer_busy_s"]
    metrics.update({PREFIX + "worker_compute_s": compute, PREFIX + "worker_infer_s": slowest["infer_batch"],
                    PREFIX + "worker_train_s": slowest["train_mini_batch"], PREFIX + "call_overhead_s": busy - compute,
                    PREFIX + "call_overhead_share": (busy - compute) / busy if busy > 0 else float("nan")})
    return {"round": round_index + 1, "warmup": round_index < int(bench.warmup_rounds),
            "wall_s": time.monotonic() - t0, "cpu_s": cpu_used(cpu0, cpu1),
            **({"workload_shape": describe_turns(plan), "lengths_honoured": turns_honoured(trained, batch, plan)}
               if isinstance(profile, TurnProfile) else
               {"workload_shape": describe(plan, int(trainer.config.data.max_response_length)),
                "lengths_honoured": lengths_honoured(trained, batch, plan)}),
            "timeline": timeline,
            "metrics": {k: float(v) for k, v in metrics.items() if k.startswith("rolloutpipe/")}, **extra}


def run_setting(trainer, profile: LengthProfile | TurnProfile, num_groups: int, modes: list[str], bench,
                out_dir: Path) -> list[dict]:
    """Every round of one (workload, R), all modes interleaved round by round (order rotated); one result per
    mode with its rounds in order."""
    from .pinning import pin_pools

    per_mode: dict[str, list[dict]] = {m: [] for m in modes}
    pinned: dict = {}
    total = int(bench.warmup_rounds) + int(bench.rounds)
    for i in tqdm(range(total), desc=f"{profile.name} R={num_groups} rounds", unit="round"):
        for position, mode in enumerate(rotated(modes, i)):
            # again before each round: verl starts some rollout actors (agent-loop workers, ...) lazily
            pinned = pin_pools(list(bench.rollout_cpus), list(bench.trainer_cpus), orchestration_cpus(mode, bench))
            rec = run_round(trainer, profile, num_groups, mode, i, bench, out_dir,
                            draw_png=i == int(bench.warmup_rounds))  # one Gantt PNG per mode and setting
            rec["position_in_round"] = position
            per_mode[mode].append(rec)
            logger.info(f"[rolloutpipe bench] {profile.name} R={num_groups} round {i + 1}/{total} {mode}: "
                        f"rollout_to_train_end="
                        f"{rec['metrics'][PREFIX + 'rollout_to_train_end_s']:.2f}s"
                        + (" (warm-up)" if rec["warmup"] else ""))
    return [{"workload": profile.name, "R": num_groups, "mode": m, "rounds": per_mode[m], "pinned": pinned}
            for m in modes]


@ray.remote
class BenchTaskRunner:
    def run(self, config) -> dict:
        from ..runner import build_disaggregated_trainer
        bench = config.rolloutpipe.bench
        trainer = build_disaggregated_trainer(config)
        trainer.init_workers()
        trainer.actor_rollout_wg.save_train_state(START_STATE)
        out_dir = Path(bench.out_dir)
        profiles = [profile_from_mapping(n, bench.profiles[n]) for n in bench.workloads]
        results = []
        for p in profiles:
            for r in bench.sizes:
                logger.info(f"[rolloutpipe bench] workload={p.name} R={r} modes={list(bench.modes)} (interleaved)")
                results += run_setting(trainer, p, int(r), list(bench.modes), bench, out_dir)
        return {"pinned": results[-1]["pinned"] if results else {}, "results": results}

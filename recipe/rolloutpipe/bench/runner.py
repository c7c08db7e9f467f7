"""The benchmark's Ray task runner: one disaggregated RolloutPipe trainer, every (workload, R, mode) in turn.

All modes of a setting run on the same workers, from the same saved actor state (weights, AdamW, scheduler) and
the same rounds (prompts and prescribed response lengths), so the ratios come from one run on one machine state.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import numpy as np
import ray
from tqdm import tqdm

from ..logs import get_logger
from ..pipeline.modes import parse_mode_spec
from ..workloads import LengthProfile, describe, round_lengths
from .agent_loop import AGENT_NAME, LENGTHS_COLUMN

START_STATE = "bench_start"
logger = get_logger(__name__)


def make_round(trainer, profile: LengthProfile, round_index: int, num_groups: int, seed: int):
    """Round ``round_index`` of a setting: R prompts of the train set plus their prescribed response lengths."""
    from verl import DataProto
    from verl.utils.dataset.rl_dataset import collate_fn

    cfg = trainer.config
    k, cap = int(cfg.actor_rollout_ref.rollout.n), int(cfg.data.max_response_length)
    ds = trainer.train_dataset
    start = (round_index * num_groups) % (len(ds) - num_groups)
    batch = DataProto.from_single_dict(collate_fn([ds[i] for i in range(start, start + num_groups)]))
    lengths = round_lengths(profile, seed * 1000 + round_index, num_groups, k, cap)
    batch.non_tensor_batch[LENGTHS_COLUMN] = np.array([",".join(map(str, g)) for g in lengths], dtype=object)
    batch.non_tensor_batch["agent_name"] = np.array([AGENT_NAME] * num_groups, dtype=object)
    return batch, lengths


def lengths_honoured(trained: list, batch, lengths: list[list[int]]) -> float:
    """Share of trained responses whose length is exactly the one the workload prescribed (must be 1.0).
    Rows of a group are its K samples in order (verl's interleaved repeat); the prompt's uid names the group."""
    by_uid = dict(zip(batch.non_tensor_batch["uid"], lengths, strict=True))
    hits = total = 0
    for b in trained:
        got = b.batch["response_mask"].sum(-1).tolist()
        k = len(lengths[0])
        for i, (g, uid) in enumerate(zip(got, b.non_tensor_batch["uid"], strict=True)):
            hits += int(g) == by_uid[uid][i % k]
            total += 1
    return hits / max(1, total)


def run_setting(trainer, profile: LengthProfile, num_groups: int, mode: str, bench, out_dir: Path) -> dict:
    """Every round of one (workload, R, mode), from the saved start state; returns per-round metrics."""
    from .pinning import cpu_seconds, pin_pools

    # again per setting: verl starts some rollout actors (agent-loop workers, load balancer) lazily
    pinned = pin_pools(list(bench.rollout_cpus), list(bench.trainer_cpus))
    trainer.actor_rollout_wg.load_train_state(START_STATE)
    trainer.checkpoint_manager.update_weights(0)
    spec = parse_mode_spec(mode)
    pipe = dataclasses.replace(trainer.pipe, mode=spec.mode, num_groups=num_groups,
                               fgd_strength=spec.fgd_strength or trainer.pipe.fgd_strength,
                               frontier_width=spec.frontier_width or trainer.pipe.frontier_width,
                               train_unit=spec.train_unit or trainer.pipe.train_unit)
    setting_dir = f"{profile.name}_R{num_groups}/{mode.replace(':', '_').replace('/', '_w').replace('+', '_')}"
    trainer.timeline_dir = out_dir / "timelines" / setting_dir
    rounds = []
    total = int(bench.warmup_rounds) + int(bench.rounds)
    for i in range(total):
        batch, lengths = make_round(trainer, profile, i, num_groups, int(bench.seed))
        trainer.global_steps = i + 1
        t0, cpu0 = time.monotonic(), cpu_seconds()
        result = trainer.fit_round(batch, pipe=pipe, draw_png=i == 0)  # one Gantt PNG per setting
        cpu1 = cpu_seconds()
        cpu = {k: round(v - cpu0.get(k, 0.0), 3) for k, v in cpu1.items() if v - cpu0.get(k, 0.0) >= 0.01}
        rounds.append({"round": i + 1, "warmup": i < int(bench.warmup_rounds), "wall_s": time.monotonic() - t0,
                       "cpu_s": dict(sorted(cpu.items(), key=lambda kv: -kv[1])),
                       "workload_shape": describe(lengths, int(trainer.config.data.max_response_length)),
                       "lengths_honoured": lengths_honoured(result.trained, batch, lengths),
                       "timeline": str(result.timeline_path),
                       "metrics": {k: float(v) for k, v in result.metrics.items() if k.startswith("rolloutpipe/")}})
    return {"workload": profile.name, "R": num_groups, "mode": mode, "rounds": rounds, "pinned": pinned}


@ray.remote
class BenchTaskRunner:
    def run(self, config) -> dict:
        from ..runner import build_disaggregated_trainer
        bench = config.rolloutpipe.bench
        trainer = build_disaggregated_trainer(config)
        trainer.init_workers()
        trainer.actor_rollout_wg.save_train_state(START_STATE)
        out_dir = Path(bench.out_dir)
        profiles = [LengthProfile.from_mapping(n, bench.profiles[n]) for n in bench.workloads]
        plan = [(p, r, m) for p in profiles for r in bench.sizes for m in bench.modes]
        results = []
        for p, r, m in tqdm(plan, desc="bench settings", unit="setting"):
            logger.info(f"[rolloutpipe bench] workload={p.name} R={r} mode={m}")
            results.append(run_setting(trainer, p, int(r), m, bench, out_dir))
        return {"pinned": results[-1]["pinned"] if results else {}, "results": results}

"""``python -m experiments.rollout_calls [--rounds N] [key=value ...]``: does the recipe's per-group
rollout path cost generation time? Generation only, on the quick bench's stack and rounds (pinned pools, saturated
engine), three ways of sending the same round, interleaved round by round (order alternated):

- ``verl_batch``: verl's ``AgentLoopManager.generate_sequences`` -- one call of R·K rows (what ``stock`` does);
- ``per_group``: R agent-loop calls of K rows, collected as they finish (what the recipe's stream sent before
  ``generate_groups``);
- ``group_stream``: the recipe's ``GroupRolloutStream`` -- one ``generate_groups`` call of the R groups, each
  streamed back when complete (what ``sync``/``cgp``/``cgp_fgd`` do);
- ``one_call``: the same R·K rows in one agent-loop call (the worker's own batch path, without the manager);
- ``group_stream+train``: ``group_stream`` while the driver keeps the trainer pool busy with π_old calls (verl's
  ``compute_log_prob`` path, 16 rows each) on the other core, as a pipelined round's overlap does.

No optimizer step, no publication: what differs is the call pattern and what runs beside the rollout. Before each
generation a fixed probe (a single-thread matmul and Python loop, best of three) times the rollout core while the pool
is idle: the machine's own speed at that moment, to tell the host's drift from the call pattern's cost. Writes
``<out_dir>/rollout_calls.json`` (per-round seconds, CPU seconds per process outside the trainer pool, paired ratios
against ``verl_batch`` with bootstrap CIs, ``git_commit``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time
from pathlib import Path

import numpy as np
import ray

from recipe.rolloutpipe.bench.__main__ import load_config
from recipe.rolloutpipe.bench.pinning import pool_env
from recipe.rolloutpipe.main import prepare_runtime
from recipe.rolloutpipe.provenance import git_commit, machine
from recipe.rolloutpipe.resolve import apply_layout

PATTERNS = ("verl_batch", "per_group", "group_stream", "one_call", "group_stream+train")


@ray.remote
class RolloutCallsRunner:
    def run(self, config, rounds: int) -> dict:
        from recipe.rolloutpipe.bench.pinning import cpu_seconds, cpu_used, pin_pools, this_run
        from recipe.rolloutpipe.bench.runner import make_round
        from recipe.rolloutpipe.rollout_stream import SAMPLE_COLUMN, GroupRequest, GroupRolloutStream
        from recipe.rolloutpipe.runner import build_disaggregated_trainer
        from recipe.rolloutpipe.train_calls import TrainCalls
        from recipe.rolloutpipe.workloads import LengthProfile

        bench = config.rolloutpipe.bench
        trainer = build_disaggregated_trainer(config)
        trainer.init_workers()
        [workload], [num_groups] = bench.workloads, bench.sizes
        profile = LengthProfile.from_mapping(workload, bench.profiles[workload])
        k = int(config.actor_rollout_ref.rollout.n)
        manager = trainer.async_rollout_manager

        def all_rows(batch):
            rows = batch.repeat(repeat_times=k, interleave=True)
            rows.non_tensor_batch[SAMPLE_COLUMN] = np.arange(len(rows), dtype=np.int64) % k
            return rows

        load_rows: list = []  # a round's generated rows: what the trainer-side load computes π_old on

        def trainer_load(stop: threading.Event, calls: list[float]) -> None:
            chunk = load_rows[0][:16]
            chunk.meta_info["temperature"] = float(config.actor_rollout_ref.rollout.temperature)
            chunk.meta_info["global_token_num"] = chunk.batch["attention_mask"].sum(-1).tolist()
            calls_ = TrainCalls(trainer, k, timing={}, reward_kl=None)
            while not stop.is_set():
                t = time.monotonic()
                calls_.old_log_probs(chunk, 0)
                calls.append(time.monotonic() - t)

        def generate(pattern: str, batch) -> dict:
            if pattern.endswith("+train"):
                stop, calls = threading.Event(), []
                load = threading.Thread(target=trainer_load, args=(stop, calls), daemon=True)
                load.start()
                try:
                    generate(pattern.removesuffix("+train"), batch)
                finally:
                    stop.set()
                    load.join()
                return {"trainer_calls": len(calls), "trainer_call_s": statistics.median(calls) if calls else 0.0}
            if pattern == "verl_batch":
                manager.generate_sequences(all_rows(batch))
            elif pattern == "one_call":
                rows = all_rows(batch)
                rows.non_tensor_batch["priority"] = np.zeros(len(rows), dtype=np.int64)
                out = ray.get(manager.agent_loop_workers[0].generate_sequences.remote(rows))
                if not load_rows:
                    load_rows.append(out)
            else:
                stream = GroupRolloutStream(manager.agent_loop_workers, k)
                requests = [GroupRequest(g, batch[g:g + 1], priority=0, meta={"global_steps": 1})
                            for g in range(len(batch))]
                if pattern == "per_group":  # one call per group
                    for r in requests:
                        stream.submit([r])
                else:  # group_stream: one call of every group, each streamed back when complete
                    stream.submit(requests)
                done = 0
                while done < len(batch):
                    done += len(stream.poll(timeout_s=0.05))
            return {}

        out: dict = {p: {"seconds": [], "cpu_s": [], "extra": []} for p in PATTERNS}
        for i in range(rounds + 1):  # round 0: warm-up (vLLM's first batches), not recorded
            order = PATTERNS if i % 2 else PATTERNS[::-1]
            if not load_rows:  # the loaded patterns need generated rows first
                order = ("one_call", *(p for p in order if p != "one_call"))
            for pattern in order:
                pin_pools(list(bench.rollout_cpus), list(bench.trainer_cpus))
                batch, _ = make_round(trainer, profile, i, int(num_groups), int(bench.seed))
                batch.meta_info["temperature"] = float(config.actor_rollout_ref.rollout.temperature)
                probe = speed_probe(int(bench.rollout_cpus[0]))
                cpu0, t0 = cpu_seconds(this_run()), time.monotonic()
                extra = {"probe_s": probe, **generate(pattern, batch)}
                seconds, cpu1 = time.monotonic() - t0, cpu_seconds(this_run())
                if i:
                    out[pattern]["seconds"].append(seconds)
                    out[pattern]["extra"].append(extra)
                    out[pattern]["cpu_s"].append({key: v for key, v in cpu_used(cpu0, cpu1).items()
                                                  if not key.startswith("trainer:")})
        return out


def _pool_cpu(cpu_s: dict[str, float]) -> float:
    return sum(v for k, v in cpu_s.items() if k.startswith("rollout:"))


def speed_probe(cpu: int) -> float:
    """Seconds a fixed piece of work takes on ``cpu`` (best of three): higher = the core is slower right now."""
    import torch

    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {cpu})  # this thread only
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        a, best = torch.randn(256, 256), float("inf")
        for _ in range(3):
            t = time.perf_counter()
            for _ in range(20):
                a = (a @ a).tanh()
            sum(i * i for i in range(100_000))
            best = min(best, time.perf_counter() - t)
        return best
    finally:
        torch.set_num_threads(threads)
        os.sched_setaffinity(0, before)


def summarize(raw: dict) -> dict:
    """Per pattern: median seconds, median CPU seconds per process outside the trainer pool (the rollout pool's,
    the driver's, Ray's daemons'), and the paired per-round ratio against ``verl_batch`` (> 1: slower) with its
    bootstrap CI."""
    from recipe.rolloutpipe.bench.report import _bootstrap_median_ci

    base = raw["verl_batch"]["seconds"]
    summary: dict = {}
    for pattern, rec in raw.items():
        ratios = [x / b for x, b in zip(rec["seconds"], base, strict=True)]
        procs = sorted({key for c in rec["cpu_s"] for key in c})
        summary[pattern] = {
            "median_s": statistics.median(rec["seconds"]),
            "ratio_vs_verl_batch": statistics.median(ratios), "ratio_ci": _bootstrap_median_ci(ratios),
            "cpu_s": {key: statistics.median(c.get(key, 0.0) for c in rec["cpu_s"]) for key in procs},
            **({"trainer_calls": statistics.median(e["trainer_calls"] for e in rec["extra"]),
                "trainer_call_s": statistics.median(e["trainer_call_s"] for e in rec["extra"])}
               if rec["extra"] and "trainer_calls" in rec["extra"][0] else {}),
        }
    # the machine's drift: the probe's spread, and how much of the rollout pool's CPU seconds per round (the same
    # tokens every pattern) it explains -- a pattern's own cost would show as CPU the probe does not predict
    probes = [e["probe_s"] for rec in raw.values() for e in rec["extra"]]
    pool = [_pool_cpu(c) for rec in raw.values() for c in rec["cpu_s"]]
    rounds = len(base)
    per_round = [statistics.median(_pool_cpu(rec["cpu_s"][i]) for rec in raw.values()) for i in range(rounds)]
    summary["machine"] = {"probe_s_min": min(probes), "probe_s_max": max(probes),
                          "pool_cpu_s_min": min(pool), "pool_cpu_s_max": max(pool),
                          "corr_probe_vs_pool_cpu": float(np.corrcoef(probes, pool)[0, 1]),
                          "pool_cpu_s_per_round_median": per_round}
    return summary


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m experiments.rollout_calls",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=8, help="measured rounds per pattern (after one warm-up)")
    ap.add_argument("overrides", nargs="*", help="key=value overrides, as for the bench (--quick's setting)")
    args = ap.parse_args(argv)
    cfg = load_config(True, args.overrides)
    apply_layout(cfg)
    bench = cfg.rolloutpipe.bench
    out_dir = Path(bench.out_dir).parent / "rollout_calls"
    prepare_runtime(cfg, worker_env=pool_env(list(bench.rollout_cpus), list(bench.trainer_cpus)))
    raw = ray.get(RolloutCallsRunner.options(num_cpus=1).remote().run.remote(cfg, args.rounds))
    result = {"git_commit": git_commit(), "machine": machine(), "workload": list(bench.workloads),
              "R": list(bench.sizes), "K": int(cfg.actor_rollout_ref.rollout.n), "rounds": args.rounds,
              "summary": summarize(raw), "raw": raw}
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "rollout_calls.json").write_text(json.dumps(result, indent=1))
    for pattern, s in result["summary"].items():
        if pattern == "machine":
            print(f"machine: probe {s['probe_s_min']:.3f}-{s['probe_s_max']:.3f} s, rollout pool "
                  f"{s['pool_cpu_s_min']:.2f}-{s['pool_cpu_s_max']:.2f} CPU-s per generation, correlation "
                  f"{s['corr_probe_vs_pool_cpu']:.2f}")
            continue
        lo, hi = s["ratio_ci"]
        rollout = _pool_cpu(s["cpu_s"])
        other = {k.split(":")[0]: 0.0 for k in s["cpu_s"] if not k.startswith("rollout:")}
        for k, v in s["cpu_s"].items():
            if not k.startswith("rollout:"):
                other[k.split(":")[0]] += v
        print(f"{pattern:36s} median {s['median_s']:.2f} s  vs verl_batch x{s['ratio_vs_verl_batch']:.3f} "
              f"[{lo:.3f}, {hi:.3f}]  CPU-s: rollout pool {rollout:.2f} "
              + " ".join(f"{k} {v:.2f}" for k, v in other.items())
              + (f"  trainer calls {s['trainer_calls']:.0f} x {s['trainer_call_s']:.2f} s" if "trainer_calls" in s
                 else ""))
    print(f"-> {out_dir / 'rollout_calls.json'}")


if __name__ == "__main__":
    main()

"""``python -m recipe.rolloutpipe.bench [--quick | --headline | --agentic] [--json OUT] [key=value ...]``: verl's
own trainer (``stock``) vs sync vs CGP vs CGP+FGD side by side on the real stack (disaggregated layout, rollout pool
and trainer pool pinned to separate cores), interleaved round by round, with paired bootstrap CIs. ``--headline``:
the quick setting in fresh launches, summarized in docs/results/headline.json and the README's table
(bench/headline.py). ``--agentic``: the multi-turn workload (verl's tool agent loop; stock runs the same loop).

Writes docs/results/bench.json (records), bench.md (table), bench_bars.png, timelines_<workload>_R<R>.png and the
per-round timelines; ``--json OUT`` also writes the records to OUT. Trailing ``key=value`` override
config/rolloutpipe.yaml merged with config/rolloutpipe_bench.yaml (e.g. ``rolloutpipe.bench.sizes=[16]``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf, open_dict

from ..main import CONFIG_DIR, prepare_runtime
from ..mode_specs import ORCHESTRATION_PLACES, parse_mode_spec
from ..pipeline.modes import STOCK, TRAINER_MODES, TrainUnit
from ..provenance import git_commit, machine
from ..ray_start import stop_local_instance
from ..resolve import apply_layout
from .pinning import pool_env
from .report import write_all


def load_config(quick: bool, overrides: list[str], preset: str | None = None):
    """config/rolloutpipe.yaml, then config/rolloutpipe_bench.yaml, then the preset (--quick: ``quick``, --agentic:
    ``agentic``), then ``key=value`` overrides."""
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        cfg = compose(config_name="rolloutpipe")
    with open_dict(cfg):
        cfg = OmegaConf.merge(cfg, OmegaConf.load(Path(CONFIG_DIR) / "rolloutpipe_bench.yaml"))
        preset = preset or ("quick" if quick else None)
        if preset:
            cfg = OmegaConf.merge(cfg, {"rolloutpipe": {"bench": cfg.rolloutpipe.bench[preset]}})
        cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist(overrides))
        cfg.rolloutpipe.bench.out_dir = str(Path(cfg.rolloutpipe.bench.out_dir).resolve())
    return cfg


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m recipe.rolloutpipe.bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="stock, sync, cgp, cgp_fgd on one workload, one R, 5 rounds (about 10 minutes on 2 cores)")
    ap.add_argument("--headline", action="store_true",
                    help="the quick setting in fresh launches (rolloutpipe.bench.headline: runs x rounds), summarized "
                         "in docs/results/headline.json and the README's table (about 30 minutes on 2 cores)")
    ap.add_argument("--agentic", action="store_true",
                    help="every mode on the multi-turn workload agentic-longtail (verl's tool agent loop, prescribed "
                         "turns and tool latencies), R=16, 10 rounds -> docs/results/agentic/ (about 15 minutes)")
    ap.add_argument("--allow-dirty", action="store_true", help="--headline on a tree that differs from its commit")
    ap.add_argument("--json", type=Path, default=None, help="also write the summary records here")
    ap.add_argument("overrides", nargs="*", help="key=value overrides (verl / rolloutpipe keys)")
    args = ap.parse_args(argv)

    if args.headline:
        from . import headline

        spec = load_config(True, args.overrides).rolloutpipe.bench.headline
        result = headline.run(args.allow_dirty, args.overrides, int(spec.runs), int(spec.rounds), Path(spec.out_dir))
        out = args.json or headline.HEADLINE_JSON
        out.write_text(json.dumps(result, indent=1) + "\n")
        headline.write_readme_table(result)
        print(headline.readme_table(result))
        print(f"[rolloutpipe bench] headline -> {out}; README table regenerated")
        return
    cfg = load_config(args.quick, args.overrides, "agentic" if args.agentic else None)
    apply_layout(cfg)
    from ..config_check import RolloutPipeConfigError, validate

    try:
        validate(cfg)
    except RolloutPipeConfigError as e:
        raise SystemExit(str(e)) from None
    bench = cfg.rolloutpipe.bench
    def known(spec: str) -> bool:
        s = parse_mode_spec(spec)
        if s.orchestration not in (None, *ORCHESTRATION_PLACES):
            return False
        if s.mode == STOCK:  # verl's own step: no strength, width or train unit of the recipe's
            return (s.fgd_strength, s.frontier_width, s.train_unit) == (None, None, None)
        return s.mode in TRAINER_MODES and s.train_unit in (None, *TrainUnit)

    bad = [m for m in bench.modes if not known(m)]
    if bad:
        raise SystemExit(f"rolloutpipe bench: rolloutpipe.bench.modes: {bad} unknown; use stock (verl's own trainer) "
                         "or mode[:priority|:paced|:hold][/F_w|/auto|/engine][+step|+steps|+groups] with mode one of "
                         f"{[str(m) for m in TRAINER_MODES]}, either followed by @rollout or @trainer (orchestration "
                         "pinned to that pool's cores)")
    if bench.get("orchestration") not in (None, *ORCHESTRATION_PLACES):
        raise SystemExit(f"rolloutpipe bench: rolloutpipe.bench.orchestration={bench.orchestration!r}: use null "
                         "(unpinned), rollout or trainer (the pool whose cores the driver, task runner and Ray's "
                         "daemons are pinned to)")
    cores = os.sched_getaffinity(0)
    wanted = set(bench.rollout_cpus) | set(bench.trainer_cpus)
    if not wanted <= cores or set(bench.rollout_cpus) & set(bench.trainer_cpus):
        raise SystemExit(f"rolloutpipe bench: rolloutpipe.bench.rollout_cpus={list(bench.rollout_cpus)} and "
                         f"trainer_cpus={list(bench.trainer_cpus)} must be disjoint cores of this machine "
                         f"{sorted(cores)}")
    prepare_runtime(cfg, worker_env=pool_env(list(bench.rollout_cpus), list(bench.trainer_cpus)))
    import ray

    from .runner import BenchTaskRunner

    t0, commit = time.monotonic(), git_commit()  # the commit at launch: the rounds below measure this tree
    try:
        raw = ray.get(BenchTaskRunner.options(num_cpus=1).remote().run.remote(cfg))
    finally:
        stop_local_instance()  # nothing of this launch left running into the next one (--headline's launches)
    raw["settings"] = {
        "K": int(cfg.actor_rollout_ref.rollout.n), "U": int(cfg.actor_rollout_ref.actor.ppo_mini_batch_size),
        "F_w": cfg.rolloutpipe.frontier_width, "fgd_strength": cfg.rolloutpipe.fgd_strength,
        "train_unit": cfg.rolloutpipe.train_unit, "max_response_length": int(cfg.data.max_response_length),
        "max_num_seqs": int(cfg.actor_rollout_ref.rollout.max_num_seqs), "modes": list(bench.modes),
        "rollout_cpus": list(bench.rollout_cpus), "trainer_cpus": list(bench.trainer_cpus),
        "orchestration": bench.get("orchestration"), "warmup_rounds": int(bench.warmup_rounds),
        "rounds": int(bench.rounds), "quick": args.quick, "preset": "agentic" if args.agentic else None,
        "seed": int(bench.seed), "max_prompt_length": int(cfg.data.max_prompt_length),
        "overrides": list(args.overrides),  # what a result ran on beyond the configs (its data files, R, modes)
        "profiles": OmegaConf.to_container(bench.profiles), "machine": f"{platform.machine()} {len(cores)} cores",
        "wall_s": time.monotonic() - t0,
    }
    raw["git_commit"], raw["machine"] = commit, machine()
    summary = write_all(raw, Path(bench.out_dir), args.json)
    print((Path(bench.out_dir) / "bench.md").read_text())
    print(f"[rolloutpipe bench] {len(summary['records'])} records in {raw['settings']['wall_s']:.0f} s -> "
          f"{bench.out_dir}/bench.json" + (f", {args.json}" if args.json else ""))


if __name__ == "__main__":
    main()

"""``python -m recipe.rolloutpipe.sim``: the what-if simulator (docs/simulator.md).

  --paper            the paper's 12 settings x 3 modes (table; --json OUT writes the records)
  --what-if DIR      sweeps users ask about (rollout/trainer GPU split, R, F_w incl. adaptive, length tail) -> PNGs
  --from-run PATH    calibrate from a real round's timeline JSON (what the trainer writes) and predict every mode
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

from ..pipeline import RoundSettings, RoundTimeline
from ..pipeline.modes import STOCK
from .calibrate import fit_engine_scale
from .paper import ENGINE, PAPER_MODES, TRAINER, WORKLOAD_SHAPES, calibrated, paper_matrix
from .simulator import EngineModel, TrainerModel, Workload, paper_round, simulate_round

MODES_ALL = (("sync", "priority"), ("cgp", "priority"), ("cgp_fgd", "priority"), ("cgp_fgd", "hold"),
             ("cgp_fgd_adaptive", "hold"))


def print_paper_table(records: list[dict]) -> None:
    by = {(r["workload"], r["R"], r["mode"]): r for r in records}
    hdr = (f"{'workload':9} {'R':>3} | {'rollout_to_train_end_s':^26} | {'trainer_wait_ratio':^20} | "
           f"{'first_dispatch_s':^20} | {'reduction vs sync':^18}")
    print(hdr)
    print(f"{'':13} | {'sync':>8} {'cgp':>8} {'fgd':>8} | {'sync':>6} {'cgp':>6} {'fgd':>6} | "
          f"{'sync':>6} {'cgp':>6} {'fgd':>6} | {'cgp':>8} {'fgd':>8}")
    print("-" * len(hdr))
    for (w, r) in dict.fromkeys((k[0], k[1]) for k in by):
        s, c, f = (by[(w, r, m)] for m in PAPER_MODES)
        e = "rollout_to_train_end_s"
        print(f"{w:9} {r:>3} | {s[e]:8.1f} {c[e]:8.1f} {f[e]:8.1f} | "
              f"{s['trainer_wait_ratio']:6.1%} {c['trainer_wait_ratio']:6.1%} {f['trainer_wait_ratio']:6.1%} | "
              f"{s['first_dispatch_s']:6.1f} {c['first_dispatch_s']:6.1f} {f['first_dispatch_s']:6.1f} | "
              f"{1 - c[e] / s[e]:8.1%} {1 - f[e] / s[e]:8.1%}")


def _end(spec: RoundSettings, w: Workload, engine: EngineModel = ENGINE, trainer: TrainerModel = TRAINER) -> float:
    return simulate_round(spec, w, engine, trainer).metrics()["rolloutpipe/rollout_to_train_end_s"]


def what_if(out_dir: Path, workload: str = "OlyPhys") -> dict:
    """Sweeps on one workload at R=96 (K=8, U=2); returns the numbers and writes one PNG per sweep."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    w = calibrated(workload)
    out_dir.mkdir(parents=True, exist_ok=True)
    res: dict = {}

    def sweep(name: str, xs: list, build, xlabel: str) -> None:  # build(x, mode, strength) -> args
        rows = {f"{m}/{s}": [_end(*build(x, m, s)) for x in xs] for m, s in MODES_ALL}
        res[name] = {"x": xs, **rows}
        fig, ax = plt.subplots(figsize=(7, 4))
        for label, ys in rows.items():
            ax.plot(xs, ys, marker="o", label=label.replace("sync/priority", "sync").replace(
                "cgp/priority", "cgp").replace("cgp_fgd_adaptive/hold", "cgp_fgd adaptive hold").replace("/", " "))
        if name == "frontier_width":
            ax.set_yscale("log")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("rollout_to_train_end_s")
        ax.set_title(f"{workload}: {name}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out_dir / f"whatif_{name}.png", dpi=100)
        plt.close(fig)

    # 10 GPUs split between rollout (r) and training (10 - r); speeds scale linearly from the paper's 2:8 split
    def split(r, m, s):
        eng = replace(ENGINE, step_base_s=ENGINE.step_base_s * 2 / r, step_per_seq_s=ENGINE.step_per_seq_s * 2 / r,
                      max_running=ENGINE.max_running * r // 2, kv_tokens=ENGINE.kv_tokens * r // 2)
        tr = replace(TRAINER, per_group_s=TRAINER.per_group_s * 8 / (10 - r))
        return paper_round(96, mode=m, fgd_strength=s), w, eng, tr

    sweep("gpu_split", [1, 2, 3, 4, 5], split, "rollout GPUs (of 10; the rest train)")
    sweep("round_size", [16, 32, 64, 96, 128], lambda r, m, s: (paper_round(r, mode=m, fgd_strength=s), w),
          "R (groups per round)")
    sweep("frontier_width", [1, 2, 4, 8, 16, 32],
          lambda f, m, s: (paper_round(96, mode=m, fgd_strength=s, frontier_width=f), w), "F_w (groups)")
    sweep("length_tail", [0.0, 0.02, 0.05, 0.1, 0.2],
          lambda p, m, s: (paper_round(96, mode=m, fgd_strength=s), replace(w, p_cap=p)),
          "share of responses at the length cap")
    (out_dir / "whatif.json").write_text(json.dumps(res, indent=1))
    return res


def calibrate_from_run(timeline: RoundTimeline, workload: Workload, mode: str, spec: RoundSettings,
                       seed: int = 0) -> tuple:
    """Fit the trainer (compute per group, from the busy intervals) and the engine's speed (one time scale, by
    bisection, so the simulated rollout of the measured mode lasts as long as the measured one)."""
    m = timeline.metrics()
    groups = sum(len(iv.group_ids) for iv in timeline.intervals)
    trainer = replace(TRAINER, per_group_s=m["rolloutpipe/trainer_busy_s"] / max(groups, 1), step_overhead_s=0.0,
                      publish_s=m.get("rolloutpipe/publish_s", 0.0))
    eng = fit_engine_scale(spec.replace(mode=mode), workload, ENGINE, trainer, m["rolloutpipe/rollout_s"], seed)
    return eng, trainer


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m recipe.rolloutpipe.sim", description=__doc__.splitlines()[0])
    ap.add_argument("--paper", action="store_true", help="run the paper's 12 x 3 matrix")
    ap.add_argument("--json", type=Path, help="write the --paper records (or --from-run predictions) here")
    ap.add_argument("--what-if", type=Path, metavar="DIR", help="run the what-if sweeps, PNGs into DIR")
    ap.add_argument("--from-run", type=Path, metavar="PATH", help="a round timeline JSON from a real run")
    ap.add_argument("--from-bench", type=Path, metavar="RAW",
                    help="bench_raw.json of python -m recipe.rolloutpipe.bench: calibrate on each setting's sync "
                         "rounds, predict every mode, print the errors")
    ap.add_argument("--out-of-sample", action="store_true",
                    help="--from-bench: calibrate on verl's own (stock) rounds only -- no contention fitted on a "
                         "pipelined mode -- so every pipelined mode is a prediction")
    ap.add_argument("--mode", default=None,
                    help="the mode PATH was measured in (--from-run; default: the mode its settings record)")
    ap.add_argument("--workload", default="LSAT-AR", choices=sorted(WORKLOAD_SHAPES),
                    help="length profile for --from-run when the run's lengths are not in the timeline")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if not (args.paper or args.what_if or args.from_run or args.from_bench):
        ap.print_help()
        return 2
    if args.paper:
        records = paper_matrix(seed=args.seed)
        print_paper_table(records)
        if args.json:
            args.json.write_text(json.dumps(records, indent=1))
    if args.what_if:
        what_if(args.what_if)
        print(f"what-if plots in {args.what_if}")
    if args.from_bench:
        from .from_bench import validate_against_bench

        raw = json.loads(args.from_bench.read_text())
        serial = STOCK if args.out_of_sample and any(r["mode"] == STOCK for r in raw["results"]) else "sync"
        records = (validate_against_bench(raw, calibrate_mode=serial, contention_mode=None) if args.out_of_sample
                   else validate_against_bench(raw))
        for r in records:
            print(f"{r['workload']:16} R={r['R']:<3} {r['mode']:18} measured {r['measured_s']:6.2f}s  "
                  f"predicted {r['predicted_s']:6.2f}s  error {r['error']:+.1%}")
        fitted_modes = {serial} if args.out_of_sample else {"sync", "cgp"}
        pipelined = [abs(r["error"]) for r in records if r["mode"] not in fitted_modes]
        if pipelined:
            print(f"predicted modes: median |error| {sorted(pipelined)[len(pipelined) // 2]:.1%}, "
                  f"max {max(pipelined):.1%}, within 15%: {sum(e <= 0.15 for e in pipelined)}/{len(pipelined)}")
        if args.json:
            args.json.write_text(json.dumps(records, indent=1))
    if args.from_run:
        tl = RoundTimeline.from_dict(json.loads(args.from_run.read_text()))
        if not {"K", "U"} <= set(tl.settings):
            raise SystemExit(f"rolloutpipe sim: {args.from_run} has no 'settings' with K and U (a timeline written "
                             "before they were recorded): rerun the round to get a current timeline")
        n = sum(1 for g in tl.groups if g["state"] != "filtered")
        spec = paper_round(n, group_size=int(tl.settings["K"]), step_groups=int(tl.settings["U"]))
        w = calibrated(args.workload)
        measured_mode = args.mode or tl.settings.get("mode", "cgp_fgd")
        eng, tr = calibrate_from_run(tl, w, measured_mode, spec, args.seed)
        preds = []
        for mode, strength in MODES_ALL:
            pm = simulate_round(spec.replace(mode=mode, fgd_strength=strength), w, eng, tr, seed=args.seed).metrics()
            preds.append({"mode": mode, "fgd_strength": strength, "K": spec.group_size, "U": spec.step_groups,
                          **{k.split("/")[1]: round(v, 3) for k, v in pm.items()}})
            print(f"{mode:17} {strength:8} rollout_to_train_end_s={pm['rolloutpipe/rollout_to_train_end_s']:.2f} "
                  f"trainer_wait_ratio={pm['rolloutpipe/trainer_wait_ratio']:.1%}")
        if args.json:
            args.json.write_text(json.dumps(preds, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``python -m recipe.rolloutpipe.curves``: do whole runs learn the same as with verl's own trainer?

Runs the main job on the embedded default for each mode asked (default: ``stock``, verl's own trainer, and the
recipe's default ``cgp_fgd``; also ``sync``, ``cgp``) and every seed, one run after the other (a run is 2.3–4.5 min on
2 cores, by the host). A seed fixes the prompt
order (``data.seed``: the same prompts per round in every mode), vLLM's engine seed (``actor_rollout_ref.rollout.
seed``, verl's own trainer included) and, in RolloutPipe's modes, the per-request sampling
(``rolloutpipe.sampling_seed``). Each run logs through verl's ``file`` logger; this module reads those records and
writes ``<out>.json`` and ``<out>.png``:

- per mode and round: mean and spread (min, max over seeds) of the training reward and of greedy validation;
- ``final_val`` per seed, ``final_val_diff_vs_stock`` (mean over seeds of the paired difference to ``stock``'s run
  with the same seed) and its 95 % t-interval; ``equivalence``: two one-sided paired t-tests (TOST) that the
  difference lies within +-``EQUIVALENCE_MARGIN`` of final validation (equivalent when both reject at 5 %, i.e. the
  90 % t-interval lies inside the margin; ``scipy.stats.ttest_1samp``);
- per optimizer step of a round, the mean response length of the groups trained (``rolloutpipe/response_length/
  step<s>``): CGP trains groups in completion order, and short answers complete first. ``stock`` and ``sync`` train
  in submission order, so ``sync`` is the reference (verl's serial trainer does not log per-step lengths).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .pipeline.modes import STOCK, TRAINER_MODES
from .provenance import git_commit, machine

ROOT = Path(__file__).resolve().parents[2]
MODES = (STOCK, *map(str, TRAINER_MODES))
TRAIN_REWARD = "critic/score/mean"
VAL_SUFFIX = "acc/mean@1"
STEP_LENGTH = "rolloutpipe/response_length/step"
EQUIVALENCE_MARGIN = 0.03  # of final greedy validation (exact-answer rate): what "learns the same" is held to


def mode_overrides(mode: str, seed: int) -> list[str]:
    """The main job's overrides for one run of the comparison."""
    common = [f"data.seed={seed}", f"actor_rollout_ref.rollout.seed={seed}"]
    if mode == STOCK:
        return [*common, "rolloutpipe.trainer=stock"]
    return [*common, f"rolloutpipe.mode={mode}", f"rolloutpipe.sampling_seed={seed}"]


def run_one(mode: str, seed: int, rounds: int, work: Path, extra: Sequence[str] = ()) -> list[dict[str, Any]]:
    """One main-job run; returns verl's file-logger records (``{"step": n, "data": {...}}`` per line)."""
    work.mkdir(parents=True, exist_ok=True)
    records = work / f"{mode}_seed{seed}.jsonl"
    cmd = [sys.executable, "-m", "recipe.rolloutpipe.main", f"trainer.total_training_steps={rounds}",
           "trainer.test_freq=10", "trainer.logger=[console,file]", f"trainer.experiment_name=curves_{mode}_{seed}",
           f"rolloutpipe.timeline_dir={work}/timelines_{mode}_{seed}", f"hydra.run.dir={work}/hydra_{mode}_{seed}",
           *mode_overrides(mode, seed), *extra]
    log = work / f"{mode}_seed{seed}.log"
    with log.open("w") as fh:
        done = subprocess.run(cmd, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT,
                              env={**os.environ, "VERL_FILE_LOGGER_PATH": str(records)})
    if done.returncode != 0:
        raise SystemExit(f"rolloutpipe curves: {mode} seed {seed} failed (exit {done.returncode}); see {log}")
    return [json.loads(line) for line in records.read_text().splitlines() if line.strip()]


def _val(data: dict[str, Any]) -> float | None:
    return next((float(v) for k, v in data.items() if k.startswith("val-core/") and k.endswith(VAL_SUFFIX)), None)


def series(records: list[dict[str, Any]]) -> dict[str, Any]:
    """One run's learning curve from its records: training reward per round, validation by round, and the mean
    response length per optimizer step of each round."""
    reward: dict[int, float] = {}
    val: dict[int, float] = {}
    steps: dict[int, list[float]] = {}
    for rec in records:
        step, data = int(rec["step"]), rec["data"]
        if TRAIN_REWARD in data:
            reward[step] = float(data[TRAIN_REWARD])
        if (v := _val(data)) is not None:
            val[step] = v
        lengths = {int(k.removeprefix(STEP_LENGTH)): float(v) for k, v in data.items() if k.startswith(STEP_LENGTH)}
        if lengths:
            steps[step] = [lengths[s] for s in sorted(lengths)]
    return {"reward": [reward[r] for r in sorted(reward)], "val": sorted(val.items()),
            "step_response_length": [steps[r] for r in sorted(steps)]}


def _t_interval(diffs: Sequence[float], level: float) -> list[float]:
    """The t-interval of the mean (a bootstrap of 3-5 values is only their range)."""
    from scipy import stats

    d = np.asarray(diffs, dtype=float)
    if len(d) < 2 or np.ptp(d) == 0:  # one value, or all equal: the interval is the point
        return [float(d.mean()), float(d.mean())] if len(d) else [float("nan")] * 2
    lo, hi = stats.t.interval(level, len(d) - 1, loc=d.mean(), scale=stats.sem(d))
    return [float(lo), float(hi)]


def equivalence(diffs: Sequence[float], margin: float = EQUIVALENCE_MARGIN, alpha: float = 0.05) -> dict[str, Any]:
    """TOST on paired differences: H0 "mean <= -margin" and H0 "mean >= +margin", each a one-sided t-test; the
    modes are equivalent within the margin when both are rejected at ``alpha``."""
    from scipy import stats

    d = np.asarray(diffs, dtype=float)
    if len(d) < 2 or np.ptp(d) == 0:
        p = 0.0 if len(d) and abs(d.mean()) < margin else 1.0  # no spread: the point decides
    else:
        p_low = stats.ttest_1samp(d, -margin, alternative="greater").pvalue
        p_high = stats.ttest_1samp(d, margin, alternative="less").pvalue
        p = float(max(p_low, p_high))
    return {"test": "TOST, paired t", "margin": margin, "alpha": alpha, "n": int(len(d)), "p": round(p, 4),
            "ci90": [round(x, 4) for x in _t_interval(d, 1 - 2 * alpha)], "equivalent": bool(p < alpha)}


def summarize(runs: dict[str, dict[int, dict[str, Any]]]) -> dict[str, Any]:
    """``runs[mode][seed]`` = :func:`series` of that run. Pure: what the JSON holds per mode."""
    out: dict[str, Any] = {}
    stock_final = {s: r["val"][-1][1] for s, r in runs.get(STOCK, {}).items() if r["val"]}
    for mode, by_seed in runs.items():
        seeds = sorted(by_seed)
        rewards = np.array([by_seed[s]["reward"] for s in seeds])
        val_rounds = [r for r, _ in by_seed[seeds[0]]["val"]]
        vals = np.array([[v for _, v in by_seed[s]["val"]] for s in seeds])
        final = [float(by_seed[s]["val"][-1][1]) for s in seeds]
        entry: dict[str, Any] = {
            "seeds": seeds, "rounds": int(rewards.shape[1]),
            "train_reward_mean": rewards.mean(0).round(4).tolist(),
            "train_reward_min": rewards.min(0).round(4).tolist(), "train_reward_max": rewards.max(0).round(4).tolist(),
            "val_rounds": val_rounds, "val_mean": vals.mean(0).round(4).tolist(),
            "val_min": vals.min(0).round(4).tolist(), "val_max": vals.max(0).round(4).tolist(),
            "final_val": final,
        }
        lengths = [by_seed[s]["step_response_length"] for s in seeds if by_seed[s]["step_response_length"]]
        if lengths:  # mean over seeds and rounds, per optimizer step of a round
            width = min(len(r) for run in lengths for r in run)
            per_step = np.array([r[:width] for run in lengths for r in run])
            entry["step_response_length"] = per_step.mean(0).round(4).tolist()
        paired = [final[i] - stock_final[s] for i, s in enumerate(seeds) if s in stock_final]
        if paired and mode != STOCK:
            entry["final_val_diff_vs_stock"] = float(np.mean(paired))
            entry["final_val_diff_vs_stock_ci"] = _t_interval(paired, 0.95)
            entry["equivalence"] = equivalence(paired)
            lo, hi = min(stock_final.values()), max(stock_final.values())
            entry["final_val_inside_stock_spread"] = bool(lo <= float(np.mean(final)) <= hi)
        out[mode] = entry
    return out


def plot(summary: dict[str, Any], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_r, ax_v, ax_l) = plt.subplots(1, 3, figsize=(15, 4))
    for (mode, m), color in zip(summary.items(), ("black", "tab:blue", "tab:orange", "tab:green"), strict=False):
        x = np.arange(1, m["rounds"] + 1)
        ax_r.plot(x, m["train_reward_mean"], color=color, label=mode)
        ax_r.fill_between(x, m["train_reward_min"], m["train_reward_max"], color=color, alpha=0.12)
        ax_v.plot(m["val_rounds"], m["val_mean"], "o-", color=color, label=mode)
        ax_v.fill_between(m["val_rounds"], m["val_min"], m["val_max"], color=color, alpha=0.12)
        if "step_response_length" in m:
            ax_l.plot(range(len(m["step_response_length"])), m["step_response_length"], "o-", color=color,
                      label=mode)
    seeds = len(next(iter(summary.values()))["seeds"])
    ax_r.set(title=f"training reward per round (mean, band: min-max of {seeds} seeds)", xlabel="round",
             ylabel="exact-answer reward")
    ax_v.set(title="greedy validation (256 held-out prompts)", xlabel="round")
    ax_l.set(title="mean response length of the groups trained", xlabel="optimizer step within a round",
             ylabel="tokens")
    for ax in (ax_r, ax_v, ax_l):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def main(argv: Sequence[str] | None = None) -> None:
    from tqdm import tqdm

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=40)  # the main job's length
    # 10 by default: with 5, the seed-to-seed spread of final validation is too wide for EQUIVALENCE_MARGIN
    ap.add_argument("--seeds", type=int, nargs="+", default=list(range(10)))
    ap.add_argument("--modes", nargs="+", default=[STOCK, "cgp_fgd"], choices=MODES)  # verl's trainer, the default
    ap.add_argument("--out", default="docs/results/learning_curves", help="writes OUT.json and OUT.png")
    ap.add_argument("--work", default="outputs/curves", help="per-run logs, records and timelines")
    ap.add_argument("overrides", nargs="*", help="extra key=value overrides for every run")
    args = ap.parse_args(argv)
    if args.rounds < 10:
        raise SystemExit("rolloutpipe curves: --rounds must be >= 10 (validation runs every 10 rounds)")
    work, runs = Path(args.work), {}
    t0, commit = time.time(), git_commit()  # the commit at launch: the runs below measure this tree
    plan = [(m, s) for s in args.seeds for m in args.modes]  # seed-major: an interrupted sweep has whole seeds
    for mode, seed in tqdm(plan, desc="curves (runs)", unit="run"):
        runs.setdefault(mode, {})[seed] = series(run_one(mode, seed, args.rounds, work, args.overrides))
    summary = summarize({m: runs[m] for m in args.modes if m in runs})
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    result = {"git_commit": commit, "machine": machine(),
              "rounds": args.rounds, "seeds": args.seeds, "overrides": args.overrides,
              "wall_s": round(time.time() - t0, 1), "modes": summary}
    out.with_suffix(".json").write_text(json.dumps(result, indent=1))
    plot(summary, out.with_suffix(".png"))
    for mode, m in summary.items():
        diff = (f"; final val - stock {m['final_val_diff_vs_stock']:+.3f} CI "
                f"[{m['final_val_diff_vs_stock_ci'][0]:+.3f}, {m['final_val_diff_vs_stock_ci'][1]:+.3f}]; "
                f"equivalent within +-{EQUIVALENCE_MARGIN}: {m['equivalence']['equivalent']} "
                f"(TOST p={m['equivalence']['p']})" if "final_val_diff_vs_stock" in m else "")
        print(f"{mode:8s} final val {m['final_val']}{diff}")
    print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.png')}")


if __name__ == "__main__":
    main()

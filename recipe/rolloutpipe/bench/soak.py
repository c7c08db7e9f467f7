"""Does a long run stay flat? ``python -m recipe.rolloutpipe.bench.soak [--rounds 300] [key=value ...]``.

Runs the main job (``python -m recipe.rolloutpipe.main``, the embedded default unless overridden) for ``--rounds``
rounds and, after each round (a line of verl's ``file`` logger), samples every process of the run: the driver, Ray's
task runner and workers, vLLM's engine processes, Ray's own daemons (each by pid, resident set size), Ray's
object-store bytes in use (the raylet's store stats: weights are published through it every round), the round's
time (``timing_s/step``) and ``lp_diff_p50``/``lp_diff_p90``. Writes docs/results/soak.json and a PNG beside it.

Summary per process (present at round ``--skip`` and at the end): ``rss_mb_first``, ``rss_mb_last`` and
``rss_slope_mb_per_100_rounds``, a least-squares line over the rounds after ``--skip`` (start-up and the first
validations excluded); ``round_time_slope_per_100_rounds`` in seconds and in % of the median round. Held to:
no process grows more than 50 MB per 100 rounds, round time flat within +-5 % per 100 rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import psutil

from ..logs import get_logger
from ..provenance import ROOT, git_commit, machine
from .pinning import cpu_category, descendants, process_title

logger = get_logger(__name__)
SOAK_JSON = ROOT / "docs" / "results" / "soak.json"
TARGETS = {"rss_slope_mb_per_100_rounds": 50.0, "round_time_change_pct_per_100_rounds": 5.0}
MB = 1024 * 1024


# ---- sampling -------------------------------------------------------------------------------------------------
def process_label(proc: psutil.Process, driver_pid: int) -> str:
    """``whose:title[pid]``: whose as the bench's CPU accounting says (driver, trainer, rollout, ray_daemons), the
    title Ray or vLLM gives the process (``ray::TaskRunner``, ``VLLM::EngineCore``) or its script, then the pid (a
    worker's title changes with the method it runs; its pid does not)."""
    try:
        cmd = proc.cmdline()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        cmd = []
    if proc.pid == driver_pid:
        return f"driver:main[{proc.pid}]"
    head = cmd[0] if cmd else ""
    if head.startswith(("ray::", "VLLM::")):
        title = head.split()[0].split(".")[0]
    else:
        script = next((a for a in cmd[1:] if a.endswith(".py")), head)
        title = os.path.basename(script.split()[0]).removesuffix(".py") if script else "?"
    return f"{cpu_category(' '.join(cmd))}:{title}[{proc.pid}]"


def sample_processes(driver_pid: int) -> dict[str, float]:
    """RSS (MB) of the driver and every descendant (Ray's daemons and workers, vLLM's processes) right now."""
    out: dict[str, float] = {}
    for pid in descendants(driver_pid):  # the bench's own walk of the process tree (pinning.py)
        try:
            p = psutil.Process(pid)
            out[process_label(p, driver_pid)] = p.memory_info().rss / MB
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue  # ended between the listing and the read
    return out


def gcs_address(driver_pid: int) -> str | None:
    """The run's own Ray cluster (another may run on the machine): from its raylet's ``--gcs-address``."""
    for pid in descendants(driver_pid):
        for arg in process_title(pid).split():
            if arg.startswith("--gcs-address="):
                return arg.split("=", 1)[1]
    return None


class ObjectStoreProbe:
    """Ray's object-store bytes in use, from the raylet's store stats (what ``ray memory --stats-only`` prints)."""

    def __init__(self, driver_pid: int) -> None:
        self.driver_pid = driver_pid
        self._state = None
        self._warned = False

    def __call__(self) -> tuple[float, int] | None:
        """(bytes in use, objects held), or None when the store cannot be asked."""
        try:
            from ray._private.authentication.authentication_token_setup import (
                maybe_enable_token_auth_if_token_available,
            )
            from ray._private.internal_api import get_memory_info_reply, get_state_from_address

            if self._state is None:
                address = gcs_address(self.driver_pid)
                if address is None:
                    return None
                # Ray's token auth (on by default when ~/.ray/auth_token exists): a client must present it too
                maybe_enable_token_auth_if_token_available(warn_if_disabled=False)
                self._state = get_state_from_address(address)
            stats = get_memory_info_reply(self._state, timeout_seconds=10).store_stats
            return float(stats.object_store_bytes_used), int(stats.num_local_objects)
        except Exception as e:  # a probe: the RSS samples matter more than one missed store reading
            if not self._warned:
                logger.warning(f"soak: Ray's object-store stats unavailable ({e!r}); recorded as null")
                self._warned = True
            self._state = None
            return None


# ---- summary --------------------------------------------------------------------------------------------------
def slope_per_100(xs: Iterable[float], ys: Iterable[float]) -> float:
    """Least-squares slope of ys over xs, per 100 rounds."""
    from scipy.stats import linregress

    xs, ys = list(xs), list(ys)
    if len(xs) < 3:
        return float("nan")
    return float(linregress(xs, ys).slope * 100)


def summarize(per_round: list[dict[str, Any]], skip: int) -> dict[str, Any]:
    """Per process and for the run: first/last and the slope per 100 rounds over the rounds after ``skip``."""
    import numpy as np

    late = [r for r in per_round if r["round"] > skip] or per_round
    labels = sorted({k for r in late for k in r["rss_mb"]})
    processes: dict[str, Any] = {}
    for label in labels:
        seen = [(r["round"], r["rss_mb"][label]) for r in late if label in r["rss_mb"]]
        # present from after the warm-up to the end (not a short-lived helper); the last round's sample may miss the
        # workers: it is taken as the run shuts down, and they exit before the driver
        whole = all(label in r["rss_mb"] for r in late[:-1])
        processes[label] = {
            "rounds_seen": len(seen), "whole_run": whole,
            "rss_mb_first": round(seen[0][1], 1), "rss_mb_last": round(seen[-1][1], 1),
            "rss_slope_mb_per_100_rounds": round(slope_per_100(*zip(*seen, strict=True)), 2) if whole else None,
        }
    times = [(r["round"], r["round_s"]) for r in late if r.get("round_s") is not None]
    time_slope = slope_per_100(*zip(*times, strict=True)) if times else float("nan")
    median_s = float(np.median([t for _, t in times])) if times else float("nan")
    store = [(r["round"], r["object_store_bytes"] / MB) for r in late if r.get("object_store_bytes") is not None]
    slopes = {k: v["rss_slope_mb_per_100_rounds"] for k, v in processes.items()
              if v["rss_slope_mb_per_100_rounds"] is not None}
    worst = max(slopes, key=lambda k: slopes[k]) if slopes else None
    time_pct = 100 * time_slope / median_s if times else float("nan")
    return {
        "rounds": len(per_round), "slope_after_round": skip,
        "processes": processes,
        "max_rss_slope": {"process": worst, "mb_per_100_rounds": slopes.get(worst)},
        "object_store_mb_first": round(store[0][1], 1) if store else None,
        "object_store_mb_last": round(store[-1][1], 1) if store else None,
        "object_store_slope_mb_per_100_rounds": round(slope_per_100(*zip(*store, strict=True)), 2) if store else None,
        "object_store_objects_first_last": [late[0].get("object_store_objects"), late[-1].get("object_store_objects")],
        "round_time_median_s": round(median_s, 3),
        "round_time_slope_per_100_rounds": round(time_slope, 4),
        "round_time_change_pct_per_100_rounds": round(time_pct, 2),
        # same weights every round: how close the noise of vLLM-vs-trainer log-probs came to the stale-weights stop
        "lp_diff_max": {q: max((r[f"lp_diff_{q}"] for r in per_round if r.get(f"lp_diff_{q}") is not None),
                               default=None) for q in ("p50", "p90")},
        "meets_targets": {
            "rss": bool(slopes) and max(slopes.values()) <= TARGETS["rss_slope_mb_per_100_rounds"],
            "round_time": abs(time_pct) <= TARGETS["round_time_change_pct_per_100_rounds"],
        },
    }


def plot(result: dict[str, Any], png: Path, top: int = 6) -> None:
    """RSS of the largest and the fastest-growing processes, the object store and the round time, per round."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["per_round"]
    rounds = [r["round"] for r in rows]
    last = rows[-1]["rss_mb"]
    slopes = {k: v["rss_slope_mb_per_100_rounds"] for k, v in result["summary"]["processes"].items()
              if v["rss_slope_mb_per_100_rounds"] is not None}
    shown = sorted(last, key=last.get, reverse=True)[:top]  # the largest, and the fastest-growing whatever their size
    shown += [k for k in sorted(slopes, key=slopes.get, reverse=True)[:3] if k not in shown]
    fig, (ax1, ax2, ax3) = plt.subplots(3, 1, figsize=(10, 9), sharex=True)
    for label in shown:
        ax1.plot(rounds, [r["rss_mb"].get(label, float("nan")) for r in rows], label=label, lw=1)
    ax1.set_ylabel("RSS (MB)")
    ax1.legend(fontsize=7, ncol=2)
    ax1.set_title(f"soak: {len(rows)} rounds of the main job at {result['git_commit']}")
    ax2.plot(rounds, [float("nan") if r["object_store_bytes"] is None else r["object_store_bytes"] / MB
                      for r in rows], color="tab:purple", lw=1)
    ax2.set_ylabel("Ray object store (MB)")
    ax3.plot(rounds, [r["round_s"] for r in rows], color="tab:gray", lw=1)
    ax3.set_ylabel("round time (s)")
    ax3.set_xlabel("round")
    for ax in (ax1, ax2, ax3):
        ax.axvline(result["summary"]["slope_after_round"], color="k", lw=0.5, ls=":")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


# ---- the run --------------------------------------------------------------------------------------------------
def soak(rounds: int, skip: int, overrides: list[str], out: Path, workdir: Path) -> dict[str, Any]:
    from tqdm import tqdm

    commit = git_commit()
    metrics_path = workdir / "metrics.jsonl"
    cmd = [sys.executable, "-m", "recipe.rolloutpipe.main", f"trainer.total_training_steps={rounds}",
           "trainer.logger=[console,file]", f"rolloutpipe.timeline_dir={workdir / 'timelines'}",
           f"trainer.default_local_dir={workdir / 'checkpoints'}", f"hydra.run.dir={workdir / 'hydra'}", *overrides]
    log_path = workdir / "main_job.log"
    logger.info(f"soak: {' '.join(cmd[1:])} (log: {log_path})")
    env = {**os.environ, "VERL_FILE_LOGGER_PATH": str(metrics_path)}
    with open(log_path, "w") as log:
        job = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    store = ObjectStoreProbe(job.pid)
    per_round: list[dict[str, Any]] = []
    seen_lines = 0
    bar = tqdm(total=rounds, desc="soak (rounds)", unit="round")
    started = time.monotonic()
    while True:
        ended = job.poll() is not None
        # whole lines only: the logger may be half-way through one
        lines = metrics_path.read_text().split("\n")[:-1] if metrics_path.exists() else []
        for line in lines[seen_lines:]:
            rec = json.loads(line)
            data = rec.get("data", rec)
            if "timing_s/step" not in data:  # the validation before training is logged apart
                continue
            per_round.append({
                "round": int(rec.get("step", data.get("training/global_step", 0))),
                "t_s": round(time.monotonic() - started, 1),
                "round_s": float(data["timing_s/step"]),
                "lp_diff_p50": data.get("rolloutpipe/rollout_vs_trainer_logprob_diff_p50"),
                "lp_diff_p90": data.get("rolloutpipe/rollout_vs_trainer_logprob_diff_p90"),
                **dict(zip(("object_store_bytes", "object_store_objects"), (None if ended else store()) or (None, None),
                           strict=True)),
                "rss_mb": {k: round(v, 1) for k, v in sample_processes(job.pid).items()},
            })
            bar.update(1)
        seen_lines = len(lines)
        if ended:
            break
        time.sleep(0.5)
    bar.close()
    # a run that stopped early is a result too (what stopped it, and the memory up to then): written, then raised
    stopped = None
    if job.returncode != 0 or len(per_round) < rounds:
        log = log_path.read_text(errors="replace").splitlines()
        reason = [line for line in log if line.startswith("rolloutpipe:")]  # the recipe's one message, if it stopped
        stopped = {"exit_code": job.returncode, "after_rounds": len(per_round),
                   "message": reason[-1] if reason else None}
    result = {"git_commit": commit, "machine": machine(), "command": " ".join(cmd[1:]), "rounds_asked": rounds,
              "stopped_early": stopped, "summary": summarize(per_round, skip) if per_round else None,
              "per_round": per_round}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    if per_round:
        plot(result, out.with_suffix(".png"))
    if stopped is not None:
        raise SystemExit(f"soak: the main job ended with exit code {job.returncode} after {len(per_round)} of "
                         f"{rounds} rounds ({stopped['message']}); its log: {log_path}; what was measured: {out}")
    return result


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=300)
    ap.add_argument("--skip", type=int, default=20, help="rounds left out of the slopes (start-up, warm caches)")
    ap.add_argument("--out", type=Path, default=SOAK_JSON)
    ap.add_argument("--work", type=Path, default=Path("outputs/soak"), help="the run's log, metrics and timelines")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides for the main job (verl's keys)")
    ap.add_argument("--summarize-only", action="store_true",
                    help="recompute the summary and PNG of --out from its per-round samples (no run)")
    args = ap.parse_args(argv)
    if args.summarize_only:
        result = json.loads(args.out.read_text())
        result["summary"] = summarize(result["per_round"], args.skip)
        result["summary_commit"] = git_commit()  # the summary's code, when it is newer than the run's
        args.out.write_text(json.dumps(result, indent=1) + "\n")
        plot(result, args.out.with_suffix(".png"))
    else:
        args.work.mkdir(parents=True, exist_ok=True)
        result = soak(args.rounds, args.skip, args.overrides, args.out, args.work.resolve())
    s = result["summary"]
    logger.info(f"soak: {s['rounds']} rounds; largest RSS slope {s['max_rss_slope']}; object store "
                f"{s['object_store_mb_first']} -> {s['object_store_mb_last']} MB; round time median "
                f"{s['round_time_median_s']} s, {s['round_time_change_pct_per_100_rounds']:+.2f} % per 100 rounds; "
                f"targets met: {s['meets_targets']}; {args.out}")


if __name__ == "__main__":
    main()

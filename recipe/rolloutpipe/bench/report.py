"""Benchmark results → JSON records, a markdown table and PNGs (pure Python + matplotlib, no Ray/verl)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import numpy as np

from ..drawing import plot_gantt
from ..pipeline import PREFIX, RoundTimeline
from ..pipeline.modes import STOCK
from .pinning import CPU_CATEGORIES

FORWARD = "rollout:VLLM::Worker"  # the rollout pool's process that runs the model (vLLM's CPU worker)

METRICS = ("rollout_to_train_end_s", "trainer_wait_ratio", "first_dispatch_s", "overlap_efficiency",
           "trainer_busy_s", "rollout_s", "last_group_admitted_s", "ideal_s", "serial_estimate_s",
           "trainer_wait_before_first_s", "publish_s",
           "old_log_prob_s", "worker_compute_s", "worker_infer_s", "worker_train_s", "call_overhead_s",
           "call_overhead_share", "trainer_calls", "trainer_payload_bytes", "trainer_payload_calls")
# the critical path of rollout-to-train-end, in order; the parts add up to it (update: the rest of the trainer calls)
CRITICAL_PATH = (("wait_no_group_yet_s", "waiting: no trainable group yet"),
                 ("wait_groups_generating_s", "waiting: later groups still generating"),
                 ("wait_after_rollout_s", "waiting: driver (rewards, advantages, dispatch)"),
                 ("old_log_prob_s", "trainer: old log-probs"),
                 ("update_s", "trainer: actor update (incl. per-call Ray/verl overhead)"))


def critical_path(rnd: dict) -> dict[str, float]:
    """One round's rollout-to-train-end split along ``CRITICAL_PATH`` (seconds)."""
    m = {k.removeprefix(PREFIX): v for k, v in rnd["metrics"].items()}
    out = {k: float(m.get(k, float("nan"))) for k, _ in CRITICAL_PATH[:-1]}
    out["update_s"] = m.get("update_actor_s", m["trainer_busy_s"] - m.get("old_log_prob_s", 0.0))
    return out


def _median(xs: list[float]) -> float:
    xs = [x for x in xs if x == x]  # drop NaN
    return statistics.median(xs) if xs else float("nan")


def _measured(setting: dict) -> list[dict]:
    return [r for r in setting["rounds"] if not r["warmup"]]


def materialize_per_group_s(timeline: dict) -> float:
    """A round's per-group pipeline cost read from its timeline: the median time from a group's last response to
    its rows being trainable (reward, advantages, rows)."""
    mats = [g["times"]["materialized"] - g["times"]["serving_complete"] for g in timeline["groups"]
            if "materialized" in g["times"] and "serving_complete" in g["times"]]
    return _median(mats)


def completion_order_rho(timeline: dict) -> float:
    """Spearman's rank correlation between the groups' submission order and the order they completed in. Near 1:
    the engine already serves groups in the order they were sent, and FGD's frontier (the lowest-order groups first)
    has nothing to reorder; FGD can gain over FCFS only where FCFS completes groups out of order (low values)."""
    from scipy.stats import spearmanr

    done = [(g["order"], g["times"]["serving_complete"]) for g in timeline["groups"]
            if "serving_complete" in g["times"]]
    if len({t for _, t in done}) < 3:  # a batch that ends at once (verl's step) has no completion order
        return float("nan")
    return float(spearmanr([o for o, _ in done], [t for _, t in done]).statistic)


def median_ci(strata: list[list[float]], seed: int = 0) -> list[float]:
    """95 % CI of the median of all values: a BCa bootstrap (scipy.stats.bootstrap) with each stratum's values
    resampled within that stratum (one stratum: a plain bootstrap; several: the launches of a headline, so no resample
    mixes one launch's state into another's). The percentile interval of a few values is their min-max, so it is
    used only where BCa is degenerate (ties everywhere). [x, x] when nothing varies."""
    samples = tuple(np.asarray([x for x in s if x == x], dtype=float) for s in strata)
    samples = tuple(s for s in samples if len(s))
    pooled = np.concatenate(samples) if samples else np.asarray([])
    if not len(pooled):
        return [float("nan"), float("nan")]
    if len(pooled) < 2 or pooled.max() == pooled.min() or any(len(s) < 2 for s in samples):
        return [float(np.median(pooled))] * 2
    import warnings

    from scipy.stats import bootstrap

    def median_of_all(*xs: np.ndarray, axis: int = -1) -> np.ndarray:
        return np.median(np.concatenate(xs, axis=axis), axis=axis)

    for method in ("BCa", "percentile"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a degenerate BCa warns, then returns nan: the fallback below
            res = bootstrap(samples, median_of_all, method=method, paired=False, confidence_level=0.95,
                            n_resamples=9999, random_state=np.random.default_rng(seed))
        lo, hi = float(res.confidence_interval.low), float(res.confidence_interval.high)
        if lo == lo and hi == hi:
            return [lo, hi]
    return [float("nan"), float("nan")]


def _bootstrap_median_ci(xs: list[float], seed: int = 0) -> list[float]:
    """95 % CI of the median of ``xs`` (``median_ci``, one stratum)."""
    return median_ci([xs], seed)


def _paired(rounds: list[dict], base: list[dict], key: str = "rollout_to_train_end_s",
            compare: str = "reduction") -> tuple[float, list[float], list[float]]:
    """Per round against ``base``'s run of the same round (same round index: same prompts, lengths and start
    state), on metric ``key``: ``reduction`` 1 - x / x_base, ``ratio`` x / x_base or ``difference`` x - x_base;
    their median and its bootstrap CI, and the per-round values."""
    key, nan = PREFIX + key, float("nan")
    by_round = {r["round"]: r["metrics"].get(key, nan) for r in base}
    pairs = [(r["metrics"].get(key, nan), by_round[r["round"]]) for r in rounds if r["round"] in by_round]
    per_round = [x - b if compare == "difference" else x / b if b else nan for x, b in pairs]
    if compare == "reduction":
        per_round = [1 - x for x in per_round]
    return _median(per_round), _bootstrap_median_ci(per_round), per_round


def cut_vs_verl(end_s: float, stock_end_s: float) -> float:
    """A round's cut against verl's step of the same round: 1 - end / stock's end."""
    return 1 - end_s / stock_end_s


def fraction_of_ideal(end_s: float, ideal_s: float, stock_end_s: float) -> float | None:
    """One round's cut against verl's step divided by the cut of the round's own bound, ``ideal_s`` (its rollout
    plus its last optimizer step, or its first group plus all its training): 1.0 = as fast as that round's own
    rollout allows, never above (a round cannot end before its bound). None when the bound is not below verl's step
    (nothing to cut)."""
    if not (ideal_s == ideal_s and stock_end_s > 0 and ideal_s < stock_end_s):
        return None
    return cut_vs_verl(end_s, stock_end_s) / cut_vs_verl(ideal_s, stock_end_s)


def overlap_efficiency_vs_stock(mode_round: dict, stock_round: dict, sync_round: dict | None,
                                step_share: float) -> float:
    """architecture.md §4 with T_rollout, T_train and the serial estimate from verl's own (``stock``) run of the same
    round: a mode that stretches its own rollout cannot look efficient. The first group's earliest arrival is the
    ``sync`` run's of the same round (an engine undisturbed by training, FCFS), else the mode's own;
    ``step_share`` = U / R (the last optimizer step's share of the trainer's work)."""
    s, m = stock_round["metrics"], mode_round["metrics"]
    t_rollout, t_train = s[PREFIX + "rollout_s"], s[PREFIX + "trainer_busy_s"]
    serial = s[PREFIX + "rollout_to_train_end_s"]
    first = (sync_round or mode_round)["metrics"][PREFIX + "first_dispatch_s"]
    ideal = max(t_rollout + step_share * t_train, first + t_train)
    actual = m[PREFIX + "rollout_to_train_end_s"]
    return (serial - actual) / (serial - ideal) if serial - ideal > 1e-9 else float("nan")


def summarize(raw: dict) -> dict[str, Any]:
    """One record per (workload, R, mode): medians over the measured rounds; per-round paired comparisons with
    verl's own trainer (``stock``) and with ``sync`` of the same setting, with bootstrap 95 % CIs."""
    settings = raw.get("settings") or {}
    slots, k, u = settings.get("max_num_seqs"), settings.get("K"), settings.get("U")
    records = []
    for s in raw["results"]:
        rounds = _measured(s)
        rec: dict[str, Any] = {"workload": s["workload"], "R": s["R"], "mode": s["mode"], "rounds": len(rounds)}
        if slots and k:  # how many times over the round's requests fill the engine's running slots
            rec["waves"] = s["R"] * k / slots
            rec["regime"] = "saturated" if rec["waves"] >= 3 else "unsaturated"
        for m in METRICS:
            rec[m] = _median([r["metrics"].get(PREFIX + m, float("nan")) for r in rounds])
        fd = [r["metrics"][PREFIX + "first_dispatch_s"] for r in rounds]
        rec["first_dispatch_spread_s"] = (max(fd) - min(fd)) if fd else float("nan")
        # the least waiting this round's own rollout and training allow: the trainer is busy t_train of at least
        # ideal_s = max(T_rollout + t_last_step, t_first_ready + T_train) (architecture.md §4)
        floor = [1 - m[PREFIX + "trainer_busy_s"] / m[PREFIX + "ideal_s"] for m in (r["metrics"] for r in rounds)
                 if m.get(PREFIX + "ideal_s", 0) > 0]
        rec["trainer_wait_floor"] = _median(floor)
        rec["round_wall_s"] = _median([r["wall_s"] for r in rounds])
        # time in the window when neither rollout nor trainer is working: the pipeline's own cost (sync: no overlap)
        idle = [r["metrics"][PREFIX + "rollout_to_train_end_s"] - r["metrics"][PREFIX + "rollout_s"]
                - r["metrics"][PREFIX + "trainer_busy_s"] for r in rounds]
        rec["no_work_s"] = _median(idle)
        timelines = [json.loads(Path(r["timeline"]).read_text()) for r in rounds
                     if r.get("timeline") and Path(r["timeline"]).exists()]
        rec["materialize_per_group_s"] = _median([materialize_per_group_s(t) for t in timelines])
        rec["completion_order_rho"] = _median([completion_order_rho(t) for t in timelines])
        rec["workload_shape"] = rounds[0]["workload_shape"] if rounds else {}
        rec["lengths_honoured"] = min((r.get("lengths_honoured", float("nan")) for r in rounds), default=float("nan"))
        rec["critical_path_s"] = {k: _median([critical_path(r)[k] for r in rounds]) for k, _ in CRITICAL_PATH}
        rec["cpu_s_per_round"] = {cat: round(_median([sum(v for key, v in r.get("cpu_s", {}).items()
                                                         if key.startswith(cat + ":")) for r in rounds]), 3)
                                  for cat in CPU_CATEGORIES}
        procs = sorted({key for r in rounds for key in r.get("cpu_s", {}) if key.startswith("rollout:")})
        rec["rollout_cpu_s_by_process"] = {key.split(":", 1)[1]: round(_median([r.get("cpu_s", {}).get(key, 0.0)
                                                                                for r in rounds]), 3) for key in procs}
        records.append(rec)
    by_setting = {(s["workload"], s["R"], s["mode"]): _measured(s) for s in raw["results"]}
    sync = {(r["workload"], r["R"]): r for r in records if r["mode"] == "sync"}
    for rec in records:
        w, r_ = rec["workload"], rec["R"]
        rounds = by_setting[(w, r_, rec["mode"])]
        stock = by_setting.get((w, r_, STOCK))
        if stock:
            rec["reduction_vs_verl"], rec["reduction_vs_verl_ci"], rec["reduction_vs_verl_per_round"] = (
                _paired(rounds, stock))
            lo, hi = rec["reduction_vs_verl_ci"]
            rec["verdict_vs_verl"] = "faster" if lo > 0 else "slower" if hi < 0 else "no difference shown"
            if rec["mode"] != STOCK:
                sync_rounds = {x["round"]: x for x in by_setting.get((w, r_, "sync"), [])}
                stock_rounds = {x["round"]: x for x in stock}
                # each round's own metrics beside verl's end of the same round
                ends = [(x["metrics"], stock_rounds[x["round"]]["metrics"][PREFIX + "rollout_to_train_end_s"])
                        for x in rounds if x["round"] in stock_rounds]
                fractions = [fraction_of_ideal(m[PREFIX + "rollout_to_train_end_s"],
                                               m.get(PREFIX + "ideal_s", float("nan")), stock_end)
                             for m, stock_end in ends]
                rec["fraction_of_ideal_per_round"] = [f for f in fractions if f is not None]
                rec["fraction_of_ideal"] = _median(rec["fraction_of_ideal_per_round"])
                # the most this mode could cut on these rounds: a target above it is not reachable by scheduling
                rec["bound_reduction_vs_verl_per_round"] = [
                    cut_vs_verl(m[PREFIX + "ideal_s"], stock_end) for m, stock_end in ends
                    if m.get(PREFIX + "ideal_s", 0) > 0]
                rec["bound_reduction_vs_verl"] = _median(rec["bound_reduction_vs_verl_per_round"])
                share = (u / r_) if u else 0.0
                rec["overlap_efficiency_own_rollout"] = rec["overlap_efficiency"]  # the timeline's, own T_rollout
                rec["overlap_efficiency"] = _median([
                    overlap_efficiency_vs_stock(x, stock_rounds[x["round"]], sync_rounds.get(x["round"]), share)
                    for x in rounds if x["round"] in stock_rounds])
                # per-round targets: the rollout and the trainer's compute against verl's on the same round
                rec["rollout_vs_stock"], rec["rollout_vs_stock_ci"], _ = _paired(rounds, stock, "rollout_s", "ratio")
                rec["worker_compute_vs_stock"], rec["worker_compute_vs_stock_ci"], _ = _paired(
                    rounds, stock, "worker_compute_s", "ratio")
                # interference: the model's forward (vLLM's worker) on the same round's tokens, CPU against stock's
                rec["forward_cpu_vs_stock"] = _median([
                    x["cpu_s"][FORWARD] / stock_rounds[x["round"]]["cpu_s"][FORWARD] for x in rounds
                    if x["round"] in stock_rounds and x.get("cpu_s", {}).get(FORWARD)
                    and stock_rounds[x["round"]].get("cpu_s", {}).get(FORWARD)])
        cgp = by_setting.get((w, r_, "cgp"))
        if cgp and rec["mode"].startswith("cgp_fgd"):  # FGD against FCFS on the same round: rollout, first group
            rec["rollout_vs_cgp"], rec["rollout_vs_cgp_ci"], _ = _paired(rounds, cgp, "rollout_s", "ratio")
            rec["first_group_vs_cgp_s"], rec["first_group_vs_cgp_s_ci"], _ = _paired(
                rounds, cgp, "first_dispatch_s", "difference")
        base = sync.get((w, r_))
        if base is None:
            continue
        rec["reduction_vs_sync"], rec["reduction_vs_sync_ci"], _ = _paired(rounds, by_setting[(w, r_, "sync")])
        rec["wait_ratio_reduction_vs_sync"] = (1 - rec["trainer_wait_ratio"] / base["trainer_wait_ratio"]
                                               if base["trainer_wait_ratio"] > 0 else float("nan"))
        rec["rollout_train_ratio_sync"] = base["rollout_s"] / base["trainer_busy_s"]
        if rec["mode"] == "sync":
            rec["pipeline_overhead_share"] = rec["no_work_s"] / rec["rollout_to_train_end_s"]
    return {"git_commit": raw.get("git_commit"), "machine": raw.get("machine"), "pinned": raw.get("pinned"),
            "settings": raw.get("settings"), "records": records, "rollout_vs_R": rollout_vs_r(records)}


def rollout_vs_r(records: list[dict]) -> list[dict]:
    """Per workload and serial mode (``stock``, ``sync``: the rollout undisturbed by training), median rollout time
    against R with a least-squares line and its R²: a saturated engine's rollout grows linearly in R."""
    out = []
    for w in dict.fromkeys(r["workload"] for r in records):
        for mode in (STOCK, "sync"):
            pts = sorted((r["R"], r["rollout_s"]) for r in records if r["workload"] == w and r["mode"] == mode)
            if len(pts) < 2:
                continue
            x, y = np.array([p[0] for p in pts], float), np.array([p[1] for p in pts], float)
            slope, icept = np.polyfit(x, y, 1)
            resid = y - (slope * x + icept)
            ss = float(((y - y.mean()) ** 2).sum())
            out.append({"workload": w, "mode": mode, "R": x.tolist(), "rollout_s": y.tolist(),
                        "s_per_group": float(slope), "intercept_s": float(icept),
                        "r2": 1 - float((resid ** 2).sum()) / ss if ss > 0 else float("nan")})
    return out


def _fmt(x: float, pct: bool = False) -> str:
    if x != x:
        return "–"
    return f"{100 * x:.0f}%" if pct else f"{x:.2f}"


def _ci(r: dict, key: str, pct: bool = True) -> str:
    x, ci = r.get(key, float("nan")), r.get(key + "_ci")
    return f"{_fmt(x, pct)} [{_fmt(ci[0], pct)}, {_fmt(ci[1], pct)}]" if ci and x == x else "–"


def markdown(summary: dict[str, Any]) -> str:
    head = ("| workload | R | waves | mode | rollout→train end (s) | vs verl (`stock`), 95 % CI | verdict | "
            "vs sync, 95 % CI | trainer wait (floor) | first group (s) | rollout (s) | overlap eff. (vs stock) |\n"
            + "|---" * 12 + "|")
    lines = [head]
    for r in summary["records"]:
        waves = f"{r['waves']:.1f} ({r['regime']})" if "waves" in r else "–"
        lines.append(
            f"| {r['workload']} | {r['R']} | {waves} | {r['mode']} | {_fmt(r['rollout_to_train_end_s'])} | "
            f"{_ci(r, 'reduction_vs_verl')} | {r.get('verdict_vs_verl', '–')} | {_ci(r, 'reduction_vs_sync')} | "
            f"{_fmt(r['trainer_wait_ratio'], True)} ({_fmt(r['trainer_wait_floor'], True)}) | "
            f"{_fmt(r['first_dispatch_s'])} | {_fmt(r['rollout_s'])} | "
            f"{_fmt(r.get('overlap_efficiency', float('nan')))} |")
    paired = [r for r in summary["records"] if "rollout_vs_stock" in r]
    if paired:
        lines += ["", "Per round against verl's (`stock`) and `cgp`'s run of the same round (median ratio or "
                  "difference, 95 % CI): the rollout and the trainer pool's compute against verl's (targets: "
                  "within 10 %), and for FGD its rollout against FCFS's (within 5 %) and its first trainable "
                  "group's arrival against FCFS's (earlier: below 0); when the group that ended the rollout was "
                  "let into the engine (FGD's admission can delay it); how closely the groups completed in the order "
                  "they were sent (Spearman's ρ, median over rounds: near 1, FCFS already serves the frontier first "
                  "and FGD has nothing to reorder); the cut of the mode's own bound (`ideal_s`: "
                  "its rollout plus its last optimizer step, the most it could cut on these rounds) and the cut "
                  "achieved ÷ that cut.", "",
                  "| workload | R | mode | rollout / stock's | trainer compute / stock's | rollout / cgp's | "
                  "first group − cgp's (s) | last group let in (s) | completion follows submission (ρ) | "
                  "its bound's cut | fraction of the ideal cut |",
                  "|---" * 11 + "|"]
        for r in paired:
            frac = r.get("fraction_of_ideal")
            frac = None if frac is None or frac != frac else frac
            lines.append(f"| {r['workload']} | {r['R']} | {r['mode']} | {_ci(r, 'rollout_vs_stock', False)} | "
                         f"{_ci(r, 'worker_compute_vs_stock', False)} | {_ci(r, 'rollout_vs_cgp', False)} | "
                         f"{_ci(r, 'first_group_vs_cgp_s', False)} | "
                         f"{_fmt(r.get('last_group_admitted_s', float('nan')))} | "
                         f"{_fmt(r.get('completion_order_rho', float('nan')))} | "
                         f"{_fmt(r.get('bound_reduction_vs_verl', float('nan')), True)} | "
                         f"{'–' if frac is None else f'{frac:.2f}'} |")
    if summary.get("rollout_vs_R"):
        lines += ["", "Rollout time against R (serial modes, medians): least-squares line and R².", "",
                  "| workload | mode | R | rollout (s) | s per group | intercept (s) | R² |", "|---" * 7 + "|"]
        for f in summary["rollout_vs_R"]:
            lines.append(f"| {f['workload']} | {f['mode']} | {', '.join(str(int(x)) for x in f['R'])} | "
                         f"{', '.join(_fmt(y) for y in f['rollout_s'])} | {f['s_per_group']:.3f} | "
                         f"{f['intercept_s']:.2f} | {f['r2']:.3f} |")
    lines += ["", "Critical path of rollout→train end (medians, s): " + "; ".join(
        f"{i + 1}. {label}" for i, (_, label) in enumerate(CRITICAL_PATH)) + ".", "",
        "| workload | R | mode | " + " | ".join(str(i + 1) for i in range(len(CRITICAL_PATH))) + " | sum |",
        "|---" * (4 + len(CRITICAL_PATH)) + "|"]
    for r in summary["records"]:
        cp = r.get("critical_path_s", {})
        lines.append(f"| {r['workload']} | {r['R']} | {r['mode']} | "
                     + " | ".join(_fmt(cp.get(k, float("nan"))) for k, _ in CRITICAL_PATH)
                     + f" | {_fmt(sum(cp.values()) if cp else float('nan'))} |")
    lines += ["", "CPU seconds per round by whose process (medians; rollout and trainer: the pinned pools; driver: the "
              "project's own driver and task runner; Ray's daemons and kernel threads apart):", "",
              "| workload | R | mode | " + " | ".join(CPU_CATEGORIES) + " |", "|---" * (3 + len(CPU_CATEGORIES)) + "|"]
    for r in summary["records"]:
        cpu = r.get("cpu_s_per_round", {})
        lines.append(f"| {r['workload']} | {r['R']} | {r['mode']} | "
                     + " | ".join(_fmt(cpu.get(c, float("nan"))) for c in CPU_CATEGORIES) + " |")
    procs = sorted({p for r in summary["records"] for p in r.get("rollout_cpu_s_by_process", {})})
    if procs:
        lines += ["", "The rollout pool's CPU seconds per round by process (medians), and vLLM's forward (its worker) "
                  "on the same round's tokens against `stock`'s (paired per round, median): above 1, the same work "
                  "cost more CPU than in verl's run of the round -- the trainer beside it, or the host's drift:", "",
                  "| workload | R | mode | " + " | ".join(procs) + " | forward CPU vs stock |",
                  "|---" * (4 + len(procs)) + "|"]
        for r in summary["records"]:
            by = r.get("rollout_cpu_s_by_process", {})
            lines.append(f"| {r['workload']} | {r['R']} | {r['mode']} | "
                         + " | ".join(_fmt(by.get(p, float("nan"))) for p in procs)
                         + f" | {_fmt(r.get('forward_cpu_vs_stock', float('nan')))} |")
    lines += ["", "The trainer pool's calls: compute inside the worker (verl's train/infer) and the rest of the calls' "
              "wall time (Ray round trip, (de)serialisation, verl's and the driver's batch preparation), per round, "
              "medians:", "",
              "| workload | R | mode | calls | trainer calls (s) | worker compute (s) | of it π_old (s) | "
              "of it update (s) | per-call overhead (s) | share | data sent (MB): round · per call |",
              "|---" * 11 + "|"]
    nan = float("nan")
    for r in summary["records"]:
        calls = r.get("trainer_calls", nan)
        lines.append(f"| {r['workload']} | {r['R']} | {r['mode']} | {'–' if calls != calls else f'{calls:.0f}'} | "
                     f"{_fmt(r['trainer_busy_s'])} | "
                     f"{_fmt(r.get('worker_compute_s', nan))} | {_fmt(r.get('worker_infer_s', nan))} | "
                     f"{_fmt(r.get('worker_train_s', nan))} | {_fmt(r.get('call_overhead_s', nan))}"
                     f" | {_fmt(r.get('call_overhead_share', nan), True)} | {_payload(r)} |")
    sync = [r for r in summary["records"] if r["mode"] == "sync"]
    lines += ["", "Pipeline cost (sync rounds: no overlap possible): time in the round when neither the engine nor "
              "the trainer works, and per-group materialization (reward, GRPO advantages, rows) on the rollout side.",
              "", "| workload | R | no-work time (s) | share of round | materialize per group (ms) | publish (s) |",
              "|---|---|---|---|---|---|"]
    for r in sync:
        lines.append(f"| {r['workload']} | {r['R']} | {_fmt(r['no_work_s'])} | "
                     f"{_fmt(r.get('pipeline_overhead_share', float('nan')), True)} | "
                     f"{1000 * r['materialize_per_group_s']:.1f} | {_fmt(r['publish_s'])} |")
    return "\n".join(lines) + "\n"


def _payload(r: dict) -> str:
    """The trainer pool's data calls' payload (``payload.py``): MB per round and per call."""
    size, calls = r.get("trainer_payload_bytes", float("nan")), r.get("trainer_payload_calls", float("nan"))
    if not calls or calls != calls or size != size:  # older JSONs have none
        return "–"
    return f"{size / 1e6:.2f} · {size / calls / 1e6:.2f}"


def plot_bars(summary: dict[str, Any], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    recs = summary["records"]
    settings = list(dict.fromkeys((r["workload"], r["R"]) for r in recs))
    modes = list(dict.fromkeys(r["mode"] for r in recs))
    by = {(r["workload"], r["R"], r["mode"]): r for r in recs}
    fig, axes = plt.subplots(2, 1, figsize=(max(6, 1.6 * len(settings)), 6.5), sharex=True)
    width = 0.8 / len(modes)
    for j, mode in enumerate(modes):
        xs = [i + (j - (len(modes) - 1) / 2) * width for i in range(len(settings))]
        axes[0].bar(xs, [by[(w, r, mode)]["rollout_to_train_end_s"] if (w, r, mode) in by else 0
                         for w, r in settings], width, label=mode)
        axes[1].bar(xs, [100 * by[(w, r, mode)]["trainer_wait_ratio"] if (w, r, mode) in by else 0
                         for w, r in settings], width, label=mode)
    axes[0].set_ylabel("rollout → train end (s)")
    axes[1].set_ylabel("trainer waiting (%)")
    axes[1].set_xticks(range(len(settings)), [f"{w}\nR={r}" for w, r in settings], fontsize=8)
    axes[0].legend(fontsize=8)
    axes[0].set_title("RolloutPipe bench: median over measured rounds (rollout core 0, trainer core 1)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_attribution(summary: dict[str, Any], workload: str, num_groups: int, path: Path) -> Path | None:
    """One stacked bar per mode: the critical path of rollout-to-train-end (medians over measured rounds)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    recs = [r for r in summary["records"] if r["workload"] == workload and r["R"] == num_groups
            and "critical_path_s" in r]
    if not recs:
        return None
    fig, ax = plt.subplots(figsize=(1.4 * len(recs) + 4.5, 4))
    bottom = [0.0] * len(recs)
    colors = ("#bbbbbb", "#e6a23c", "#909399", "#5b8ff9", "#8c1c13")
    for (key, label), color in zip(CRITICAL_PATH, colors, strict=True):
        vals = [max(0.0, r["critical_path_s"].get(key, 0.0) or 0.0) for r in recs]
        vals = [v if v == v else 0.0 for v in vals]
        ax.bar(range(len(recs)), vals, bottom=bottom, color=color, label=label)
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    ax.set_xticks(range(len(recs)), [r["mode"] for r in recs], fontsize=8)
    ax.set_ylabel("rollout → train end (s), median")
    ax.set_title(f"Where the time goes: {workload} R={num_groups}", fontsize=10)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_stacked(raw: dict, workload: str, num_groups: int, path: Path) -> Path | None:
    """The three modes' timelines of one setting, stacked (the measured round closest to the mode's median)."""
    timelines, labels = [], []
    for s in raw["results"]:
        if s["workload"] != workload or s["R"] != num_groups:
            continue
        rounds = [r for r in _measured(s) if r.get("timeline")]  # verl's own step has no pipeline timeline
        if not rounds:
            continue
        med = _median([r["metrics"][PREFIX + "rollout_to_train_end_s"] for r in rounds])
        pick = min(rounds, key=lambda r: abs(r["metrics"][PREFIX + "rollout_to_train_end_s"] - med))
        timelines.append(RoundTimeline.from_dict(json.loads(Path(pick["timeline"]).read_text())))
        labels.append(f"{workload} R={num_groups} {s['mode']}")
    return plot_gantt(timelines, labels, path) if timelines else None


def write_all(raw: dict, out_dir: Path, json_out: Path | None) -> dict[str, Any]:
    summary = summarize(raw)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "bench_raw.json").write_text(json.dumps(raw, indent=1))
    text = json.dumps(summary, indent=1)
    (out_dir / "bench.json").write_text(text)
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(text)
    (out_dir / "bench.md").write_text(markdown(summary))
    plot_bars(summary, out_dir / "bench_bars.png")
    for w, r in dict.fromkeys((s["workload"], s["R"]) for s in raw["results"]):
        plot_stacked(raw, w, r, out_dir / f"timelines_{w}_R{r}.png")
        plot_attribution(summary, w, r, out_dir / f"critical_path_{w}_R{r}.png")
    return summary

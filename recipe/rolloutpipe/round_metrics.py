"""A round's metrics, assembled in one place: the pipeline timeline's (architecture.md §4), verl's own data and actor
metrics over the rows trained, and the recipe's health counters (docs/metrics.md); plus the round's console line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from verl import DataProto
from verl.trainer.ppo.metric_utils import compute_data_metrics
from verl.utils.metric import reduce_metrics

from .pipeline import PREFIX, RoundTimeline


def merge_metric_lists(dicts: list[dict]) -> dict[str, list]:
    """verl's per-call metric dicts -> one dict of lists (what ``reduce_metrics`` averages)."""
    out: dict[str, list] = {}
    for d in dicts:
        for k, v in d.items():
            out.setdefault(k, []).extend(v if isinstance(v, list) else [v])
    return out


def round_metrics(timeline: RoundTimeline, trained: list[DataProto], step_outputs: list[DataProto], group_size: int,
                  step_groups: int, snapshot: bool) -> dict[str, Any]:
    """``trained``: the round's training rows in training order; ``step_outputs``: verl's update output per step."""
    metrics: dict[str, Any] = dict(timeline.metrics())
    metrics.update(reduce_metrics(merge_metric_lists([o.meta_info["metrics"] for o in step_outputs])))
    for b in trained:
        b.meta_info.pop("global_token_num", None)  # per-step values; the round's batch needs none
    batch = DataProto.concat(trained)
    metrics.update(compute_data_metrics(batch=batch, use_critic=False))
    mask = batch.batch["response_mask"]
    # responses with no token at all (the engine returned nothing): counted, trained as verl would (reward of "")
    metrics[PREFIX + "empty_responses"] = float((mask.sum(-1) == 0).sum())
    # trained groups whose K responses all got advantage 0 (what algorithm.filter_groups drops)
    metrics[PREFIX + "groups_zero_advantage"] = float(sum(
        bool(g.abs().sum() == 0) for g in batch.batch["advantages"].split(group_size)))
    metrics[PREFIX + "tool_response_tokens"] = float(tool_turn_tokens(mask).sum())
    metrics[PREFIX + "groups_short"] = float(timeline.ledger.short_by) if timeline.ledger else 0.0
    # mean response length of the groups of each optimizer step (rows are in training order): completion order
    # trains short answers first, a known bias of streaming RL that the learning curves measure (curves.py)
    for s, chunk in enumerate(mask.sum(-1).float().split(step_groups * group_size)):
        metrics[f"{PREFIX}response_length/step{s}"] = float(chunk.mean())
    if "reward_error" in batch.non_tensor_batch:
        metrics[PREFIX + "reward_errors"] = float(np.sum(batch.non_tensor_batch["reward_error"].astype(float)))
    if "reward_s" in batch.non_tensor_batch:  # each response's reward call, on the rollout side (reward guard)
        seconds = batch.non_tensor_batch["reward_s"].astype(float)
        metrics[PREFIX + "reward_call_s_p50"] = float(np.median(seconds))
        metrics[PREFIX + "reward_call_s_max"] = float(np.max(seconds))
    if snapshot and "rollout_log_probs" in batch.batch.keys():
        # vLLM's log-probs vs the trainer's under the same weights v: small only if the publish reached vLLM
        gap = (batch.batch["rollout_log_probs"] - batch.batch["old_log_probs"]).abs() * mask.float()
        metrics[PREFIX + "rollout_vs_trainer_logprob_diff"] = float(gap.sum() / mask.sum())
        # the per-token gaps are heavy-tailed (median ~1e-5, a rare token up to ~0.3 under the same weights), so
        # the mean of a round's few hundred tokens can reach 1e-3 from one token; the 90th percentile is ~1e-4
        # when the publish arrived and ~0.1 when vLLM is one optimizer step stale (docs/metrics.md)
        tokens = gap[mask.bool()].float()
        p50, p90 = (torch.quantile(tokens, torch.tensor([0.5, 0.9])).tolist() if len(tokens)
                    else (float("nan"), float("nan")))  # one sort for both
        metrics[PREFIX + "rollout_vs_trainer_logprob_diff_p50"] = p50
        metrics[PREFIX + "rollout_vs_trainer_logprob_diff_p90"] = p90
    return metrics


def tool_turn_tokens(response_mask: torch.Tensor) -> torch.Tensor:
    """Per row: the response tokens that are not the model's between its first and last own token -- a tool's
    turn in a multi-turn trajectory, masked out of the loss by verl's agent loop."""
    generated = response_mask.cumsum(-1)
    return ((generated > 0) & (generated < generated[:, -1:]) & (response_mask == 0)).sum(-1)


def round_line(step: int, pipe: Any, metrics: dict[str, Any], timeline_path: Path) -> str:  # pipe: RoundSettings
    """The one console line per round (README shows one)."""
    m = {k.removeprefix(PREFIX): v for k, v in metrics.items() if k.startswith(PREFIX)}
    return (
        f"[rolloutpipe] round {step} mode={pipe.mode} R={pipe.num_groups} K={pipe.group_size} "
        f"U={pipe.step_groups} reward={metrics['critic/score/mean']:.3f} "
        f"rollout_to_train_end={m['rollout_to_train_end_s']:.2f}s wait_ratio={m['trainer_wait_ratio']:.1%} "
        f"first_dispatch={m['first_dispatch_s']:.2f}s overlap_eff={m['overlap_efficiency']:.2f} "
        f"publish={m.get('publish_s', 0):.2f}s "
        f"lp_diff={m.get('rollout_vs_trainer_logprob_diff', float('nan')):.4f} "
        f"lp_diff_p50={m.get('rollout_vs_trainer_logprob_diff_p50', float('nan')):.2e} "
        f"lp_diff_p90={m.get('rollout_vs_trainer_logprob_diff_p90', float('nan')):.5f} "
        + (f"reward_errors={m['reward_errors']:.0f} " if m.get("reward_errors") else "")
        + (f"tool_tokens={m['tool_response_tokens']:.0f} " if m.get("tool_response_tokens") else "")
        + (f"reward_call_p50={m['reward_call_s_p50']:.2f}s " if m.get("reward_call_s_p50", 0) >= 0.01 else "")
        + (f"filtered={m['groups_filtered']:.0f} short_by={m['groups_short']:.0f} "
           if pipe.filter_metric is not None else "")
        + f"timeline={timeline_path}"
    )

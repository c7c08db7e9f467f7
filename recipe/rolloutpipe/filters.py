"""Dynamic-sampling filters: which complete groups are trained (slime's convention: a filter returns
``(keep, reason)``, the reason naming why a group was dropped)."""

from __future__ import annotations

from verl import DataProto

from .pipeline import PipelineInvariantError


def metric_values(rows: DataProto, metric: str) -> list[float]:
    """The K values of ``metric`` for a group: ``reward`` is the sequence score, anything else a key the reward
    function returned (verl's ``algorithm.filter_groups.metric``)."""
    if metric == "reward":
        return rows.batch["token_level_scores"].sum(-1).tolist()
    if metric in rows.non_tensor_batch:
        return [float(v) for v in rows.non_tensor_batch[metric]]
    raise PipelineInvariantError(f"algorithm.filter_groups.metric={metric!r} is not among the reward function's "
                                 f"outputs {sorted(rows.non_tensor_batch)}: use reward or one of those")


def keep_if_metric_varies(rows: DataProto, metric: str) -> tuple[bool, str]:
    """verl's ``algorithm.filter_groups``: a group whose K values are all equal gets GRPO advantage 0 for every
    response and would only dilute the token-mean; it is dropped (and replaced by the next prompt)."""
    values = metric_values(rows, metric)
    if max(values) - min(values) == 0:
        return False, f"all {len(values)} values of {metric} are {values[0]:g}"
    return True, ""

"""Config validation for the RolloutPipe trainer: one clear message per problem, before any worker starts."""

from __future__ import annotations

from dataclasses import dataclass

from omegaconf import DictConfig, OmegaConf

from .pipeline.frontier import resolve_frontier_width
from .pipeline.modes import AUTO_WIDTH, ENGINE_WIDTH, TRAIN_UNITS, TRAINER_MODES, FgdStrength, Mode


class RolloutPipeConfigError(ValueError):
    pass


UNLIMITED_EXTRA_GROUPS = 10**9


@dataclass(frozen=True)
class PipeSettings:
    """The resolved pipeline shape of a run."""

    mode: str  # a pipeline.modes.Mode value: sync | cgp | cgp_fgd
    num_groups: int  # R = data.train_batch_size
    group_size: int  # K = actor_rollout_ref.rollout.n
    step_groups: int  # U = actor_rollout_ref.actor.ppo_mini_batch_size
    frontier_width: int  # F_w (with frontier_auto: the first round's, U)
    fgd_strength: str
    old_log_prob: str  # snapshot | rollout
    max_buffered_groups: int | None = None  # bound on groups between admission and consumption (back-pressure)
    train_unit: str = "step"  # step: one update call per optimizer step | steps: one for the whole steps ready |
    # groups: accumulate groups as they come
    filter_metric: str | None = None  # dynamic sampling: drop groups whose K values of this metric are all equal
    max_extra_groups: int = 0  # replacements per round for filtered groups (prompts of later dataloader batches)
    frontier_auto: bool = False  # frontier_width=auto: each round's F_w from the last one's (MeasuredFrontierWidth)


def _get(cfg: DictConfig, key: str, default=None):
    return OmegaConf.select(cfg, key, default=default)


def validate(cfg: DictConfig) -> PipeSettings:
    """Check every rule the streaming trainer relies on; raise one error listing what to change."""
    errors: list[str] = []
    rp = cfg.rolloutpipe
    mode = rp.mode
    if mode not in TRAINER_MODES:
        errors.append(f"rolloutpipe.mode={mode!r}: use sync, cgp or cgp_fgd")
    r = int(cfg.data.train_batch_size)
    k = int(cfg.actor_rollout_ref.rollout.n)
    u = int(cfg.actor_rollout_ref.actor.ppo_mini_batch_size)
    if u < 1 or r % u:
        errors.append(f"data.train_batch_size (R={r}) must be a multiple of "
                      f"actor_rollout_ref.actor.ppo_mini_batch_size (U={u}): an optimizer step takes U whole groups, "
                      "as in the serial run")
    auto = rp.frontier_width == AUTO_WIDTH
    fw = u if auto else resolve_frontier_width(rp.frontier_width, rp.fgd_strength, u, r, k,
                                               int(_get(cfg, "actor_rollout_ref.rollout.max_num_seqs", 256)))
    if not isinstance(fw, int) or not 1 <= fw <= r:
        errors.append(f"rolloutpipe.frontier_width={fw!r} must be auto, engine or a number between 1 and "
                      f"data.train_batch_size={r}")
    if rp.frontier_width in (AUTO_WIDTH, ENGINE_WIDTH) and rp.fgd_strength == FgdStrength.PRIORITY:
        errors.append(f"rolloutpipe.frontier_width={rp.frontier_width} sizes hold's frontier; with "
                      "fgd_strength=priority every group is in the engine already and F_w changes nothing: set "
                      "rolloutpipe.fgd_strength=hold or paced")
    strength = rp.fgd_strength
    if strength not in tuple(FgdStrength):
        errors.append(f"rolloutpipe.fgd_strength={strength!r}: use priority, paced or hold")
    policy = _get(cfg, "actor_rollout_ref.rollout.scheduling_policy", "fcfs")
    if mode == Mode.CGP_FGD and strength == FgdStrength.PRIORITY and policy != "priority":
        errors.append("rolloutpipe.fgd_strength=priority needs actor_rollout_ref.rollout.scheduling_policy=priority "
                      f"(got {policy!r}: vLLM would silently ignore the priorities)")
    if rp.old_log_prob not in ("snapshot", "rollout"):
        errors.append(f"rolloutpipe.old_log_prob={rp.old_log_prob!r}: use snapshot (exact) or rollout (vLLM log-probs)")
    placement = rp.get("snapshot_placement", "auto")
    if placement not in ("auto", "device", "host"):
        errors.append(f"rolloutpipe.snapshot_placement={placement!r}: use auto (the accelerator when it has room), "
                      "device or host")
    if rp.old_log_prob == "rollout" and not _get(cfg, "actor_rollout_ref.rollout.calculate_log_probs", True):
        errors.append("rolloutpipe.old_log_prob=rollout needs actor_rollout_ref.rollout.calculate_log_probs=true")
    stall = rp.get("stall_timeout_s")
    if stall is not None and float(stall) <= 0:
        errors.append(f"rolloutpipe.stall_timeout_s={stall}: use a positive number of seconds (or null to disable)")
    gap = rp.get("max_logprob_gap_p90")
    if gap is not None and not (isinstance(gap, (int, float)) and gap > 0):
        errors.append(f"rolloutpipe.max_logprob_gap_p90={gap!r}: use a positive log-prob difference (1e-3 on CPU "
                      "fp32) or null to disable the check")
    ray_start = rp.get("ray_start_timeout_s")
    if ray_start is not None and float(ray_start) <= 0:
        errors.append(f"rolloutpipe.ray_start_timeout_s={ray_start}: use a positive number of seconds (Ray's "
                      "start-up on a loaded 2-core machine took up to 90 s)")
    bound = rp.get("max_buffered_groups")
    if bound is not None:
        need = r if mode == Mode.SYNC else u
        if int(bound) < need:
            errors.append(f"rolloutpipe.max_buffered_groups={bound} is below what mode={mode} must hold at once "
                          f"({need}: " + ("the sync baseline trains only after the whole round" if mode == Mode.SYNC
                                         else "an optimizer step takes U whole groups") + f"): set it >= {need}")
    replicas = rp.get("rollout_replicas", 1)
    if not isinstance(replicas, int) or replicas < 1:
        errors.append(f"rolloutpipe.rollout_replicas={replicas!r}: use a whole number >= 1")
    elif replicas > 1 and rp.get("layout") != "disaggregated":
        errors.append(f"rolloutpipe.rollout_replicas={replicas} needs rolloutpipe.layout=disaggregated (the hybrid "
                      "layout has one replica per trainer worker group)")
    dp = int(cfg.trainer.nnodes) * int(cfg.trainer.n_gpus_per_node)
    train_unit = rp.get("train_unit", "step")
    if train_unit not in TRAIN_UNITS:
        errors.append(f"rolloutpipe.train_unit={train_unit!r}: use step (one update per optimizer step), steps (one "
                      "update for every whole step ready) or groups (accumulate complete groups as they arrive)")
    elif train_unit == "groups" and k % dp:
        errors.append(f"rolloutpipe.train_unit=groups trains single groups of K={k} responses, which the trainer's "
                      f"data-parallel size {dp} does not divide: change actor_rollout_ref.rollout.n or use "
                      "train_unit=step")
    if (u * k) % dp:
        errors.append(f"an optimizer step has U*K={u * k} responses, which the trainer's data-parallel size {dp} "
                      "(trainer.nnodes * trainer.n_gpus_per_node) does not divide: change ppo_mini_batch_size or n")
    if cfg.trainer.get("balance_batch", False):
        errors.append("trainer.balance_batch=true reorders responses across groups: set it false (RolloutPipe trains "
                      "whole groups in FIFO order, exactly as the serial reference)")
    actor = cfg.actor_rollout_ref.actor
    if int(actor.ppo_epochs) != 1 or actor.shuffle:
        errors.append("actor_rollout_ref.actor.ppo_epochs must be 1 and actor.shuffle false: a streamed group is "
                      "trained once, in arrival order")
    if cfg.algorithm.adv_estimator != "grpo":
        errors.append(f"algorithm.adv_estimator={cfg.algorithm.adv_estimator!r}: the RolloutPipe trainer computes "
                      "group-relative advantages per complete group; use grpo")
    if _get(cfg, "reward.reward_model.enable", False):
        errors.append("reward.reward_model.enable=true: the RolloutPipe trainer scores each group as it completes "
                      "with verl's reward loop (a rule or reward.custom_reward_function), not yet with verl's "
                      "reward-model worker: set it false, or run verl's own trainer (rolloutpipe.trainer=stock)")
    filt = _get(cfg, "algorithm.filter_groups", None)
    filter_metric, extra = None, 0
    if filt is not None and filt.get("enable", False):
        filter_metric = filt.get("metric") or "reward"
        gen_batches = int(filt.get("max_num_gen_batches", 0) or 0)
        # each extra generation batch brings R more prompts; <= 0 is verl's "no limit" (the data bounds it)
        extra = (gen_batches - 1) * r if gen_batches > 0 else UNLIMITED_EXTRA_GROUPS
    if errors:
        raise RolloutPipeConfigError("rolloutpipe: invalid config:\n  - " + "\n  - ".join(errors))
    return PipeSettings(mode, r, k, u, int(fw), strength, rp.old_log_prob,
                        None if bound is None else int(bound), train_unit, filter_metric, extra, frontier_auto=auto)

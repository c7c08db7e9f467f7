"""Config validation for the RolloutPipe trainer: one clear message per problem, before any worker starts."""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from .pipeline.modes import AUTO_WIDTH, ENGINE_WIDTH, TRAINER_MODES, FgdStrength, Mode, TrainUnit
from .pipeline.settings import RoundSettings, resolve_round_settings
from .prepare import TASKS


class RolloutPipeConfigError(ValueError):
    pass


UNLIMITED_EXTRA_GROUPS = 10**9
PLATFORMS = ("cpu", "gpu")  # config/platform/<name>.yaml
LAYOUTS = ("hybrid", "disaggregated")  # config/layout/<name>.yaml
CKPT = "actor_rollout_ref.rollout.checkpoint_engine"


def user_set(key: str, user: frozenset[str]) -> bool:
    """The user gave this key or a block above it (``a.b={...}`` sets ``a.b.c``)."""
    parts = key.split(".")
    return any(".".join(parts[:i]) in user for i in range(1, len(parts) + 1))


def _get(cfg: DictConfig, key: str, default=None):
    return OmegaConf.select(cfg, key, default=default)


def multi_turn(cfg: DictConfig) -> bool:
    """Whether the run's trajectories call tools: verl's ``actor_rollout_ref.rollout.multi_turn.enable``."""
    return bool(_get(cfg, "actor_rollout_ref.rollout.multi_turn.enable", False))


def validate(cfg: DictConfig) -> RoundSettings:
    """Check every rule the streaming trainer relies on; raise one error listing what to change."""
    errors: list[str] = []
    rp = cfg.rolloutpipe
    mode = rp.mode
    strength = rp.fgd_strength
    if mode not in TRAINER_MODES:
        errors.append(f"rolloutpipe.mode={mode!r}: use sync, cgp or cgp_fgd")
    r = int(cfg.data.train_batch_size)
    k = int(cfg.actor_rollout_ref.rollout.n)
    u = int(cfg.actor_rollout_ref.actor.ppo_mini_batch_size)
    if u < 1 or r % u:
        errors.append(f"data.train_batch_size (R={r}) must be a multiple of "
                      f"actor_rollout_ref.actor.ppo_mini_batch_size (U={u}): an optimizer step takes U whole groups, "
                      "as in the serial run")
    fw = rp.frontier_width  # the words and null resolve to a width in [U, R] (the one resolver, round_settings)
    if fw not in (AUTO_WIDTH, ENGINE_WIDTH, None) and not (isinstance(fw, int) and 1 <= fw <= r):
        errors.append(f"rolloutpipe.frontier_width={fw!r} must be auto, engine or a number between 1 and "
                      f"data.train_batch_size={r}")
    if rp.frontier_width in (AUTO_WIDTH, ENGINE_WIDTH) and rp.fgd_strength == FgdStrength.PRIORITY:
        errors.append(f"rolloutpipe.frontier_width={rp.frontier_width} sizes hold's frontier; with "
                      "fgd_strength=priority every group is in the engine already and F_w changes nothing: set "
                      "rolloutpipe.fgd_strength=hold or paced")
    if strength not in tuple(FgdStrength):
        errors.append(f"rolloutpipe.fgd_strength={strength!r}: use priority, paced or hold")
    policy = _get(cfg, "actor_rollout_ref.rollout.scheduling_policy", "fcfs")
    if mode == Mode.CGP_FGD and strength == FgdStrength.PRIORITY and policy != "priority":
        errors.append("rolloutpipe.fgd_strength=priority needs actor_rollout_ref.rollout.scheduling_policy=priority "
                      f"(got {policy!r}: vLLM would silently ignore the priorities)")
    if rp.old_log_prob not in ("snapshot", "rollout"):
        errors.append(f"rolloutpipe.old_log_prob={rp.old_log_prob!r}: use snapshot (exact) or rollout (vLLM log-probs)")
    placement = rp.snapshot_placement
    if placement not in ("auto", "device", "host"):
        errors.append(f"rolloutpipe.snapshot_placement={placement!r}: use auto (the accelerator when it has room), "
                      "device or host")
    if rp.old_log_prob == "rollout" and not _get(cfg, "actor_rollout_ref.rollout.calculate_log_probs", True):
        errors.append("rolloutpipe.old_log_prob=rollout needs actor_rollout_ref.rollout.calculate_log_probs=true")
    stall = rp.stall_timeout_s
    if stall is not None and float(stall) <= 0:
        errors.append(f"rolloutpipe.stall_timeout_s={stall}: use a positive number of seconds (or null to disable)")
    gap = rp.max_logprob_gap_p50
    if gap is not None and not (isinstance(gap, (int, float)) and gap > 0):
        errors.append(f"rolloutpipe.max_logprob_gap_p50={gap!r}: use a positive log-prob difference (5e-5 on CPU "
                      "fp32) or null to disable the check")
    if rp.embedded_task not in TASKS:
        errors.append(f"rolloutpipe.embedded_task={rp.embedded_task!r}: use arith (single turn) or arith_tool (the "
                      "calculator tool; task=agentic sets it with verl's multi-turn keys)")
    events = rp.ray_task_events_in_gcs
    if not (isinstance(events, int) and events >= 0):
        errors.append(f"rolloutpipe.ray_task_events_in_gcs={events!r}: use a number of task events >= 0 (Ray's "
                      "GCS keeps that many for `ray list tasks`; 0 keeps none)")
    ray_start = rp.ray_start_timeout_s
    if ray_start is not None and float(ray_start) <= 0:
        errors.append(f"rolloutpipe.ray_start_timeout_s={ray_start}: use a positive number of seconds (Ray's "
                      "start-up on a loaded 2-core machine took up to 90 s)")
    bound = rp.max_buffered_groups
    if bound is not None:
        need = r if mode == Mode.SYNC else u
        if int(bound) < need:
            errors.append(f"rolloutpipe.max_buffered_groups={bound} is below what mode={mode} must hold at once "
                          f"({need}: " + ("the sync baseline trains only after the whole round" if mode == Mode.SYNC
                                         else "an optimizer step takes U whole groups") + f"): set it >= {need}")
    replicas = rp.rollout_replicas
    if not isinstance(replicas, int) or replicas < 1:
        errors.append(f"rolloutpipe.rollout_replicas={replicas!r}: use a whole number >= 1")
    elif replicas > 1 and rp.layout != "disaggregated":
        errors.append(f"rolloutpipe.rollout_replicas={replicas} needs rolloutpipe.layout=disaggregated (the hybrid "
                      "layout has one replica per trainer worker group)")
    dp = int(cfg.trainer.nnodes) * int(cfg.trainer.n_gpus_per_node)
    train_unit = rp.train_unit
    if train_unit not in tuple(TrainUnit):
        errors.append(f"rolloutpipe.train_unit={train_unit!r}: use step (one update per optimizer step), steps (one "
                      "update for every whole step ready) or groups (accumulate complete groups as they arrive)")
    elif train_unit == TrainUnit.GROUPS and k % dp:
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
    if errors:
        raise RolloutPipeConfigError("rolloutpipe: invalid config:\n  - " + "\n  - ".join(errors))
    return round_settings(cfg)


def round_settings(cfg: DictConfig, **rolloutpipe_values) -> RoundSettings:
    """The run's ``RoundSettings`` from its (validated) config; ``rolloutpipe_values`` replace ``rolloutpipe.*``
    values first (a bench mode spec: mode, fgd_strength, frontier_width, train_unit; ``num_groups``: the bench's R;
    ``multi_turn``: whether the bench's workload calls tools, which its rows say rather than the config)."""
    rp = {**{k: cfg.rolloutpipe[k] for k in ("mode", "fgd_strength", "frontier_width", "train_unit",
                                             "max_buffered_groups")}, **rolloutpipe_values}
    r = int(rp.pop("num_groups", cfg.data.train_batch_size))
    trajectories_call_tools = bool(rp.pop("multi_turn", multi_turn(cfg)))
    filt = _get(cfg, "algorithm.filter_groups", None)
    filter_metric, extra = None, 0
    if filt is not None and filt.get("enable", False):
        filter_metric = filt.get("metric") or "reward"
        gen_batches = int(filt.get("max_num_gen_batches", 0) or 0)
        # each extra generation batch brings R more prompts; <= 0 is verl's "no limit" (the data bounds it)
        extra = (gen_batches - 1) * r if gen_batches > 0 else UNLIMITED_EXTRA_GROUPS
    bound = rp["max_buffered_groups"]
    return resolve_round_settings(
        mode=rp["mode"], num_groups=r, group_size=int(cfg.actor_rollout_ref.rollout.n),
        step_groups=int(cfg.actor_rollout_ref.actor.ppo_mini_batch_size), fgd_strength=rp["fgd_strength"],
        frontier_width=rp["frontier_width"], train_unit=rp["train_unit"],
        max_num_seqs=int(cfg.actor_rollout_ref.rollout.max_num_seqs), multi_turn=trajectories_call_tools,
        max_buffered_groups=None if bound is None else int(bound), max_extra_groups=extra,
        filter_metric=filter_metric)


def _publish_backend_problem(platform: str, backend: str) -> str | None:
    """Why a user's checkpoint engine cannot publish weights to standalone vLLM replicas here (None: it can)."""
    if platform == "cpu" and backend != "rolloutpipe_ray":
        return "verl's engines other than naive need accelerators (NCCL, NIXL, ...), and naive works only colocated"
    if backend == "naive":
        return "naive hands weights over in-process, which works only colocated (rolloutpipe.layout=hybrid)"
    return None


def check_layout(config: DictConfig, user: frozenset[str]) -> list[str]:
    """The user's keys against what ``rolloutpipe.layout`` needs on this platform (``user``: the keys the command
    line gave); one message per problem, each naming the key and the fix."""
    rp = config.rolloutpipe
    if rp.layout not in LAYOUTS:
        return [f"rolloutpipe.layout={rp.layout!r}: use hybrid or disaggregated"]
    if rp.platform not in PLATFORMS:
        return [f"rolloutpipe.platform={rp.platform!r}: choose the overlay with platform=cpu or platform=gpu "
                "(config/platform/), not the key"]
    if rp.layout != "disaggregated":
        return []
    errors = []
    if user_set("actor_rollout_ref.hybrid_engine", user) and config.actor_rollout_ref.hybrid_engine:
        errors.append("actor_rollout_ref.hybrid_engine=true colocates vLLM with the trainer, which "
                      "rolloutpipe.layout=disaggregated does not: drop the key or use rolloutpipe.layout=hybrid")
    backend = OmegaConf.select(config, f"{CKPT}.backend")
    problem = _publish_backend_problem(rp.platform, backend) if user_set(f"{CKPT}.backend", user) else None
    if problem:
        errors.append(f"{CKPT}.backend={backend} cannot publish weights to standalone vLLM replicas on "
                      f"platform={rp.platform} ({problem}): drop the key (the layout's own, "
                      "config/layout/disaggregated.yaml, publishes there) or use rolloutpipe.layout=hybrid")
    replicas = rp.rollout_replicas
    if rp.platform == "gpu" and not user_set("actor_rollout_ref.rollout.n_gpus_per_node", user):
        errors.append("rolloutpipe.layout=disaggregated on GPUs: set actor_rollout_ref.rollout.n_gpus_per_node (and "
                      "rollout.nnodes) to the rollout pool's GPUs, apart from trainer.n_gpus_per_node")
    elif rp.platform == "cpu" and isinstance(replicas, int) and replicas > 1:  # validate() reports a bad value
        given = config.actor_rollout_ref.rollout.n_gpus_per_node
        if user_set("actor_rollout_ref.rollout.n_gpus_per_node", user) and given != replicas:
            errors.append(f"actor_rollout_ref.rollout.n_gpus_per_node={given} and rolloutpipe.rollout_replicas="
                          f"{replicas} disagree (on CPU each replica is one logical device): drop one of them")
    return errors

"""A run's config before anything starts: the platform overlay, the layout's verl keys, the user's own keys (they
always win), and ``rolloutpipe.dry_run``.

Precedence, lowest first: verl's ``ppo_trainer`` < config/rolloutpipe.yaml < config/platform/<cpu|gpu>.yaml < what
``rolloutpipe.layout`` sets (only on keys the user did not give) < the user's ``key=value`` overrides. A user choice
that cannot work with the layout or platform is an error naming the key and the fix, before Ray starts.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterable

from omegaconf import DictConfig, OmegaConf, open_dict

PLATFORMS = ("cpu", "gpu")
CKPT = "actor_rollout_ref.rollout.checkpoint_engine"

# What ``rolloutpipe.layout=disaggregated`` sets (verl keys), per platform: no hybrid engine, standalone vLLM
# replicas on their own pool, weights published by a checkpoint engine after each round.
DISAGGREGATED: dict[str, dict[str, object]] = {
    # CPU: one replica per logical "device" (rolloutpipe.rollout_replicas), weights through the Ray object store
    # (rolloutpipe_workers/cpu_checkpoint_engine.py); replicas start from random weights: the first publish makes
    # them real (so a broken publish cannot hide)
    "cpu": {
        "actor_rollout_ref.hybrid_engine": False,
        "actor_rollout_ref.rollout.nnodes": 1,
        "actor_rollout_ref.rollout.n_gpus_per_node": 1,
        f"{CKPT}.backend": "rolloutpipe_ray",
        f"{CKPT}.custom_backend_module": "rolloutpipe_workers.cpu_checkpoint_engine",
        f"{CKPT}.update_weights_bucket_megabytes": 64,
        "actor_rollout_ref.rollout.load_format": "dummy",
        # LoRA: publish the merged weights. verl's checkpoint-engine path sends only the base weights of an unmerged
        # adapter, so the replicas would never see it (docs/lora.md); harmless without LoRA
        "actor_rollout_ref.model.lora.merge": True,
    },
    # GPU: the rollout pool's size is the user's (actor_rollout_ref.rollout.n_gpus_per_node / nnodes, required);
    # vLLM owns its GPUs (no trainer beside it), weights through verl's nccl checkpoint engine
    "gpu": {
        "actor_rollout_ref.hybrid_engine": False,
        "actor_rollout_ref.rollout.nnodes": 1,
        "actor_rollout_ref.rollout.gpu_memory_utilization": 0.85,
        "actor_rollout_ref.rollout.free_cache_engine": False,  # nothing else on the rollout GPUs to make room for
        f"{CKPT}.backend": "nccl",
        "actor_rollout_ref.rollout.load_format": "dummy",
        "actor_rollout_ref.model.lora.merge": True,  # as on CPU: the checkpoint engine sends no unmerged adapter
    },
}


def _publish_backend_problem(platform: str, backend: str) -> str | None:
    """Why a user's checkpoint engine cannot publish weights to standalone vLLM replicas here (None: it can)."""
    if platform == "cpu" and backend != "rolloutpipe_ray":
        return "verl's engines other than naive need accelerators (NCCL, NIXL, ...), and naive works only colocated"
    if backend == "naive":
        return "naive hands weights over in-process, which works only colocated (rolloutpipe.layout=hybrid)"
    return None


def detect_platform() -> str:
    """gpu when torch sees a CUDA device, else cpu."""
    from rolloutpipe_workers.check_env import cuda_gpu_visible

    return "gpu" if cuda_gpu_visible() else "cpu"


def with_platform(overrides: list[str]) -> list[str]:
    """The overrides plus ``platform=<detected>`` unless they choose one."""
    if any(o.lstrip("+~").split("=", 1)[0] == "platform" for o in overrides):
        return list(overrides)
    return [*overrides, f"platform={detect_platform()}"]


def user_keys(overrides: Iterable[str]) -> frozenset[str]:
    """The config keys a list of Hydra overrides sets (``a.b=1``, ``+a.b=1``, ``~a.b``); groups and hydra.* left out."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    keys = {o.key_or_group for o in OverridesParser.create().parse_overrides(list(overrides))}
    return frozenset(k for k in keys if k != "platform" and not k.startswith("hydra"))


def _user_set(key: str, user: frozenset[str]) -> bool:
    """The user gave this key or a block above it (``a.b={...}`` sets ``a.b.c``)."""
    parts = key.split(".")
    return any(".".join(parts[:i]) in user for i in range(1, len(parts) + 1))


def apply_layout(config: DictConfig, user: frozenset[str] = frozenset()) -> None:
    """Set the layout's verl keys where the user left them; raise SystemExit on a user choice the layout cannot
    honour."""
    layout = config.rolloutpipe.layout
    if layout not in ("hybrid", "disaggregated"):
        raise SystemExit(f"rolloutpipe: rolloutpipe.layout={layout!r}: use hybrid or disaggregated")
    platform = config.rolloutpipe.get("platform", "cpu")
    if platform not in PLATFORMS:
        raise SystemExit(f"rolloutpipe: rolloutpipe.platform={platform!r}: choose the overlay with platform=cpu or "
                         "platform=gpu (config/platform/), not the key")
    if layout != "disaggregated":
        return
    errors = []
    if _user_set("actor_rollout_ref.hybrid_engine", user) and config.actor_rollout_ref.hybrid_engine:
        errors.append("actor_rollout_ref.hybrid_engine=true colocates vLLM with the trainer, which "
                      "rolloutpipe.layout=disaggregated does not: drop the key or use rolloutpipe.layout=hybrid")
    backend = OmegaConf.select(config, f"{CKPT}.backend")
    problem = _publish_backend_problem(platform, backend) if _user_set(f"{CKPT}.backend", user) else None
    if problem:
        errors.append(f"{CKPT}.backend={backend} cannot publish weights to standalone vLLM replicas on "
                      f"platform={platform} ({problem}): drop the key (the recipe uses "
                      f"{DISAGGREGATED[platform][f'{CKPT}.backend']}) or use rolloutpipe.layout=hybrid")
    replicas = config.rolloutpipe.get("rollout_replicas", 1)
    if platform == "gpu" and not _user_set("actor_rollout_ref.rollout.n_gpus_per_node", user):
        errors.append("rolloutpipe.layout=disaggregated on GPUs: set actor_rollout_ref.rollout.n_gpus_per_node (and "
                      "rollout.nnodes) to the rollout pool's GPUs, apart from trainer.n_gpus_per_node")
    elif platform == "cpu" and isinstance(replicas, int) and replicas > 1:  # validate() reports a bad value
        given = config.actor_rollout_ref.rollout.n_gpus_per_node
        if _user_set("actor_rollout_ref.rollout.n_gpus_per_node", user) and given != replicas:
            errors.append(f"actor_rollout_ref.rollout.n_gpus_per_node={given} and rolloutpipe.rollout_replicas="
                          f"{replicas} disagree (on CPU each replica is one logical device): drop one of them")
    if errors:
        raise SystemExit("rolloutpipe: invalid config:\n  - " + "\n  - ".join(errors))
    values = dict(DISAGGREGATED[platform])
    if platform == "cpu" and isinstance(replicas, int) and replicas > 1:
        values["actor_rollout_ref.rollout.n_gpus_per_node"] = replicas
    if backend == "rolloutpipe_ray":  # the recipe's own engine (the CPU table names its module already)
        values[f"{CKPT}.custom_backend_module"] = "rolloutpipe_workers.cpu_checkpoint_engine"
    with open_dict(config):
        for key, value in values.items():
            if not _user_set(key, user):
                OmegaConf.update(config, key, value, merge=False)


def resource_pools(config: DictConfig) -> dict[str, list[int]]:
    """The Ray resource pools verl will ask for (devices per node, one entry per node), as its task runners build
    them: the hybrid layout's one global pool, or the disaggregated trainer pool beside the rollout replicas' pool."""
    if config.rolloutpipe.layout == "hybrid":
        return {"global_pool": [int(config.trainer.n_gpus_per_node)] * int(config.trainer.nnodes)}
    rollout = config.actor_rollout_ref.rollout
    return {"trainer_pool": [int(config.trainer.n_gpus_per_node)] * int(config.trainer.nnodes),
            "rollout_pool": [int(rollout.n_gpus_per_node)] * int(rollout.nnodes)}


def verl_validate(config: DictConfig) -> None:
    """verl's own config validation, as its task runners call it (raises on a bad key); what it prints goes to
    stderr, so a dry run's stdout is the YAML alone."""
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    with contextlib.redirect_stdout(sys.stderr):
        validate_config(config=config, use_reference_policy=need_reference_policy(config),
                        use_critic=need_critic(config))


def dry_run_report(config: DictConfig, user: frozenset[str]) -> str:
    """The whole resolved config as YAML, with what was checked on top (``rolloutpipe.dry_run=true``)."""
    pools = ", ".join(f"{name} {devices}" for name, devices in resource_pools(config).items())
    head = [f"# rolloutpipe dry run: platform={config.rolloutpipe.platform} layout={config.rolloutpipe.layout} "
            f"trainer={config.rolloutpipe.trainer} mode={config.rolloutpipe.mode}",
            f"# resource pools (devices per node): {pools}",
            "# checked: verl's validate_config" + (", the recipe's config check"
                                                   if config.rolloutpipe.trainer == "rolloutpipe" else ""),
            f"# your keys (kept as given): {', '.join(sorted(user)) or 'none'}"]
    return "\n".join(head) + "\n" + OmegaConf.to_yaml(config, resolve=True)

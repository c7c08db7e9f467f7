"""A run's config before anything starts: the platform overlay, the layout's verl keys, the user's own keys (they
always win), and ``rolloutpipe.dry_run``.

Precedence, lowest first: verl's ``ppo_trainer`` < config/rolloutpipe.yaml < config/platform/<cpu|gpu>.yaml <
config/layout/<rolloutpipe.layout>.yaml (only on keys the user did not give) < the user's ``key=value`` overrides.
A user choice that cannot work with the layout or platform is an error naming the key and the fix, before Ray starts
(``config_check.check_layout``).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterable
from pathlib import Path

from omegaconf import DictConfig, OmegaConf, open_dict

from .config_check import CKPT, check_layout, user_set

LAYOUT_DIR = Path(__file__).resolve().parent / "config" / "layout"


def layout_values(layout: str, platform: str) -> dict[str, object]:
    """What ``rolloutpipe.layout=<layout>`` sets on ``platform`` (config/layout/<layout>.yaml), as dotted verl keys."""
    block = OmegaConf.load(LAYOUT_DIR / f"{layout}.yaml")[platform]
    flat: dict[str, object] = {}

    def walk(node, prefix: str) -> None:
        for key, value in node.items():
            if isinstance(value, DictConfig):
                walk(value, f"{prefix}{key}.")
            else:
                flat[f"{prefix}{key}"] = value

    walk(block, "")
    return flat


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


def apply_layout(config: DictConfig, user: frozenset[str] = frozenset()) -> None:
    """Set the layout's verl keys (config/layout/) where the user left them; raise SystemExit, before Ray starts, on
    a user choice the layout cannot honour (``config_check.check_layout``)."""
    errors = check_layout(config, user)
    if errors:
        raise SystemExit("rolloutpipe: invalid config:\n  - " + "\n  - ".join(errors))
    rp = config.rolloutpipe
    values = layout_values(rp.layout, rp.platform)
    replicas = rp.rollout_replicas  # a bad value is validate()'s to report
    if rp.layout == "disaggregated" and rp.platform == "cpu" and isinstance(replicas, int) and replicas > 1:
        values["actor_rollout_ref.rollout.n_gpus_per_node"] = rp.rollout_replicas  # one logical device each
    if rp.layout == "disaggregated" and OmegaConf.select(config, f"{CKPT}.backend") == "rolloutpipe_ray":
        values[f"{CKPT}.custom_backend_module"] = "rolloutpipe_workers.cpu_checkpoint_engine"  # the recipe's engine
    with open_dict(config):
        for key, value in values.items():
            if not user_set(key, user):
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

"""``python -m recipe.rolloutpipe.main key=value ...``: Hydra entry (config/rolloutpipe.yaml = verl's ppo_trainer
plus a ``rolloutpipe:`` block, then the platform overlay config/platform/<cpu|gpu>.yaml, picked from the machine
unless ``platform=`` is given). With no overrides it runs the embedded default on CPU.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf, open_dict

from rolloutpipe_workers import known_noise

from .logs import get_logger
from .resolve import apply_layout, dry_run_report, user_keys, verl_validate, with_platform

logger = get_logger("recipe.rolloutpipe.main")  # named: this module runs as __main__
# inside the recipe, so it travels with recipe/rolloutpipe/ into another recipe tree (the repo's config/ links here)
CONFIG_DIR = str(Path(__file__).resolve().parent / "config")

# Start-up warnings nobody running this recipe can act on (engines that are not installed, CUDA kernels, settings
# the recipe chose): filtered here for the driver, by the plugins in every verl/vLLM process, and through
# PYTHONWARNINGS for what the workers raise at import (rolloutpipe_workers/known_noise.py lists each and why).
known_noise.install()
EMBEDDED = "embedded"


def resolve_embedded(config: DictConfig) -> None:
    """Replace every ``embedded`` path with the locally built default (built on first use, then cached)."""
    paths = {
        "data.train_files": "train.parquet",
        "data.val_files": "val.parquet",
        "actor_rollout_ref.model.path": "model",
        "reward.custom_reward_function.path": None,
    }
    if not any(OmegaConf.select(config, k) == EMBEDDED for k in paths):
        return
    from .prepare import DefaultSpec, ensure_default

    rp = config.rolloutpipe
    root = ensure_default(DefaultSpec(seed=int(rp.embedded_seed), task=rp.embedded_task))
    with open_dict(config):
        for key, name in paths.items():
            if OmegaConf.select(config, key) == EMBEDDED:
                value = str(root / name) if name else str(Path(__file__).with_name("task.py"))
                OmegaConf.update(config, key, value, merge=False)


def resolve_config_files(config: DictConfig) -> None:
    """Relative config-file paths of the recipe (agent loops, tools) are files in config/: make them absolute so every
    Ray worker finds them whatever its working directory."""
    for key in ("actor_rollout_ref.rollout.agent.agent_loop_config_path",
                "actor_rollout_ref.rollout.multi_turn.tool_config_path"):
        path = OmegaConf.select(config, key)
        if path and not os.path.isabs(path) and (Path(CONFIG_DIR) / path).exists():
            OmegaConf.update(config, key, str(Path(CONFIG_DIR) / path), merge=False)


def apply_reward_guard(config: DictConfig) -> None:
    """Route verl's custom reward function through recipe/rolloutpipe/reward_guard.py (policy for bad rewards)."""
    guard = config.rolloutpipe.reward_guard
    fn = config.reward.custom_reward_function
    if not guard.enable or fn.path is None or fn.get("name") in ("guarded_score", "guarded_score_async"):
        return
    if guard.on_error not in ("zero", "raise"):
        raise SystemExit(f"rolloutpipe: rolloutpipe.reward_guard.on_error={guard.on_error!r}: use zero or raise")
    from .reward_guard import is_async

    guarded = "guarded_score_async" if is_async(fn.path, fn.name) else "guarded_score"  # verl keeps the kind
    kwargs = {**(fn.get("reward_kwargs") or {}), "user_path": fn.path, "user_name": fn.name,
              "on_error": guard.on_error, "timeout_s": float(guard.timeout_s)}
    with open_dict(config):
        fn.path = str(Path(__file__).with_name("reward_guard.py"))
        fn.name = guarded
        fn.reward_kwargs = kwargs


def prepare_runtime(config: DictConfig, worker_env: dict[str, str] | None = None) -> None:
    """Environment checks and Ray start-up, before any worker exists (``worker_env``: extra variables for every
    Ray worker)."""
    from rolloutpipe_workers.check_env import check_or_exit

    check_or_exit(need_vllm=True, platform=config.rolloutpipe.platform)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(config.rolloutpipe.vllm_cpu_kvcache_gib))
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    resolve_embedded(config)
    resolve_config_files(config)
    apply_reward_guard(config)
    if config.rolloutpipe.get("data_check", {}).get("enable", False):
        from .data_check import DataCheckError, check_data, summary

        try:
            logger.info(summary(check_data(config, config.rolloutpipe.data_check.clean_dir)))
        except DataCheckError as e:
            raise SystemExit(str(e)) from None
    import ray

    if not ray.is_initialized():
        from verl.trainer.constants_ppo import get_ppo_ray_runtime_env

        from rolloutpipe_workers.cpu_platform import on_cpu

        from .ray_start import init_ray_bounded

        runtime_env = get_ppo_ray_runtime_env(config)
        runtime_env.setdefault("env_vars", {}).update(worker_env or {})
        runtime_env["env_vars"].setdefault("PYTHONWARNINGS", known_noise.python_warnings_env())
        kwargs = {"runtime_env": runtime_env}
        timeout_s = float(config.rolloutpipe.ray_start_timeout_s)
        if os.environ.get("RAY_ADDRESS"):
            # a running cluster (`ray start` on every node; trainer.nnodes=N): the nodes declare their own resources
            init_ray_bounded(kwargs, timeout_s, local=False)
            return
        # a new local instance even when a `ray start` cluster runs on this machine (Ray would otherwise join the
        # latest one it recorded): a cluster is joined only through RAY_ADDRESS, as above
        kwargs.update(address="local", include_dashboard=False)
        if on_cpu():
            # verl asks for "GPU" bundles and several CPUs per worker: advertise logical slots (docs/cpu_stack.md).
            gpus = config.trainer.nnodes * config.trainer.n_gpus_per_node
            gpus += config.actor_rollout_ref.rollout.nnodes * config.actor_rollout_ref.rollout.n_gpus_per_node
            kwargs.update(num_cpus=int(config.rolloutpipe.ray_num_cpus), num_gpus=gpus)
        kwargs["_system_config"] = {"task_events_max_num_task_in_gcs": int(config.rolloutpipe.ray_task_events_in_gcs)}
        init_ray_bounded(kwargs, timeout_s, local=True)


def run(config: DictConfig, task_runner_class: type | None = None, user: frozenset[str] = frozenset()) -> None:
    """Run the configured trainer; ``task_runner_class`` (a ``@ray.remote`` class with ``run(config)``) replaces the
    recipe's task runner (``verify_onpolicy`` brings its own); ``user``: the keys the user set (never overwritten)."""
    trainer = config.rolloutpipe.trainer
    apply_layout(config, user)
    if trainer not in ("rolloutpipe", "stock"):
        raise SystemExit(f"rolloutpipe: rolloutpipe.trainer={trainer!r}: use rolloutpipe or stock (verl's own)")
    if trainer == "rolloutpipe":
        from .config_check import RolloutPipeConfigError, validate

        try:
            validate(config)  # before Ray or any worker starts
        except RolloutPipeConfigError as e:
            raise SystemExit(str(e)) from None
    if config.rolloutpipe.get("dry_run", False):
        try:
            verl_validate(config)
        except (AssertionError, ValueError) as e:
            raise SystemExit(f"rolloutpipe: verl's validate_config rejects the config: {e}") from None
        print(dry_run_report(config, user))
        return
    from .provenance import git_commit

    commit = git_commit()  # at launch: the run's record names the tree that ran, not one edited meanwhile
    prepare_runtime(config)
    from .ray_start import stop_local_instance

    try:
        _run_ppo(config, trainer, task_runner_class)
    finally:
        stop_local_instance()
    if trainer == "rolloutpipe":
        record_run(config, commit)


def _run_ppo(config: DictConfig, trainer: str, task_runner_class: type | None) -> None:
    from verl.trainer.main_ppo import run_ppo

    if trainer == "stock":  # verl's own trainer and workers on the same layout
        if config.rolloutpipe.layout == "disaggregated":
            from .runner import StockDisaggregatedTaskRunner as TaskRunner
        else:
            from verl.trainer.main_ppo_v0 import TaskRunner

        run_ppo(config, task_runner_class=TaskRunner)
        return
    from .pipeline import PipelineStallError, RoundAbortedError
    from .runner import RolloutPipeTaskRunner

    try:
        run_ppo(config, task_runner_class=task_runner_class or RolloutPipeTaskRunner)
    except (RoundAbortedError, PipelineStallError) as e:  # raised in the task runner; Ray re-raises it here
        raise SystemExit(str(getattr(e, "cause", None) or e).strip()) from None


def record_run(config: DictConfig, commit: str) -> None:
    """Add what produced it to the run's learning_curve.json: the commit at launch, the wall time from this
    process's start (Ray, workers and vLLM start-up included) and the command-line keys (docs/results/main_job.json
    is one)."""
    import json

    import psutil

    from .provenance import machine

    path = Path(config.rolloutpipe.timeline_dir) / "learning_curve.json"
    if not path.exists():
        return
    record = json.loads(path.read_text())
    record.update(git_commit=commit, machine=machine(), overrides=sys.argv[1:],
                  wall_s=round(time.time() - psutil.Process().create_time(), 1), mode=str(config.rolloutpipe.mode),
                  rounds=int(config.trainer.total_training_steps))
    path.write_text(json.dumps(record, indent=1))
    logger.info(f"[rolloutpipe] run record: {path} ({record['wall_s']:.0f} s wall, start-up included)")


@hydra.main(config_path=CONFIG_DIR, config_name="rolloutpipe", version_base=None)
def main(config: DictConfig) -> None:
    from hydra.core.hydra_config import HydraConfig

    run(config, user=user_keys(HydraConfig.get().overrides.task))


if __name__ == "__main__":
    sys.argv = [sys.argv[0], *with_platform(sys.argv[1:])]
    main()

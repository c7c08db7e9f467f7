"""Outside reference: verl's own ``fully_async_policy`` in its staleness-0 streaming mode on the bench's setting.

``python -m experiments.fully_async_ref [key=value ...]`` composes the recipe's CPU config with
verl's ``fully_async_ppo_trainer.yaml`` block (``async_training``: staleness_threshold=0, one parameter sync per
round of R prompts, no partial rollout) and the disaggregated layout, then runs verl's ``FullyAsyncTaskRunner``
unchanged. docs/results.md records what happened on this machine.
"""

from __future__ import annotations

import sys
from pathlib import Path

from omegaconf import OmegaConf, open_dict


def build_config(overrides: list[str]):
    import verl.experimental.fully_async_policy as fa

    from recipe.rolloutpipe.bench.__main__ import load_config
    from recipe.rolloutpipe.resolve import apply_layout

    cfg = load_config(quick=True, overrides=[])
    async_yaml = OmegaConf.load(Path(fa.__file__).parent / "config" / "fully_async_ppo_trainer.yaml")
    r = int(cfg.rolloutpipe.bench.sizes[0])
    u = int(cfg.actor_rollout_ref.actor.ppo_mini_batch_size)
    with open_dict(cfg):
        verl_block = {k: v for k, v in async_yaml.items() if k not in ("hydra", "defaults")}
        cfg = OmegaConf.merge(cfg, verl_block)
        cfg = OmegaConf.merge(cfg, {
            "actor_rollout_ref": {"model": {"use_remove_padding": False}},  # flash-attn varlen path: CUDA only
            "async_training": {"staleness_threshold": 0, "trigger_parameter_sync_step": r // u,
                               "require_batches": 1, "partial_rollout": False},
            "rollout": {"nnodes": 1, "n_gpus_per_node": 1, "n": int(cfg.actor_rollout_ref.rollout.n),
                        "total_rollout_steps": 4 * r},
            "data": {"train_batch_size": 0, "gen_batch_size": 1},
            "trainer": {"total_training_steps": 4},
        }, OmegaConf.from_dotlist(overrides))
    apply_layout(cfg)
    return cfg


def main(argv: list[str] | None = None) -> None:
    from verl.experimental.fully_async_policy.fully_async_main import FullyAsyncTaskRunner
    from verl.trainer.main_ppo import run_ppo

    from recipe.rolloutpipe.main import prepare_runtime

    cfg = build_config(list(sys.argv[1:] if argv is None else argv))
    prepare_runtime(cfg)
    run_ppo(cfg, task_runner_class=FullyAsyncTaskRunner)


if __name__ == "__main__":
    main()

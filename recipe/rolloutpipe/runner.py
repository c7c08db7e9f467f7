"""The Ray task runner of the recipe: verl's own TaskRunner with RolloutPipe's trainer and actor worker.

verl's ``TaskRunner.run`` builds datasets, resource pools and workers, then instantiates the module-level name
``verl.trainer.main_ppo_v0.RayPPOTrainer``. Rebinding that name inside this actor process (and nowhere else) makes
it build a ``RolloutPipeTrainer``; the actor role gets ``StreamingActorWorker``. Everything else is verl's path.
(Composition, not subclassing: a subclass of a ``@ray.remote`` class breaks its ``super()`` calls in the actor.)
"""

from __future__ import annotations

import ray


def run_task(config, hybrid_cls: type | None = None, disaggregated_cls: type | None = None) -> None:
    """verl's task-runner path with RolloutPipe's trainer (``hybrid_cls`` / ``disaggregated_cls``: a subclass of
    the recipe's trainer for that layout, e.g. the on-policy verifier's) and streaming actor worker."""
    from .trainer import DisaggregatedRolloutPipeTrainer, RolloutPipeTrainer

    if config.rolloutpipe.layout == "disaggregated":
        trainer = build_disaggregated_trainer(config, disaggregated_cls or DisaggregatedRolloutPipeTrainer)
        trainer.init_workers()
        trainer.fit()
        return
    import verl.trainer.main_ppo_v0 as v0

    from rolloutpipe_workers.streaming_actor import StreamingActorWorker

    runner = v0.TaskRunner.__ray_actor_class__()
    verl_add_actor = runner.add_actor_rollout_worker

    def add_actor_rollout_worker(cfg):
        _, wg_cls = verl_add_actor(cfg)
        for role in list(runner.role_worker_mapping):
            if role.name.startswith("ActorRollout"):
                runner.role_worker_mapping[role] = ray.remote(StreamingActorWorker)
        return StreamingActorWorker, wg_cls

    runner.add_actor_rollout_worker = add_actor_rollout_worker
    v0.RayPPOTrainer = hybrid_cls or RolloutPipeTrainer
    runner.run(config)


@ray.remote
class RolloutPipeTaskRunner:
    def run(self, config) -> None:
        run_task(config)


@ray.remote
class StockDisaggregatedTaskRunner:
    """verl's own serial trainer (``SeparateRayPPOTrainer``: whole rollout, then train, then publish) with verl's own
    workers on the disaggregated layout: the ``stock`` arm of an A/B against the recipe on the same pools."""

    def run(self, config) -> None:
        from verl.experimental.one_step_off_policy.ray_trainer import OneStepOffRayTrainer
        from verl.experimental.separation.ray_trainer import SeparateRayPPOTrainer

        class StockDisaggregatedTrainer(OneStepOffRayTrainer):
            # verl builds the separated pools only in OneStepOffRayTrainer (SeparateRayPPOTrainer alone asserts a
            # hybrid engine); its async fit would train one step off-policy, so the loop is SeparateRayPPOTrainer's
            fit = SeparateRayPPOTrainer.fit
            fit_step = SeparateRayPPOTrainer.fit_step
            _fit_generate = SeparateRayPPOTrainer._fit_generate

        trainer = build_disaggregated_trainer(config, StockDisaggregatedTrainer, streaming_actor=False)
        trainer.init_workers()
        trainer.fit()


def build_disaggregated_trainer(config, trainer_cls: type | None = None, streaming_actor: bool = True):
    """verl's separation layout, as ``verl.experimental.one_step_off_policy.main_ppo`` builds it, with RolloutPipe's
    trainer (``trainer_cls``, default ``DisaggregatedRolloutPipeTrainer``) and actor worker (``streaming_actor``;
    else verl's own) -- workers not started yet: call ``init_workers``."""
    from omegaconf import OmegaConf
    from verl.experimental.separation.utils import create_resource_pool_manager, create_role_worker_mapping
    from verl.trainer.ppo.utils import create_rl_dataset, create_rl_sampler, need_critic, need_reference_policy
    from verl.utils import hf_processor, hf_tokenizer
    from verl.utils.config import validate_config
    from verl.utils.dataset.rl_dataset import collate_fn
    from verl.utils.fs import copy_to_local

    from rolloutpipe_workers.streaming_actor import StreamingDetachActorWorker

    from .trainer import DisaggregatedRolloutPipeTrainer

    trainer_cls = trainer_cls or DisaggregatedRolloutPipeTrainer
    OmegaConf.resolve(config)
    mapping, wg_cls = create_role_worker_mapping(config)
    for role in list(mapping) if streaming_actor else ():
        if role.name == "Actor":
            mapping[role] = ray.remote(StreamingDetachActorWorker)
    # what verl's own task runner (one_step_off_policy.main_ppo) does before it builds a trainer
    validate_config(config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    path = copy_to_local(config.actor_rollout_ref.model.path,
                         use_shm=config.actor_rollout_ref.model.get("use_shm", False))
    trust = config.data.get("trust_remote_code", False)
    tokenizer = hf_tokenizer(path, trust_remote_code=trust)
    processor = hf_processor(path, trust_remote_code=trust, use_fast=True)
    train = create_rl_dataset(config.data.train_files, config.data, tokenizer, processor,
                              max_samples=config.data.get("train_max_samples", -1))
    val = create_rl_dataset(config.data.val_files, config.data, tokenizer, processor,
                            max_samples=config.data.get("val_max_samples", -1))
    return trainer_cls(
        config=config, tokenizer=tokenizer, processor=processor, role_worker_mapping=mapping,
        resource_pool_manager=create_resource_pool_manager(config, mapping.keys()), ray_worker_group_cls=wg_cls,
        train_dataset=train, val_dataset=val, collate_fn=collate_fn,
        train_sampler=create_rl_sampler(config.data, train), device_name=config.trainer.device,
    )

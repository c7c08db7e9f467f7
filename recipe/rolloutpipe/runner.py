"""The Ray task runner of the recipe: verl's own TaskRunner with RolloutPipe's trainer and actor worker.

verl's ``TaskRunner.run`` builds datasets, resource pools and workers, then instantiates the module-level name
``verl.trainer.main_ppo_v0.RayPPOTrainer``. Rebinding that name inside this actor process (and nowhere else) makes
it build a ``RolloutPipeTrainer``; the actor role gets ``StreamingActorWorker``. Everything else is verl's path.
(Composition, not subclassing: a subclass of a ``@ray.remote`` class breaks its ``super()`` calls in the actor.)
"""

from __future__ import annotations

import ray


@ray.remote
class RolloutPipeTaskRunner:
    def run(self, config) -> None:  # noqa: ANN001
        import verl.trainer.main_ppo_v0 as v0

        from rolloutpipe_workers.streaming_actor import StreamingActorWorker

        from .trainer import RolloutPipeTrainer

        runner = v0.TaskRunner.__ray_actor_class__()
        verl_add_actor = runner.add_actor_rollout_worker

        def add_actor_rollout_worker(cfg):  # noqa: ANN001, ANN202
            _, wg_cls = verl_add_actor(cfg)
            for role in list(runner.role_worker_mapping):
                if role.name.startswith("ActorRollout"):
                    runner.role_worker_mapping[role] = ray.remote(StreamingActorWorker)
            return StreamingActorWorker, wg_cls

        runner.add_actor_rollout_worker = add_actor_rollout_worker
        v0.RayPPOTrainer = RolloutPipeTrainer
        runner.run(config)

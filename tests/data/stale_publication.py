"""A checkpoint-engine backend whose publications stop reaching vLLM after the first N (a test fixture: it injects
what the real parts can't on cue -- the adapter or the new weights never reaching the engine, verl's silent LoRA
failure in async mode). Publications after the N-th (``ROLLOUTPIPE_STALE_AFTER``, default 1) carry the N-th's
weights again. It takes the recipe's backend name: select it in the disaggregated layout with
``actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module=stale_publication`` (this folder on
PYTHONPATH)."""

import os

from verl.checkpoint_engine.base import CheckpointEngineRegistry

from rolloutpipe_workers.cpu_checkpoint_engine import RayObjectStoreCheckpointEngine


@CheckpointEngineRegistry.register("rolloutpipe_ray")
class StalePublicationEngine(RayObjectStoreCheckpointEngine):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fresh_left = int(os.environ.get("ROLLOUTPIPE_STALE_AFTER", "1"))
        self.last_fresh = None

    async def send_weights(self, weights, global_steps=None) -> None:
        named = [(name, t.detach().to("cpu", copy=True)) for name, t in weights]
        if self.fresh_left > 0:
            self.fresh_left -= 1
            self.last_fresh = named
        await super().send_weights(iter(self.last_fresh), global_steps)

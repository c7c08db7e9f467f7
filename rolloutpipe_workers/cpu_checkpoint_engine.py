"""A CPU-capable checkpoint-engine backend for verl: weights travel trainer → rollout replicas via Ray's object store.

verl 0.9.1's disaggregated backends (nccl, nixl, delta_sharded, mooncake, kimi) need CUDA or absent packages, and
``naive`` assumes a colocated rollout. This backend registers as ``rolloutpipe_ray`` in verl's
``CheckpointEngineRegistry``; select it with

    actor_rollout_ref.rollout.checkpoint_engine.backend=rolloutpipe_ray
    actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module=rolloutpipe_workers.cpu_checkpoint_engine

Syncs are numbered on both sides (every ``update_weights`` involves all ranks), so a replica never takes a stale
copy even when the trainer republishes the same ``global_steps``. Per sync, trainer rank 0 puts the full list of
``(name, tensor)`` into the object store and hands the reference to a small named mailbox actor; every rollout
rank waits for that sync, fetches it and yields the tensors to vLLM's weight loader. Other trainer ranks still
walk the weight generator (producing each tensor is collective).
It works anywhere Ray does (CPU or GPU hosts); on GPUs the NCCL backend is faster.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Generator
from typing import Any

import ray
import torch
from verl.checkpoint_engine.base import CheckpointEngine, CheckpointEngineRegistry

MAILBOX = "rolloutpipe_weight_mailbox"


@ray.remote(num_cpus=0)
class WeightMailbox:
    """Holds the newest published weights (an object ref) and wakes the replicas waiting for it."""

    def __init__(self) -> None:
        self.version = 0
        self.refs: list = []
        self.cond = asyncio.Condition()

    async def put(self, version: int, refs: list) -> None:
        async with self.cond:
            self.version, self.refs = version, refs
            self.cond.notify_all()

    async def get(self, version: int, timeout_s: float) -> list:
        async with self.cond:
            await asyncio.wait_for(self.cond.wait_for(lambda: self.version >= version), timeout_s)
            return self.refs


def _mailbox():
    return WeightMailbox.options(name=MAILBOX, get_if_exists=True, lifetime="detached").remote()


@CheckpointEngineRegistry.register("rolloutpipe_ray")
class RayObjectStoreCheckpointEngine(CheckpointEngine):
    def __init__(self, bucket_size: int = 0, is_master: bool = False, timeout_s: float = 600.0, **_: Any) -> None:
        self.is_master = is_master
        self.timeout_s = timeout_s
        self.rank = -1
        self.role = "unknown"
        self.syncs = 0

    def prepare(self) -> dict[str, Any]:
        return {"is_master": self.is_master}

    @classmethod
    def build_topology(cls, actor_wg_world_size: int, rollout_world_size: int, metadata: list[dict]):
        actor = {"rank": list(range(actor_wg_world_size)), "role": ["actor"] * actor_wg_world_size}
        rollout = {"rank": list(range(rollout_world_size)), "role": ["rollout"] * rollout_world_size}
        return actor, rollout

    def init_process_group(self, rank: int, role: str) -> None:
        self.rank, self.role = rank, role

    def finalize(self) -> None:
        return None

    @torch.no_grad()
    async def send_weights(self, weights: Generator[tuple[str, torch.Tensor], None, None],
                           global_steps: int | None = None) -> None:
        named = [(name, t.detach().to("cpu", copy=True)) for name, t in weights]  # every rank walks the generator
        self.syncs += 1
        if self.rank == 0:
            # A list around the ref keeps Ray from resolving it when passed to the mailbox.
            await _mailbox().put.remote(self.syncs, [ray.put(named)])

    async def receive_weights(self, global_steps: int | None = None) -> AsyncGenerator[tuple[str, torch.Tensor], None]:
        self.syncs += 1
        refs = await _mailbox().get.remote(self.syncs, self.timeout_s)
        for name, tensor in await refs[0]:
            yield name, tensor

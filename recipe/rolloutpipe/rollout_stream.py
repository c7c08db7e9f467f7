"""Per-group rollout on verl's agent loop: one agent-loop call per prompt group, completions as they finish.

verl's ``AgentLoopManager.generate_sequences`` returns a whole batch at once. Its workers are async Ray actors whose
``generate_sequences`` accepts any batch, so this adapter calls them with one group (K rows) each and waits on the
object refs: groups finish out of order, each with its K responses and their rewards (verl's reward loop runs in
the agent loop). Which group to send, and with which priority, is decided by the pipeline's admission policy; the
priority reaches vLLM through the batch's ``priority`` column (honoured under ``scheduling_policy=priority``).
"""

from __future__ import annotations

import itertools
import time

import numpy as np
import ray
from verl import DataProto

SAMPLE_COLUMN = "sample_in_group"  # which of the K samples a row is (agent loops may use it)
SEED_COLUMN = "request_seed"  # vLLM sampling seed of the row (rolloutpipe_workers.agent_loops); -1 = unseeded
# columns the stream adds for the engine; not part of the training batch
REQUEST_COLUMNS = ("priority", SAMPLE_COLUMN, SEED_COLUMN)


class GroupRolloutStream:
    def __init__(self, agent_loop_workers: list, group_size: int) -> None:
        self._workers = itertools.cycle(agent_loop_workers)
        self.group_size = group_size
        self._inflight: dict[ray.ObjectRef, int] = {}

    def submit(self, group_id: int, prompt: DataProto, priority: int, meta: dict, seed: int | None = None) -> None:
        """Send the K samples of one prompt (``prompt`` has 1 row) to the next agent-loop worker; with ``seed``,
        sample j is drawn with vLLM seed ``seed + j``."""
        rows = prompt.repeat(repeat_times=self.group_size, interleave=True)
        rows.non_tensor_batch["priority"] = np.full(len(rows), priority, dtype=np.int64)
        rows.non_tensor_batch[SAMPLE_COLUMN] = np.arange(len(rows), dtype=np.int64)
        rows.non_tensor_batch[SEED_COLUMN] = (np.full(len(rows), -1, dtype=np.int64) if seed is None
                                              else seed + np.arange(len(rows), dtype=np.int64))
        rows.meta_info.update(meta)
        self._inflight[next(self._workers).generate_sequences.remote(rows)] = group_id

    @property
    def inflight(self) -> int:
        return len(self._inflight)

    def poll(self, timeout_s: float) -> list[tuple[int, DataProto]]:
        """Groups finished since the last call (waits up to ``timeout_s`` for the first one)."""
        if not self._inflight:
            time.sleep(timeout_s)  # nothing admitted (back-pressure): don't spin
            return []
        ready, _ = ray.wait(list(self._inflight), num_returns=1, timeout=timeout_s)
        if ready:  # take everything else that is done too
            ready, _ = ray.wait(list(self._inflight), num_returns=len(self._inflight), timeout=0)
        return [(self._inflight.pop(ref), ray.get(ref)) for ref in ready]

"""Per-group rollout on verl's agent loop: one agent-loop call per prompt group, completions as they finish.

verl's ``AgentLoopManager.generate_sequences`` returns a whole batch at once. Its workers are async Ray actors whose
``generate_sequences`` accepts any batch, so this adapter calls them with one group (K rows) each and waits on the
object refs: groups finish out of order, each with its K responses and their rewards (verl's reward loop runs in
the agent loop). Which group to send, and with which priority, is decided by the pipeline's admission policy; the
priority reaches vLLM through the batch's ``priority`` column (honoured under ``scheduling_policy=priority``).
A group whose call fails because an actor behind it died (a rollout replica) is set aside in ``lost``, with the
request kept, so the trainer can re-send it once the dead replica is out of routing (``failover.py``).
"""

from __future__ import annotations

import itertools
import time

import numpy as np
import ray
from verl import DataProto

from rolloutpipe_workers.agent_loops import SEED_COLUMN  # vLLM sampling seed of the row; -1 = unseeded

from .failover import dead_actor_error

SAMPLE_COLUMN = "sample_in_group"  # which of the K samples a row is (agent loops may use it)
# columns the stream adds for the engine; not part of the training batch
REQUEST_COLUMNS = ("priority", SAMPLE_COLUMN, SEED_COLUMN)


class GroupRolloutStream:
    def __init__(self, agent_loop_workers: list, group_size: int) -> None:
        self._workers = itertools.cycle(agent_loop_workers)
        self.group_size = group_size
        self._inflight: dict[ray.ObjectRef, int] = {}
        self._requests: dict[int, DataProto] = {}  # the rows each unfinished group was sent with
        self.lost: dict[int, BaseException] = {}  # groups whose call died with an actor, not re-sent yet

    def submit(self, group_id: int, prompt: DataProto, priority: int, meta: dict, seed: int | None = None) -> None:
        """Send the K samples of one prompt (``prompt`` has 1 row) to the next agent-loop worker; with ``seed``,
        sample j is drawn with vLLM seed ``seed + j``."""
        rows = prompt.repeat(repeat_times=self.group_size, interleave=True)
        rows.non_tensor_batch["priority"] = np.full(len(rows), priority, dtype=np.int64)
        rows.non_tensor_batch[SAMPLE_COLUMN] = np.arange(len(rows), dtype=np.int64)
        rows.non_tensor_batch[SEED_COLUMN] = (np.full(len(rows), -1, dtype=np.int64) if seed is None
                                              else seed + np.arange(len(rows), dtype=np.int64))
        rows.meta_info.update(meta)
        self._requests[group_id] = rows
        self._send(group_id)

    def resend(self, group_id: int) -> None:
        """Send a lost group again, exactly as before (same rows, priority and seeds)."""
        del self.lost[group_id]
        self._send(group_id)

    def _send(self, group_id: int) -> None:
        self._inflight[next(self._workers).generate_sequences.remote(self._requests[group_id])] = group_id

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
        done = []
        for ref in ready:
            group_id = self._inflight.pop(ref)
            try:
                out = ray.get(ref)
            except ray.exceptions.RayError as e:
                if dead_actor_error(e) is None:
                    raise
                self.lost[group_id] = e  # none of its K responses is used: the group is generated again or not at all
                continue
            del self._requests[group_id]
            done.append((group_id, out))
        return done

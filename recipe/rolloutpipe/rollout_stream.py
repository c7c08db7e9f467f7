"""Per-group rollout on verl's agent loop: the groups admitted together go out in one call per agent-loop worker,
and each comes back as soon as its K responses are in.

verl's ``AgentLoopManager.generate_sequences`` returns a whole batch at once. The recipe's agent-loop workers
(``rolloutpipe_workers/group_stream.py``) add ``generate_groups``: several groups in one call, streamed back group by
group (a Ray streaming generator), each with its K responses and their rewards (verl's reward loop runs in the agent
loop). One call per admission, not per group: per-group calls cost 2–7 % of generation time in two measured runs
(``experiments/rollout_calls.py``). Workers without ``generate_groups`` (another manager class) get one
``generate_sequences`` call per group. Which groups to send, and with which priority, is decided by the pipeline's
admission policy; the priority reaches vLLM through the batch's ``priority`` column (honoured under
``scheduling_policy=priority``). A group whose call fails because an actor behind it died (a rollout replica) is set
aside in ``lost`` -- with it every group of the same call not delivered yet -- with the request kept, so the trainer
can re-send it once the dead replica is out of routing (``failover.py``).
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import ray
from verl import DataProto

from rolloutpipe_workers.agent_loops import SEED_COLUMN  # vLLM sampling seed of the row; -1 = unseeded

from .failover import dead_actor_error

SAMPLE_COLUMN = "sample_in_group"  # which of the K samples a row is (agent loops may use it)
# columns the stream adds for the engine; not part of the training batch
REQUEST_COLUMNS = ("priority", SAMPLE_COLUMN, SEED_COLUMN)


@dataclass(frozen=True)
class GroupRequest:
    """One admitted group: the prompt's row, its priority in the engine, the rows' meta, and its vLLM seed (sample j
    is drawn with ``seed + j``; None = unseeded)."""

    group_id: int
    prompt: DataProto
    priority: int
    meta: dict
    seed: int | None = None


class GroupRolloutStream:
    def __init__(self, agent_loop_workers: list, group_size: int) -> None:
        self._num_workers = len(agent_loop_workers)
        self._workers = itertools.cycle(agent_loop_workers)
        self.group_size = group_size
        self._inflight: dict[Any, set[int]] = {}  # a call (stream or object ref) -> its groups not delivered yet
        self._requests: dict[int, DataProto] = {}  # the rows each unfinished group was sent with
        self.lost: dict[int, BaseException] = {}  # groups whose call died with an actor, not re-sent yet

    def submit(self, requests: list[GroupRequest]) -> None:
        """Send each request's K samples (its ``prompt`` has 1 row); the groups are spread over the agent-loop
        workers, one call per worker."""
        for r in requests:
            rows = r.prompt.repeat(repeat_times=self.group_size, interleave=True)
            rows.non_tensor_batch["priority"] = np.full(len(rows), r.priority, dtype=np.int64)
            rows.non_tensor_batch[SAMPLE_COLUMN] = np.arange(len(rows), dtype=np.int64)
            rows.non_tensor_batch[SEED_COLUMN] = (np.full(len(rows), -1, dtype=np.int64) if r.seed is None
                                                  else r.seed + np.arange(len(rows), dtype=np.int64))
            rows.meta_info.update(r.meta)
            self._requests[r.group_id] = rows
        self._send([r.group_id for r in requests])

    def resend(self, group_ids: list[int]) -> None:
        """Send lost groups again, exactly as before (same rows, priority and seeds)."""
        for gid in group_ids:
            del self.lost[gid]
        self._send(group_ids)

    def _send(self, group_ids: list[int]) -> None:
        calls = min(self._num_workers, len(group_ids))
        for i in range(calls):
            worker, ids = next(self._workers), group_ids[i::calls]
            if hasattr(worker, "generate_groups"):
                stream = worker.generate_groups.options(num_returns="streaming").remote(
                    [(gid, self._requests[gid]) for gid in ids])
                self._inflight[stream] = set(ids)
            else:  # another manager's workers: one verl call per group
                for gid in ids:
                    self._inflight[worker.generate_sequences.remote(self._requests[gid])] = {gid}

    @property
    def inflight(self) -> int:
        """Groups sent and not delivered yet."""
        return sum(len(ids) for ids in self._inflight.values())

    def poll(self, timeout_s: float) -> list[tuple[int, DataProto]]:
        """Groups finished since the last call (waits up to ``timeout_s`` for the first one)."""
        if not self._inflight:
            time.sleep(timeout_s)  # nothing admitted (back-pressure): don't spin
            return []
        ready, _ = ray.wait(list(self._inflight), num_returns=1, timeout=timeout_s)
        if ready:  # take everything else that is done too
            ready, _ = ray.wait(list(self._inflight), num_returns=len(self._inflight), timeout=0)
        done = []
        for call in ready:
            try:
                group_id, out = self._next_group(call)
            except StopIteration:  # a stream whose every group was delivered
                if self._inflight.pop(call):
                    raise RuntimeError("rolloutpipe: an agent-loop stream ended without some of its groups") from None
                continue
            except ray.exceptions.RayError as e:
                if dead_actor_error(e) is None:
                    raise
                for gid in self._inflight.pop(call):  # none of their responses is used: generated again or not at all
                    self.lost[gid] = e
                continue
            del self._requests[group_id]
            done.append((group_id, out))
        return done

    def _next_group(self, call) -> tuple[int, DataProto]:
        """The next finished group of a ready call (a stream yields one per ``next``; ``ray.wait`` said it is
        there)."""
        if isinstance(call, ray.ObjectRefGenerator):
            group_id, out = ray.get(next(call))
            self._inflight[call].discard(group_id)
            return group_id, out
        [group_id] = self._inflight.pop(call)
        return group_id, ray.get(call)

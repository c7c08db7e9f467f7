"""The rollout stream's call pattern and its fault path, on Ray with stand-in agent-loop workers (the real ones run in
the e2e tests; these inject what the real stack can't on cue: a worker that dies between two groups of a call)."""

from __future__ import annotations

import asyncio
import os
import time

import numpy as np
import pytest
import ray
from verl import DataProto

from recipe.rolloutpipe.rollout_stream import GroupRequest, GroupRolloutStream

K = 2


@pytest.fixture(scope="module")
def local_ray():
    ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    yield
    ray.shutdown()


@ray.remote
class StreamingWorker:
    """Answers each group after ``delay[group]`` seconds with its own rows; ``die_after``: exit the process after
    yielding that many groups of a call."""

    def __init__(self, delay: dict[int, float], die_after: int | None = None) -> None:
        self.delay, self.die_after, self.calls = delay, die_after, []

    async def generate_groups(self, groups):
        self.calls.append([gid for gid, _ in groups])

        async def one(gid, rows):
            await asyncio.sleep(self.delay.get(gid, 0.0))
            return gid, rows

        for n, finished in enumerate(asyncio.as_completed([one(g, r) for g, r in groups])):
            if n == self.die_after:
                await asyncio.sleep(0.5)  # the groups yielded so far reach the caller first
                os._exit(1)
            yield await finished

    def call_log(self) -> list[list[int]]:
        return self.calls


@ray.remote
class BatchOnlyWorker:
    """A worker of another manager: verl's ``generate_sequences`` only."""

    async def generate_sequences(self, rows):
        return rows


def prompt(i: int) -> DataProto:
    return DataProto.from_single_dict({"prompt_id": np.array([i])})


def drain(stream: GroupRolloutStream, want: int, timeout_s: float = 60) -> list[tuple[int, DataProto]]:
    got, deadline = [], time.monotonic() + timeout_s
    while len(got) + len(stream.lost) < want:
        assert time.monotonic() < deadline, (got, stream.lost)
        got += stream.poll(timeout_s=0.05)
    return got


def test_groups_admitted_together_go_in_one_call_and_come_back_as_each_completes(local_ray):
    delay = {0: 0.6, 1: 0.0, 2: 0.3, 3: 0.9}
    worker = StreamingWorker.remote(delay)
    stream = GroupRolloutStream([worker], group_size=K)
    stream.submit([GroupRequest(g, prompt(g), priority=g, meta={"global_steps": 3}, seed=10 * g) for g in range(4)])
    assert stream.inflight == 4
    got = drain(stream, 4)
    assert [g for g, _ in got] == [1, 2, 0, 3]  # completion order, not submission order
    assert ray.get(worker.call_log.remote()) == [[0, 1, 2, 3]]  # one call for the four groups
    for gid, rows in got:  # K rows per group, with the engine's columns
        assert len(rows) == K and list(rows.non_tensor_batch["prompt_id"]) == [gid] * K
        assert list(rows.non_tensor_batch["priority"]) == [gid] * K
        assert list(rows.non_tensor_batch["request_seed"]) == [10 * gid, 10 * gid + 1]
        assert rows.meta_info["global_steps"] == 3
    assert stream.inflight == 0 and not stream.lost
    assert stream.poll(timeout_s=0.05) == []  # the finished stream is dropped, nothing delivered twice


def test_a_worker_dying_mid_call_loses_exactly_the_groups_not_delivered_and_they_can_be_resent(local_ray):
    dying = StreamingWorker.remote({0: 0.0, 1: 0.5, 2: 0.5}, die_after=1)
    stream = GroupRolloutStream([dying], group_size=K)
    stream.submit([GroupRequest(g, prompt(g), 0, {}) for g in range(3)])
    got = drain(stream, 3)
    assert [g for g, _ in got] == [0]
    assert sorted(stream.lost) == [1, 2]
    assert all(isinstance(e, ray.exceptions.RayActorError) for e in stream.lost.values())
    # re-sent (same rows) to a live worker, as the trainer does once the dead replica is out of routing
    stream._workers = iter([StreamingWorker.remote({})] * 2)
    stream.resend([1, 2])
    assert not stream.lost
    again = drain(stream, 2)
    assert sorted(g for g, _ in again) == [1, 2]
    assert all(list(rows.non_tensor_batch["prompt_id"]) == [g] * K for g, rows in again)


def test_workers_without_generate_groups_get_one_call_per_group(local_ray):
    stream = GroupRolloutStream([BatchOnlyWorker.remote()], group_size=K)
    stream.submit([GroupRequest(g, prompt(g), 0, {}) for g in range(3)])
    assert stream.inflight == 3
    assert sorted(g for g, _ in drain(stream, 3)) == [0, 1, 2]

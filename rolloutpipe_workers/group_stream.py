"""verl's agent-loop worker and manager with one method more: ``generate_groups``, several prompt groups in one Ray
call, each group streamed back as soon as its K responses are in (a Ray streaming generator).

Why: a call per group (``generate_sequences`` with K rows, as the recipe's rollout stream sent them before) cost
generation time on the rollout core -- 7 % [3 %, 16 %] slower than verl's one batch call over 10 paired rounds in one
run (the engine worker and the agent-loop worker burning more CPU for the same tokens), 2 % [−3 %, +10 %] in another
(``python -m experiments.rollout_calls``, docs/results.md). One call per admission has the batch call's
shape (−5 % [−19 %, +5 %] against it) and still delivers each group the moment it completes, which CGP needs.

Each group still goes through verl's own ``generate_sequences`` (agent loops, reward loop, post-processing), called
in-process, so the rows are the same as before. Selected through verl's
``actor_rollout_ref.rollout.agent.agent_loop_manager_class`` (config/rolloutpipe.yaml); with a manager whose workers
lack ``generate_groups`` the recipe's stream falls back to one call per group.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import ray
from verl import DataProto
from verl.experimental.agent_loop.agent_loop import AgentLoopManager, AgentLoopWorker


class GroupStreamingAgentLoopWorker(AgentLoopWorker):
    async def generate_groups(self, groups: list[tuple[int, DataProto]]) -> AsyncIterator[tuple[int, DataProto]]:
        """``(group_id, rows)`` pairs in; ``(group_id, verl's output for those rows)`` out, in completion order. A
        group that fails ends the stream with its error; the groups not yet yielded are cancelled (the caller
        re-sends or stops)."""
        async def one(group_id: int, rows: DataProto) -> tuple[int, DataProto]:
            return group_id, await self.generate_sequences(rows)

        tasks = [asyncio.create_task(one(gid, rows)) for gid, rows in groups]
        try:
            for finished in asyncio.as_completed(tasks):
                yield await finished
        finally:  # the stream failed or its caller went away: no request of it keeps running for nobody
            for task in tasks:
                task.cancel()


class GroupStreamingAgentLoopManager(AgentLoopManager):
    """verl's manager (``generate_sequences`` for validation and verl's own step unchanged) over workers that also
    stream groups."""

    agent_loop_workers_class = ray.remote(GroupStreamingAgentLoopWorker)

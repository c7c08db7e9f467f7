"""verl agent loop that produces a response of a prescribed length (the benchmark's workload).

The recipe's single-turn loop (verl's ``SingleTurnAgentLoop``, seeded when configured) with two per-request
sampling parameters set from the batch: ``max_tokens`` = the workload's length for this sample and
``ignore_eos`` = True, so the engine decodes exactly that many tokens. Selected per row through verl's
``agent_name`` column and registered through
``actor_rollout_ref.rollout.agent.agent_loop_config_path`` (config/agent_loops.yaml).
"""

from __future__ import annotations

from typing import Any

from verl.experimental.agent_loop.agent_loop import AgentLoopOutput

from rolloutpipe_workers.agent_loops import SeededSingleTurnAgentLoop

from ..rollout_stream import SAMPLE_COLUMN

AGENT_NAME = "rolloutpipe_length_profile"
LENGTHS_COLUMN = "bench_response_lengths"  # per prompt: "l_0,l_1,...,l_{K-1}"


def parse_lengths(value: str) -> list[int]:
    return [int(x) for x in str(value).split(",")]


class LengthProfileAgentLoop(SeededSingleTurnAgentLoop):
    async def run(self, sampling_params: dict[str, Any], **kwargs) -> AgentLoopOutput:
        lengths = parse_lengths(kwargs[LENGTHS_COLUMN])
        i = int(kwargs.get(SAMPLE_COLUMN, 0))
        params = {**sampling_params, "max_tokens": lengths[i % len(lengths)], "ignore_eos": True}
        return await super().run(params, **kwargs)

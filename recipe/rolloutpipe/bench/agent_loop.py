"""verl agent loops that produce the benchmark's workloads: responses of prescribed lengths, and tool-calling
trajectories with prescribed turns, turn lengths and tool latencies.

The recipe's single-turn loop (verl's ``SingleTurnAgentLoop``, seeded when configured) with two per-request
sampling parameters set from the batch: ``max_tokens`` = the workload's length for this sample and
``ignore_eos`` = True, so the engine decodes exactly that many tokens. Selected per row through verl's
``agent_name`` column and registered through
``actor_rollout_ref.rollout.agent.agent_loop_config_path`` (config/agent_loops.yaml).

``TurnProfileAgentLoop``: the recipe's multi-turn loop (verl's ``ToolAgentLoop``, every turn sent with the group's
priority) where the model's k-th turn decodes exactly the plan's ``lengths[k]`` tokens and, while the plan has calls
left, ends in a call of the bench tool ``wait`` (``rolloutpipe_workers.wait_tool``) that answers after the plan's
latency. Turns, their lengths and the environment's time are then the same in every mode; everything else (token
merging, the tool's masked turn, the tool's execution, rewards) is verl's own path.
"""

from __future__ import annotations

import json
from typing import Any

from verl.experimental.agent_loop.agent_loop import AgentLoopOutput
from verl.experimental.agent_loop.tool_parser import FunctionCall

from rolloutpipe_workers.agent_loops import PrioritizedToolAgentLoop, SeededSingleTurnAgentLoop
from rolloutpipe_workers.wait_tool import WAIT_REPLY, WAIT_TOOL

from ..rollout_stream import SAMPLE_COLUMN

AGENT_NAME = "rolloutpipe_length_profile"
LENGTHS_COLUMN = "bench_response_lengths"  # per prompt: "l_0,l_1,...,l_{K-1}"
TURN_AGENT_NAME = "rolloutpipe_turn_profile"
PLANS_COLUMN = "bench_turn_plans"  # per prompt: JSON, K plans {"lengths": [...], "latencies": [...]}


def parse_lengths(value: str) -> list[int]:
    return [int(x) for x in str(value).split(",")]


class LengthProfileAgentLoop(SeededSingleTurnAgentLoop):
    async def run(self, sampling_params: dict[str, Any], **kwargs) -> AgentLoopOutput:
        lengths = parse_lengths(kwargs[LENGTHS_COLUMN])
        i = int(kwargs.get(SAMPLE_COLUMN, 0))
        params = {**sampling_params, "max_tokens": lengths[i % len(lengths)], "ignore_eos": True}
        return await super().run(params, **kwargs)


class PrescribedToolCalls:
    """The tool parser of a planned trajectory: no stop tokens (a turn ends at its length), and after turn k a call
    of ``wait`` with the plan's k-th latency while the plan has one."""

    def __init__(self, plan: dict[str, list]) -> None:
        self.plan = plan
        self.turns = 0
        self.stop_token_ids: list[int] = []

    async def extract_tool_calls(self, response_ids: list[int], tools: Any = None) -> tuple[str, list[FunctionCall]]:
        k, self.turns = self.turns, self.turns + 1
        if k >= len(self.plan["latencies"]):
            return "", []
        return "", [FunctionCall(name=WAIT_TOOL, arguments=json.dumps({"seconds": self.plan["latencies"][k]}))]


class TurnProfileAgentLoop(PrioritizedToolAgentLoop):
    async def run(self, sampling_params: dict[str, Any], **kwargs) -> AgentLoopOutput:
        plans = json.loads(kwargs[PLANS_COLUMN])
        self.plan = plans[int(kwargs.get(SAMPLE_COLUMN, 0)) % len(plans)]
        self.tool_parser = PrescribedToolCalls(self.plan)
        return await super().run({**sampling_params, "ignore_eos": True}, **kwargs)

    async def _handle_generating_state(self, agent_data, sampling_params: dict[str, Any], **kw):
        turn = min(self.tool_parser.turns, len(self.plan["lengths"]) - 1)
        return await super()._handle_generating_state(
            agent_data, {**sampling_params, "max_tokens": self.plan["lengths"][turn]}, **kw)

    async def _call_tool(self, tool_call: FunctionCall, tools_kwargs: dict[str, Any], agent_data):
        out = await super()._call_tool(tool_call, tools_kwargs, agent_data)
        if out[0].text != WAIT_REPLY:  # verl turns a failed call into a text for the model: here it is a bench bug
            raise RuntimeError(f"bench tool call {tool_call.name}({tool_call.arguments}) failed: {out[0].text!r}")
        return out

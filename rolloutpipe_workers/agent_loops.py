"""verl agent loops of the recipe, registered through ``actor_rollout_ref.rollout.agent.agent_loop_config_path``
(config/agent_loops.yaml) and selected by ``default_agent_loop`` or a row's ``agent_name``.

``SeededSingleTurnAgentLoop``: verl's single-turn loop; when a row carries ``request_seed`` (set by the
recipe's rollout stream when ``rolloutpipe.sampling_seed`` is configured) the request is sampled with that vLLM
seed, so a round can be regenerated exactly (resume after a failure, reproducible runs). Without it, unchanged.

``PrioritizedToolAgentLoop``: verl's multi-turn ``ToolAgentLoop`` (tool calls, tool turns masked out of the loss),
with every turn's request sent with the row's ``priority`` and seed. verl's tool loop sends neither (its single-turn
loop sends the priority): each turn is a new request to the engine, so without this the second turn of a frontier
group would queue behind every first turn of the round -- FGD must order turns, not only first requests.
Registered under verl's own name ``tool_agent`` (config/agent_loops.yaml), so a verl multi-turn config
(``default_agent_loop=tool_agent`` or rows with ``agent_name: tool_agent``) gets it unchanged.
"""

from __future__ import annotations

from typing import Any

from verl.experimental.agent_loop.agent_loop import AgentLoopOutput
from verl.experimental.agent_loop.single_turn_agent_loop import SingleTurnAgentLoop
from verl.experimental.agent_loop.tool_agent_loop import ToolAgentLoop

SEED_COLUMN = "request_seed"  # the row's vLLM sampling seed (the recipe's rollout stream sets it); -1 = unseeded


def _seeded(sampling_params: dict[str, Any], seed: Any) -> dict[str, Any]:
    return {**sampling_params, "seed": int(seed)} if seed is not None and int(seed) >= 0 else sampling_params


class SeededSingleTurnAgentLoop(SingleTurnAgentLoop):
    async def run(self, sampling_params: dict[str, Any], **kwargs) -> AgentLoopOutput:
        return await super().run(_seeded(sampling_params, kwargs.get(SEED_COLUMN)), **kwargs)


class TurnPriorityClient:
    """The agent loop's server client, sending each request (every turn) with the trajectory's engine priority."""

    def __init__(self, client: Any, priority: int) -> None:
        self._client = client
        self.priority = priority

    async def generate(self, *args, **kwargs):
        return await self._client.generate(*args, **{"priority": self.priority, **kwargs})

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


class PrioritizedToolAgentLoop(ToolAgentLoop):
    async def run(self, sampling_params: dict[str, Any], priority: int = 0, **kwargs) -> AgentLoopOutput:
        # one instance per trajectory (verl's AgentLoopWorker instantiates the loop for each row)
        self.server_manager = TurnPriorityClient(self.server_manager, int(priority))
        return await super().run(_seeded(sampling_params, kwargs.get(SEED_COLUMN)), priority=priority, **kwargs)

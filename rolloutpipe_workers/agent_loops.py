"""verl agent loops of the recipe, registered through ``actor_rollout_ref.rollout.agent.agent_loop_config_path``
(config/agent_loops.yaml) and selected by ``default_agent_loop`` or a row's ``agent_name``.

``SeededSingleTurnAgentLoop``: verl's single-turn loop; when a row carries ``request_seed`` (set by the
recipe's rollout stream when ``rolloutpipe.sampling_seed`` is configured) the request is sampled with that vLLM
seed, so a round can be regenerated exactly (resume after a failure, reproducible runs). Without it, unchanged.
"""

from __future__ import annotations

from typing import Any

from verl.experimental.agent_loop.agent_loop import AgentLoopOutput
from verl.experimental.agent_loop.single_turn_agent_loop import SingleTurnAgentLoop

SEED_COLUMN = "request_seed"  # the row's vLLM sampling seed (the recipe's rollout stream sets it); -1 = unseeded


class SeededSingleTurnAgentLoop(SingleTurnAgentLoop):
    async def run(self, sampling_params: dict[str, Any], **kwargs) -> AgentLoopOutput:
        seed = kwargs.get(SEED_COLUMN)
        if seed is not None and int(seed) >= 0:
            sampling_params = {**sampling_params, "seed": int(seed)}
        return await super().run(sampling_params, **kwargs)

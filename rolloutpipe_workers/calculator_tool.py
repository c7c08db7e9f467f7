"""The agentic embedded task's environment: verl native tool ``calc`` (``a+b`` / ``a-b``) that answers after a
latency drawn from a seeded heavy-tailed distribution, like a sandbox or a web call.

The latency is ``task.environment_latency_s`` of (``seed``, the expression): log-normal, median ``latency_p50_s``,
shape ``latency_sigma`` (p99/p50 = 12.9x at sigma 1.1), capped at ``latency_max_s``; every mode and every rerun waits
the same time for the same call, and the K samples of a prompt that call the tool share their prompt's environment
time. Configured in the tool file (config/tools/calculator.yaml, verl's ``multi_turn.tool_config_path`` format).
"""

from __future__ import annotations

import asyncio
from typing import Any

from verl.tools.base_tool import BaseTool
from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse

from recipe.rolloutpipe.task import environment_latency_s, evaluate

LATENCY_KEYS = ("seed", "latency_p50_s", "latency_sigma", "latency_max_s")


class CalculatorTool(BaseTool):
    def __init__(self, config: dict, tool_schema: OpenAIFunctionToolSchema | None) -> None:
        super().__init__(config, tool_schema)
        missing = [k for k in LATENCY_KEYS if k not in config]
        if missing:
            raise ValueError(f"calc tool: the tool config's `config` block lacks {missing} (see "
                             "config/tools/calculator.yaml)")
        self.seed, self.p50_s, self.sigma, self.max_s = (float(config[k]) for k in LATENCY_KEYS)

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs) -> tuple[ToolResponse, float, dict]:
        expr = str(parameters.get("expr", ""))
        latency = environment_latency_s(self.seed, expr, self.p50_s, self.sigma, self.max_s)
        await asyncio.sleep(latency)
        return ToolResponse(text=evaluate(expr)), 0.0, {"latency_s": latency}

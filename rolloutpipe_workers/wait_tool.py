"""The benchmark's environment: verl native tool ``wait`` that answers ``done`` after the ``seconds`` it is called
with -- the tool latency a multi-turn bench workload prescribes per call (recipe/rolloutpipe/workloads.py
``TurnProfile``), so every mode waits the same environment time. Configured in config/tools/bench_wait.yaml."""

from __future__ import annotations

import asyncio
from typing import Any

from verl.tools.base_tool import BaseTool
from verl.tools.schemas import ToolResponse

WAIT_TOOL = "wait"
WAIT_REPLY = "done"


class WaitTool(BaseTool):
    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs) -> tuple[ToolResponse, float, dict]:
        seconds = float(parameters["seconds"])
        await asyncio.sleep(seconds)
        return ToolResponse(text=WAIT_REPLY), 0.0, {"latency_s": seconds}

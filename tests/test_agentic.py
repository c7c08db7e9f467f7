"""The agentic embedded task (task=agentic): its reward, its tool, and the warm start's turn format against verl's
own multi-turn token builder. On the real stack: tests/test_rolloutpipe_e2e.py (a streamed run with verl's GRPO
example keys, and the exactness check)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf

from recipe.rolloutpipe import prepare
from recipe.rolloutpipe.task import (
    DATA_SOURCE,
    TOOL_DATA_SOURCE,
    compute_score,
    environment_latency_s,
    evaluate,
    tool_call,
)
from rolloutpipe_workers.calculator_tool import LATENCY_KEYS

CONFIG = Path(prepare.__file__).with_name("config")
TOOL_FILE = CONFIG / "tools" / "calculator.yaml"


@pytest.mark.parametrize(("response", "score"), [
    ("95", 1.0),  # answered directly
    ('<tool_call>{"name":"calc","arguments":{"expr":"37+58"}}</tool_call>\ntool\n95\nassistant\n95', 1.0),
    ('<tool_call>{"name":"calc","arguments":{"expr":"37+58"}}</tool_call>\ntool\n95\nassistant\n94', 0.0),
    # the tool's answer is not the model's: the final turn must state it
    ('<tool_call>{"name":"calc","arguments":{"expr":"37+58"}}</tool_call>\ntool\n95\nassistant\n', 0.0),
    # out of turns while still calling the tool: no answer (the call's first integer, 37, is no answer either)
    ('<tool_call>{"name":"calc","arguments":{"expr":"37+58"}}</tool_call>', 0.0),
])
def test_the_agentic_reward_reads_the_final_turn(response, score):
    assert compute_score(TOOL_DATA_SOURCE, response, "95") == score
    # the single-turn task is unchanged: its first integer
    assert compute_score(DATA_SOURCE, "95 is it", "95") == 1.0


def test_the_calculator_and_its_heavy_tailed_seeded_latency():
    assert evaluate("37+58") == "95" and evaluate("3-12") == "-9" and evaluate("2*3").startswith("error")
    assert evaluate(tool_call("37+58=").split('"expr":"')[1].split('"')[0]) == "95"
    cfg = OmegaConf.load(TOOL_FILE).tools[0].config
    seed, p50, sigma, cap = (float(cfg[k]) for k in LATENCY_KEYS)
    def latency(seed: float, expr: str) -> float:
        return environment_latency_s(seed, expr, p50, sigma, cap)

    lat = np.array([latency(seed, f"{a}+{b}") for a in range(60) for b in range(60)])
    assert latency(seed, "1+2") == latency(seed, "1+2") and latency(seed + 1, "1+2") != latency(seed, "1+2")
    assert lat.max() <= cap and abs(np.median(lat) / p50 - 1) < 0.1
    assert np.percentile(lat, 99) / np.median(lat) >= 10  # the tool file's default tail (issue's target)


def test_verl_loads_the_tool_file_and_the_tool_answers():
    from verl.tools.tool_registry import initialize_tools_from_config

    [tool] = initialize_tools_from_config(str(TOOL_FILE))
    assert tool.name == "calc"
    response, reward, metrics = asyncio.run(tool.execute("i", {"expr": "12-30"}))
    assert response.text == "-18" and reward == 0.0 and metrics["latency_s"] > 0


@pytest.fixture(scope="module")
def agentic_tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(prepare.ensure_default(prepare.DefaultSpec(task="arith_tool")) / "model")


def test_the_warm_start_imitates_the_tokens_verl_builds_for_a_tool_turn(agentic_tokenizer):
    """The warm start's tool turn (``prepare.tool_turn_ids``) is exactly what verl's ToolAgentLoop appends at run
    time after a call (its Continuous Token builder for the model's type, qwen3): otherwise the model would be
    trained on one format and run on another."""
    from verl.utils.tokenizer.continuous_token_wiring import create_continuous_token_builder

    tok = agentic_tokenizer
    builder = create_continuous_token_builder(tok, hf_model_type="qwen3")
    question = "37+58="
    user = [{"role": "user", "content": question}]
    prompt = builder.build_initial_tokens(user)
    assert prompt == prepare._encode(tok, question)
    call = tok.encode(tool_call(question), add_special_tokens=False) + [tok.eos_token_id]
    assistant = {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "calc", "arguments": {"expr": "37+58"}}}]}
    merged = builder.merge_context_tokens([*user, assistant], [*user, assistant, {"role": "tool", "content": "95"}],
                                          prompt + call)
    assert merged.token_ids == prompt + call + prepare.tool_turn_ids(tok, "95")
    assert len(call) <= 24  # the tokenizer learned the call: a few tokens, not one per byte


def test_the_agentic_default_is_shipped_and_learnable():
    spec = prepare.DefaultSpec(task="arith_tool")
    assert prepare.default_dir(spec) == prepare.SHIPPED_AGENTIC
    assert prepare.file_checksums(prepare.SHIPPED_AGENTIC) == prepare.read_manifest(prepare.SHIPPED_AGENTIC)
    info = __import__("json").loads((prepare.SHIPPED_AGENTIC / "info.json").read_text())
    assert info["key"] == spec.key() != prepare.DefaultSpec().key()
    # RL has something to learn: groups disagree, and greedy answers are mostly wrong before it
    assert info["nonzero_variance_fraction"] >= 0.3 and info["greedy_reward"] < 0.5, info
    assert 0.05 <= info["tool_call_fraction"] <= 0.6, info  # the warm start sometimes calls the tool


def test_every_turn_goes_to_the_engine_with_the_trajectory_priority():
    """verl's tool loop calls its client's ``generate`` once per turn without a priority; the recipe's client adds
    the trajectory's (FGD's order for its group) to each, and keeps one a caller gives explicitly. The client here
    only records what verl's LLM client would receive."""
    from rolloutpipe_workers.agent_loops import TurnPriorityClient

    class Recorder:
        calls: list[dict] = []
        name = "llm-client"

        async def generate(self, request_id, **kwargs):
            self.calls.append({"request_id": request_id, **kwargs})
            return len(self.calls)

    client = TurnPriorityClient(Recorder(), priority=7)
    turns = [asyncio.run(client.generate("r", prompt_ids=[1, 2], sampling_params={})) for _ in range(3)]
    explicit = asyncio.run(client.generate("r", prompt_ids=[1], sampling_params={}, priority=2))
    assert turns == [1, 2, 3] and explicit == 4
    assert [c["priority"] for c in Recorder.calls] == [7, 7, 7, 2] and client.name == "llm-client"

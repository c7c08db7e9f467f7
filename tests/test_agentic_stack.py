"""The agentic embedded task on the real stack (task=agentic: verl's ToolAgentLoop through the recipe's streamed
rollout, a calculator tool with heavy-tailed latency): multi-turn groups complete, tool turns are masked out of the
loss, π_old matches vLLM on the model's own tokens, and every group trains with the weights that sampled it."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ROUND = re.compile(r"\[rolloutpipe\] round (\d+) mode=(\w+) .*?reward=([0-9.]+) .*?lp_diff_p50=([0-9.e+-]+) "
                   r".*?tool_tokens=(\d+) ")
LP_GAP_P50_BOUND = 5e-5  # the CPU overlay's stale-weights bound (same weights: ~1e-5)


def run_main(tmp_path: Path, *overrides: str) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "recipe.rolloutpipe.main", "task=agentic", f"rolloutpipe.timeline_dir={tmp_path}/tl",
         f"trainer.default_local_dir={tmp_path}/ckpt", f"hydra.run.dir={tmp_path}/hydra", "trainer.test_freq=-1",
         "trainer.val_before_train=false", *overrides],
        capture_output=True, text=True, timeout=900, cwd=ROOT)
    log = out.stdout + out.stderr
    assert out.returncode == 0, log[-6000:]
    return log


@pytest.mark.real_stack(runs=1)
def test_tool_agent_rounds_stream_whole_multi_turn_groups(tmp_path):
    mode = "cgp_fgd"
    log = run_main(tmp_path, f"rolloutpipe.mode={mode}", "trainer.total_training_steps=2")
    rounds = ROUND.findall(log)
    assert [(r[0], r[1]) for r in rounds] == [("1", mode), ("2", mode)], log[-4000:]
    for i, (_, _, reward, gap, tool_tokens) in enumerate(rounds, start=1):
        # the warm start calls the tool in some answers: tool turns are in the responses, masked out of the loss
        assert int(tool_tokens) > 0 and float(reward) > 0
        # on the model's own tokens vLLM's log-probs are the trainer's (tool tokens excluded): same weights
        assert float(gap) <= LP_GAP_P50_BOUND
        tl = json.loads((tmp_path / "tl" / f"round{i:04d}_{mode}.json").read_text())
        assert sorted(g["order"] for g in tl["groups"] if g["state"] == "consumed") == list(range(16))
        assert sorted(g for iv in tl["intervals"] for g in iv["group_ids"]) == list(range(16))  # each once
        assert {(g["version"], g["trained_version"]) for g in tl["groups"]} == {(i - 1, i - 1)}
        first_train = min(iv["start"] for iv in tl["intervals"])
        last_ready = max(g["times"]["materialized"] for g in tl["groups"])
        assert first_train < last_ready  # CGP: training overlapped the multi-turn rollout
    # verl's agent-loop metrics: trajectories of three turns (call, tool answer, final answer) among them
    turns = [float(x) for x in re.findall(r"num_turns/max:(?:np\.\w+\()?([0-9.]+)", log)]
    assert len(turns) == 2 and max(turns) >= 3, turns

"""The real CPU stack: verl's CPU platform, vLLM weight reload on CPU, and verl's own GRPO trainer end to end."""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_py(code: str, timeout: int = 600, env: dict | None = None) -> subprocess.CompletedProcess:
    """vLLM CPU spawns processes and verl reads env at import: each check gets a fresh interpreter."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env={**os.environ, **(env or {})})


def test_verl_reports_cpu_and_gloo():
    out = run_py("""
        from verl.utils.device import get_device_name, get_nccl_backend, get_device_id
        from verl.workers.engine.base import EngineRegistry
        cls = EngineRegistry.get_engine_cls("language_model", "fsdp2")
        print(get_device_name(), get_nccl_backend(), get_device_id(), cls.__name__)
    """)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split()[-4:] == ["cpu", "gloo", "cpu", "FSDPEngineWithLMHead"]


@pytest.fixture(scope="module")
def embedded() -> Path:
    from recipe.rolloutpipe.prepare import ensure_default

    return ensure_default()


def test_every_machine_trains_the_shipped_default(embedded, tmp_path, monkeypatch):
    """The default is not rebuilt (a rebuild on another CPU type gives another warm start): it ships in the repo,
    byte for byte what its manifest says, and is what a run resolves to, with an empty cache too."""
    from recipe.rolloutpipe import prepare

    monkeypatch.setenv("ROLLOUTPIPE_CACHE", str(tmp_path))
    assert embedded == prepare.SHIPPED == prepare.ensure_default()
    assert not any(tmp_path.iterdir())  # nothing was built
    sums = prepare.read_manifest(prepare.SHIPPED)
    assert {"model/model.safetensors", "model/tokenizer.json", "train.parquet", "val.parquet"} <= set(sums)
    assert prepare.file_checksums(prepare.SHIPPED) == sums


def test_prepare_rebuilds_deterministically(tmp_path):
    """``prepare`` stays the way to rebuild the default: a small spec built twice on this machine gives the same
    bytes (tokenizer, warm-start weights, parquet) -- seeds everywhere; only the CPU type may change them."""
    from recipe.rolloutpipe.prepare import DefaultSpec, build, file_checksums

    spec = DefaultSpec(train_prompts=64, val_prompts=16, sft_steps=20)
    a, b = build(spec, tmp_path / "a"), build(spec, tmp_path / "b")
    sums_a = {k: v for k, v in file_checksums(a).items() if k != "info.json"}  # info.json holds the build time
    assert "model/model.safetensors" in sums_a and sums_a == {k: v for k, v in file_checksums(b).items()
                                                              if k != "info.json"}


def test_embedded_default_is_learnable(embedded):
    import json

    import pandas as pd

    info = json.loads((embedded / "info.json").read_text())
    # GRPO learns only from groups whose K rewards differ: the warm start must leave enough of them (with R=16, a
    # third is ~5 groups with a signal per round), and room to learn: greedy answers mostly restate the equation
    # (scored 0, task.demonstration) -- the main job takes greedy validation 0.09 -> 0.43 (README).
    assert info["nonzero_variance_fraction"] >= 1 / 3, info
    assert 0.05 <= info["mean_reward"] <= 0.5 and info["greedy_reward"] <= 0.25, info
    df = pd.read_parquet(embedded / "train.parquet")
    row = df.iloc[0]
    assert {"prompt", "data_source", "reward_model", "extra_info"} <= set(df.columns)
    assert row["prompt"][0]["role"] == "user" and row["reward_model"]["ground_truth"]


@pytest.mark.parametrize("plugin", [True, False], ids=["with_plugin", "negative_control"])
def test_vllm_generates_from_reloaded_weights(embedded, plugin):
    """Zeroed embeddings (tied to the LM head) make every sampled token's log-prob exactly -ln(vocab).
    Without our vLLM plugin (negative control) the CPU engine cannot reload at all."""
    out = run_py(f"""
        import math, torch
        from vllm import LLM, SamplingParams
        if __name__ == "__main__":
            llm = LLM(model="{embedded / 'model'}", dtype="float32", enforce_eager=True, max_model_len=128,
                      enable_prefix_caching=False, seed=0)
            sp = SamplingParams(temperature=1.0, max_tokens=6, logprobs=0, ignore_eos=True, seed=0)
            def lps(o):
                return [d[t].logprob for t, d in zip(o.outputs[0].token_ids, o.outputs[0].logprobs)]
            before = lps(llm.generate(["12+34="], sp)[0])
            def reload(model):
                # the trainer's path: load_weights through vLLM's weight loaders, every tensor of the checkpoint
                sd = {{k: v.detach().clone() for k, v in model.state_dict().items()}}
                sd["model.embed_tokens.weight"].zero_()
                model.load_weights(list(sd.items()))
                return model.model.embed_tokens.weight.abs().sum().item()
            print("EMB", llm.apply_model(reload))
            after = lps(llm.generate(["12+34="], sp)[0])
            print("BEFORE", before)
            print("AFTER", after)
    """, env={"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1",
              **({} if plugin else {"VLLM_PLUGINS": "none-selected"})})
    if not plugin:
        assert out.returncode != 0 and "has no attribute 'weight_loader'" in out.stderr
        return
    assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
    before = eval(re.search(r"^BEFORE (.*)$", out.stdout, re.M).group(1))
    after = eval(re.search(r"^AFTER (.*)$", out.stdout, re.M).group(1))
    vocab = 512
    assert all(abs(lp + math.log(vocab)) < 1e-4 for lp in after), after
    assert not all(abs(lp + math.log(vocab)) < 1e-4 for lp in before)  # the warm-started model is not uniform


@pytest.mark.real_stack(runs=1)
def test_stock_verl_grpo_two_steps(embedded, tmp_path):
    """verl's own GRPO trainer: async vLLM rollout, FSDP2 actor on gloo, a weight sync per step, and verl's
    validation after the last step (not before training, and on 64 of the 256 prompts: one small validation is
    enough to check it)."""
    out = subprocess.run(
        [sys.executable, "-m", "recipe.rolloutpipe.main", "rolloutpipe.trainer=stock", "trainer.total_training_steps=2",
         "trainer.val_before_train=false", "data.val_max_samples=64", f"trainer.default_local_dir={tmp_path}/ckpt",
         f"hydra.run.dir={tmp_path}/hydra"],
        capture_output=True, text=True, timeout=900, cwd=ROOT,
    )
    log = out.stdout + out.stderr
    assert out.returncode == 0, log[-5000:]
    steps = re.findall(r"step:(\d+) - .*?critic/score/mean:([0-9.]+)", log)
    assert [s for s, _ in steps] == ["1", "2"], log[-3000:]
    rewards = [float(r) for _, r in steps]
    assert all(0.0 <= r <= 1.0 and math.isfinite(r) for r in rewards)
    val = re.findall(r"step:(\d+) - .*?val-core/rolloutpipe/arith/acc/mean@1:(?:np\.float64\()?([0-9.]+)", log)
    assert [s for s, _ in val] == ["2"] and 0 <= float(val[0][1]) <= 1, val  # after the last step only
    assert "selected 64 random samples out of 256" in log  # verl's data.val_max_samples: 64 prompts are enough
    corr = [float(x) for x in re.findall(r"training/rollout_actor_probs_pearson_corr:([0-9.]+)", log)]
    assert corr and min(corr) > 0.99, corr  # vLLM serves the trainer's weights
    print(f"stock verl GRPO mean reward per step: {rewards}")


def test_forward_only_fsdp_offload_is_unpinned_on_cpu():
    # verl shards the reference policy (KL loss) with CPUOffloadPolicy(pin_memory=True); pinning needs an accelerator
    import torch
    from torch.distributed.fsdp import CPUOffloadPolicy
    from verl.workers.engine.fsdp import transformer_impl

    with pytest.raises(RuntimeError, match="accelerator"):
        torch.empty(4).pin_memory()  # why the patch exists (fails if torch ever pins without one)
    policy = transformer_impl.CPUOffloadPolicy(pin_memory=True)  # what verl builds for a forward-only model
    assert isinstance(policy, CPUOffloadPolicy) and policy.pin_memory is False

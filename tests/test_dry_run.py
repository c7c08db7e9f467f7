"""``rolloutpipe.dry_run=true`` resolves the whole config (platform overlay, layout, verl's and the recipe's checks)
without starting Ray; the user's keys survive it; every run script in recipe/rolloutpipe/run/ passes it here, on a
CPU-only machine, GPU scripts included."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from recipe.rolloutpipe.main import CONFIG_DIR, run
from recipe.rolloutpipe.resolve import user_keys

ROOT = Path(__file__).resolve().parents[1]
RUN = ROOT / "recipe" / "rolloutpipe" / "run"

# verl's GRPO example (examples/grpo_trainer/run_qwen3-8b.sh, KL loss included) as a user brings it, on the
# disaggregated layout: the keys
# the recipe used to overwrite (checkpoint engine, load_format, rollout pool, memory) are among them
VERL_GRPO_EXAMPLE = {
    "algorithm.adv_estimator": "grpo",
    "data.train_batch_size": 64,
    "data.max_prompt_length": 512,
    "data.max_response_length": 1024,
    "data.filter_overlong_prompts": True,
    "actor_rollout_ref.model.path": "Qwen/Qwen3-8B",
    "actor_rollout_ref.model.use_remove_padding": True,
    "actor_rollout_ref.model.enable_gradient_checkpointing": True,
    "actor_rollout_ref.actor.optim.lr": 1e-6,
    "actor_rollout_ref.actor.ppo_mini_batch_size": 16,
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 4,
    "actor_rollout_ref.actor.fsdp_config.param_offload": False,
    "actor_rollout_ref.actor.fsdp_config.dtype": "bfloat16",
    "actor_rollout_ref.actor.use_kl_loss": True,
    "actor_rollout_ref.actor.kl_loss_coef": 0.001,
    "actor_rollout_ref.actor.kl_loss_type": "low_var_kl",
    "actor_rollout_ref.actor.entropy_coeff": 0,
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": 4,
    "actor_rollout_ref.ref.fsdp_config.param_offload": True,
    "actor_rollout_ref.rollout.name": "vllm",
    "actor_rollout_ref.rollout.n": 5,
    "actor_rollout_ref.rollout.tensor_model_parallel_size": 2,
    "actor_rollout_ref.rollout.gpu_memory_utilization": 0.6,
    "actor_rollout_ref.rollout.dtype": "bfloat16",
    "actor_rollout_ref.rollout.load_format": "safetensors",
    "actor_rollout_ref.rollout.checkpoint_engine.backend": "nccl",
    "actor_rollout_ref.rollout.nnodes": 1,
    "actor_rollout_ref.rollout.n_gpus_per_node": 8,
    "trainer.nnodes": 1,
    "trainer.n_gpus_per_node": 8,
    "trainer.save_freq": 20,
    "trainer.test_freq": 5,
}

# the actor/rollout keys verl's GSM8K examples below (multi-turn tool, LoRA GRPO) share, word for word
VERL_GSM8K_ACTOR_KEYS = {
    "actor_rollout_ref.model.use_remove_padding": True,
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 40,
    "actor_rollout_ref.actor.use_kl_loss": True,
    "actor_rollout_ref.actor.kl_loss_coef": 0.001,
    "actor_rollout_ref.actor.kl_loss_type": "low_var_kl",
    "actor_rollout_ref.actor.entropy_coeff": 0,
    "actor_rollout_ref.model.enable_gradient_checkpointing": True,
    "actor_rollout_ref.actor.fsdp_config.param_offload": False,
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload": False,
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": 40,
    "actor_rollout_ref.rollout.tensor_model_parallel_size": 2,
    "actor_rollout_ref.rollout.name": "vllm",
}

# verl's multi-turn GSM8K tool example (examples/sglang_multiturn/run_qwen2.5-3b_gsm8k_multiturn.sh with its
# config gsm8k_multiturn_grpo.yaml; the rollout on vLLM, as in verl's tool-agent examples): verl's own agent loop
# name `tool_agent`, which the recipe maps to its turn-priority subclass (config/agent_loops.yaml)
VERL_MULTITURN_GSM8K_EXAMPLE = {
    "algorithm.adv_estimator": "grpo",
    "data.train_batch_size": 256,
    "data.max_prompt_length": 1024,
    "data.max_response_length": 1024,
    "data.filter_overlong_prompts": True,
    "data.truncation": "error",
    "data.return_raw_chat": True,
    "actor_rollout_ref.model.path": "Qwen/Qwen2.5-3B-Instruct",
    "actor_rollout_ref.actor.optim.lr": 1e-6,
    "actor_rollout_ref.actor.ppo_mini_batch_size": 256,
    **VERL_GSM8K_ACTOR_KEYS,
    "actor_rollout_ref.rollout.gpu_memory_utilization": 0.5,
    "actor_rollout_ref.rollout.n": 16,
    "actor_rollout_ref.rollout.multi_turn.enable": True,
    "actor_rollout_ref.rollout.multi_turn.max_assistant_turns": 5,
    "actor_rollout_ref.rollout.multi_turn.format": "hermes",
    "actor_rollout_ref.rollout.multi_turn.tool_config_path": "examples/sglang_multiturn/config/tool_config/"
                                                             "gsm8k_tool_config.yaml",
    "actor_rollout_ref.rollout.agent.default_agent_loop": "tool_agent",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": 40,
    "actor_rollout_ref.ref.fsdp_config.param_offload": True,
    "algorithm.use_kl_in_reward": False,
    "trainer.critic_warmup": 0,
    "trainer.n_gpus_per_node": 8,
    "trainer.nnodes": 1,
    "trainer.save_freq": -1,
    "trainer.test_freq": 20,
    "trainer.total_epochs": 15,
}

# verl's LoRA GRPO example (examples/grpo_trainer/run_qwen2_5-3b_gsm8k_grpo_lora.sh)
VERL_LORA_GRPO_EXAMPLE = {
    "algorithm.adv_estimator": "grpo",
    "trainer.val_before_train": False,
    "data.train_batch_size": 16,
    "data.max_prompt_length": 512,
    "data.max_response_length": 1024,
    "data.filter_overlong_prompts": True,
    "data.truncation": "error",
    "data.shuffle": False,
    "actor_rollout_ref.model.path": "Qwen/Qwen2.5-3B-Instruct",
    "actor_rollout_ref.model.lora_rank": 64,
    "actor_rollout_ref.model.lora_alpha": 32,
    "actor_rollout_ref.actor.optim.lr": 3e-6,
    "actor_rollout_ref.actor.ppo_mini_batch_size": 16,
    **VERL_GSM8K_ACTOR_KEYS,
    "actor_rollout_ref.rollout.gpu_memory_utilization": 0.6,
    "actor_rollout_ref.rollout.n": 5,
    "actor_rollout_ref.rollout.load_format": "safetensors",
    "actor_rollout_ref.rollout.layered_summon": True,
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": 40,
    "actor_rollout_ref.ref.fsdp_config.param_offload": True,
    "algorithm.use_kl_in_reward": False,
    "trainer.critic_warmup": 0,
    "trainer.n_gpus_per_node": 2,
    "trainer.nnodes": 1,
    "trainer.save_freq": 20,
    "trainer.test_freq": 5,
    "trainer.total_epochs": 15,
}


def _overrides(keys: dict) -> list[str]:
    return [f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in keys.items()]


def _dry_run(overrides: list[str], capsys) -> dict:
    """What ``python -m recipe.rolloutpipe.main <overrides> rolloutpipe.dry_run=true`` does, in this process."""
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        cfg = compose(config_name="rolloutpipe", overrides=[*overrides, "rolloutpipe.dry_run=true"])
    capsys.readouterr()
    run(cfg, user=user_keys(overrides))
    return yaml.safe_load(capsys.readouterr().out)


def test_verl_grpo_example_keys_survive_on_gpu(capsys):
    overrides = ["platform=gpu", "rolloutpipe.layout=disaggregated", *_overrides(VERL_GRPO_EXAMPLE)]
    resolved = OmegaConf.create(_dry_run(overrides, capsys))
    kept = {k: OmegaConf.select(resolved, k) for k in VERL_GRPO_EXAMPLE}
    assert kept == VERL_GRPO_EXAMPLE
    # what the GPU overlay and the layout chose where the user said nothing: verl's GPU defaults, not CPU ones
    assert resolved.trainer.device == "cuda" and resolved.actor_rollout_ref.rollout.enforce_eager is False
    assert resolved.actor_rollout_ref.hybrid_engine is False and resolved.rolloutpipe.platform == "gpu"
    assert resolved.actor_rollout_ref.model.override_config == {}  # verl's flash attention, not sdpa


@pytest.mark.parametrize("example", [VERL_MULTITURN_GSM8K_EXAMPLE, VERL_LORA_GRPO_EXAMPLE],
                         ids=["multiturn_gsm8k_tool", "lora_grpo"])
def test_verl_multiturn_and_lora_examples_keep_every_key(example, capsys):
    resolved = OmegaConf.create(_dry_run(["platform=gpu", *_overrides(example)], capsys))
    assert {k: OmegaConf.select(resolved, k) for k in example} == example
    assert resolved.rolloutpipe.trainer == "rolloutpipe" and resolved.actor_rollout_ref.hybrid_engine is True


def test_layout_fills_only_what_the_user_left(capsys):
    # CPU disaggregated: the recipe's publication engine and dummy start, except where the user chose
    resolved = _dry_run(["rolloutpipe.layout=disaggregated", "actor_rollout_ref.rollout.load_format=auto"], capsys)
    rollout = resolved["actor_rollout_ref"]["rollout"]
    assert rollout["load_format"] == "auto"  # the user's, not the layout's dummy
    assert rollout["checkpoint_engine"]["backend"] == "rolloutpipe_ray" and rollout["dtype"] == "float32"
    resolved = _dry_run(["platform=gpu", "rolloutpipe.layout=disaggregated",
                         "actor_rollout_ref.rollout.n_gpus_per_node=2"], capsys)
    rollout = resolved["actor_rollout_ref"]["rollout"]
    assert (rollout["checkpoint_engine"]["backend"], rollout["load_format"]) == ("nccl", "dummy")
    assert rollout["gpu_memory_utilization"] == 0.85 and rollout["n_gpus_per_node"] == 2


@pytest.mark.parametrize(("overrides", "message"), [
    (["rolloutpipe.layout=disaggregated", "actor_rollout_ref.rollout.checkpoint_engine.backend=nccl"],
     "actor_rollout_ref.rollout.checkpoint_engine.backend=nccl cannot publish weights"),
    (["rolloutpipe.layout=disaggregated", "actor_rollout_ref.hybrid_engine=true"],
     "actor_rollout_ref.hybrid_engine=true colocates vLLM"),
    (["platform=gpu", "rolloutpipe.layout=disaggregated"], "set actor_rollout_ref.rollout.n_gpus_per_node"),
])
def test_a_user_choice_the_layout_cannot_honour_is_one_error(overrides, message, capsys):
    with pytest.raises(SystemExit) as e:
        _dry_run(overrides, capsys)
    assert message in str(e.value) and "Traceback" not in str(e.value)


def _script(name: str, tmp_path: Path) -> list[list[str]]:
    """Runs the script with ``PYTHON`` a stand-in that records each command line it would have run: the script's
    bash (sourcing, variables, loops) runs as a user's would, and the lines are resolved below in this process
    (one verl import for all scripts instead of one per command: ~11 CPU-seconds each)."""
    calls = tmp_path / name
    calls.mkdir()
    shim = tmp_path / "python"
    shim.write_text('#!/usr/bin/env bash\nprintf "%s\\0" "$@" > "$CALLS/$(ls "$CALLS" | wc -l)"\n')
    shim.chmod(0o755)
    env = dict(os.environ, PYTHON=str(shim), CALLS=str(calls), HOME="/nonexistent-home")
    out = subprocess.run(["bash", str(RUN / name), "rolloutpipe.dry_run=true"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, (name, out.stderr[-3000:])
    argvs = [(calls / str(i)).read_text().split("\0")[:-1] for i in range(len(list(calls.iterdir())))]
    for argv in argvs:  # each is `python -m recipe.rolloutpipe.main <overrides> rolloutpipe.dry_run=true`
        assert argv[:2] == ["-m", "recipe.rolloutpipe.main"] and argv[-1] == "rolloutpipe.dry_run=true", argv
    return [argv[2:-1] for argv in argvs]


def test_every_run_script_passes_dry_run(tmp_path, capsys):
    scripts = sorted(p.name for p in RUN.glob("*.sh") if p.name not in ("common_qwen3_1.7b.sh",
                                                                          "run_learning_curves_cpu.sh"))
    resolved = {name: [_dry_run(overrides, capsys) for overrides in _script(name, tmp_path)] for name in scripts}
    assert {n: len(d) for n, d in resolved.items()} == {n: 2 if "_ab_" in n else 1 for n in scripts}
    (embedded,) = resolved["run_embedded_cpu.sh"]
    assert embedded["rolloutpipe"]["platform"] == "cpu" and embedded["trainer"]["device"] == "cpu"
    (paper,) = resolved["run_qwen3_1.7b_paper.sh"]
    assert paper["rolloutpipe"]["platform"] == "gpu" and paper["rolloutpipe"]["layout"] == "disaggregated"
    arf = paper["actor_rollout_ref"]
    # the paper's K=8, U=2, F_w=2, R=32; 4 + 4 GPUs on one node, vLLM TP 2
    assert (arf["rollout"]["n"], arf["actor"]["ppo_mini_batch_size"], paper["rolloutpipe"]["frontier_width"],
            paper["data"]["train_batch_size"]) == (8, 2, 2, 32)
    assert (paper["trainer"]["n_gpus_per_node"], arf["rollout"]["n_gpus_per_node"],
            arf["rollout"]["tensor_model_parallel_size"]) == (4, 4, 2)
    assert arf["rollout"]["checkpoint_engine"]["backend"] == "nccl" and arf["model"]["path"] == "Qwen/Qwen3-1.7B"
    (two,) = resolved["run_qwen3_1.7b_paper_2nodes.sh"]
    assert (two["trainer"]["n_gpus_per_node"], two["actor_rollout_ref"]["rollout"]["n_gpus_per_node"]) == (8, 8)
    stock, ours = resolved["run_ab_stock_vs_cgp_fgd.sh"]
    assert (stock["rolloutpipe"]["trainer"], ours["rolloutpipe"]["trainer"]) == ("stock", "rolloutpipe")
    assert stock["data"]["seed"] == ours["data"]["seed"] and stock["data"]["train_files"] == ours["data"]["train_files"]
    (smoke,) = resolved["run_one_gpu_smoke.sh"]
    assert smoke["rolloutpipe"]["platform"] == "gpu" and smoke["trainer"]["n_gpus_per_node"] == 1
    assert smoke["rolloutpipe"]["layout"] == "hybrid"

"""The RolloutPipe trainer on the real stack (Ray, async vLLM CPU engine, FSDP2 on gloo), embedded default."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from ray.cluster_utils import Cluster

from rolloutpipe_workers.known_noise import LOG_LINES, WARNINGS

ROOT = Path(__file__).resolve().parents[1]


def run_main(tmp_path: Path, *overrides: str) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "recipe.rolloutpipe.main", f"rolloutpipe.timeline_dir={tmp_path}/tl",
         f"trainer.default_local_dir={tmp_path}/ckpt", f"hydra.run.dir={tmp_path}/hydra", *overrides],
        capture_output=True, text=True, timeout=900, cwd=ROOT,
    )
    log = out.stdout + out.stderr
    assert out.returncode == 0, log[-6000:]
    return log


def admitted_beyond_frontier(groups: list[dict], width: int) -> list[int]:
    """Groups admitted while ``width`` lower-order groups were not yet serving-complete, i.e. from outside the
    frontier (architecture.md §1). Completion is stamped before the admission it triggers."""
    return [g["order"] for g in groups
            if sum(h["order"] < g["order"] and h["times"]["serving_complete"] > g["times"]["admitted"]
                   for h in groups) >= width]


# what verl's GRPO example scripts set (examples/grpo_trainer): KL loss to a reference policy, dynamic batch sizes,
# gradient checkpointing, K=5, overlong-prompt filtering, parameter/optimizer offload
VERL_GRPO_KEYS = [
    "actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.actor.kl_loss_coef=0.001",
    "actor_rollout_ref.actor.kl_loss_type=low_var_kl", "actor_rollout_ref.actor.entropy_coeff=0",
    "actor_rollout_ref.actor.use_dynamic_bsz=true", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=1024",
    "actor_rollout_ref.model.enable_gradient_checkpointing=true", "actor_rollout_ref.rollout.n=5",
    "data.filter_overlong_prompts=true", "actor_rollout_ref.actor.fsdp_config.param_offload=true",
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload=true",
    "actor_rollout_ref.ref.fsdp_config.param_offload=true", "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
]


DYNAMIC_SAMPLING = ["algorithm.filter_groups.enable=true", "algorithm.filter_groups.max_num_gen_batches=4"]
NO_VALIDATION = ["trainer.val_before_train=false", "trainer.test_freq=-1"]


# one stack run checking several things (a stack start-up is ~100 s of the suite): priority admission with verl's
# dynamic sampling (replacement prompts), verl's GRPO example keys and validation, on the agentic task (task=agentic:
# verl's multi-turn ToolAgentLoop, a calculator tool with heavy-tailed latency) scored by a slow async reward
# (reward_fn=sandbox: a seeded heavy-tailed latency per response), with LoRA in the hybrid layout (the conftest's
# `lora` keys: verl loads the adapter into vLLM from tensors every round; the disaggregated one: tests/test_lora.py).
# hold with the measured width: test_verify_onpolicy_is_exact below; sync: tests/test_resume.py (its uninterrupted
# run checks sync's rounds, left short by dynamic sampling)
STREAMING = ["task=agentic", "reward_fn=sandbox", "rolloutpipe.fgd_strength=priority",
             "actor_rollout_ref.rollout.scheduling_policy=priority", "trainer.val_before_train=false",
             "data.val_max_samples=64", *DYNAMIC_SAMPLING, *VERL_GRPO_KEYS]


@pytest.mark.real_stack(runs=1)
def test_streaming_rounds(tmp_path, lora):
    mode = "cgp_fgd"
    log = run_main(tmp_path, f"rolloutpipe.mode={mode}", "trainer.total_training_steps=2", *STREAMING, *lora.keys)
    # the KL term is in verl's update metrics, once per round; with LoRA the reference is the actor with its adapter
    # disabled, so the term is above 0 once the adapter has trained
    kl = [float(x) for x in re.findall(r"kl_loss:np\.float64\(([^)]+)\)", log)]
    assert len(kl) == 2 and min(kl) > 0, (kl, log[-3000:])
    assert "get_unstacked_mapper" not in log  # verl's adapter loader on vLLM 0.31 (vllm_compat)
    snapshot = {float(b) for b in re.findall(r"rolloutpipe/snapshot_bytes:([0-9.]+)", log)}
    assert snapshot == {lora.adapter_bytes}, snapshot  # π_old keeps what the optimizer changes: the adapter
    # verl's validation (greedy, the val set) after the last round (test_freq > 0), not before training
    [val] = re.findall(r"\[rolloutpipe\] done: .*? validation \[\(2, ([0-9.]+)\)\]", log)
    assert 0 <= float(val) <= 1 and "validation after round 0" not in log, log[-3000:]
    # the round line has filtered= and short_by= with dynamic sampling only
    rounds = re.findall(r"\[rolloutpipe\] round (\d+) mode=(\w+) .*?(?:filtered=(\d+) short_by=(\d+) )?timeline=", log)
    assert [(r[0], r[1]) for r in rounds] == [("1", mode), ("2", mode)], log[-3000:]
    for i, (_, _, filtered, short) in enumerate(rounds, start=1):
        filtered, short = int(filtered or 0), int(short or 0)
        tl = json.loads((tmp_path / "tl" / f"round{i:04d}_{mode}.json").read_text())
        states = [g["state"] for g in tl["groups"]]
        assert states.count("consumed") == 16 and short == 0  # R groups trained, every round
        # verl's dynamic sampling (algorithm.filter_groups): a group whose K rewards are all equal is dropped and
        # replaced by the next prompt (from the next dataloader batch); without it nothing is filtered
        assert states.count("filtered") == filtered == len(states) - 16
        consumed = sorted(g["order"] for g in tl["groups"] if g["state"] == "consumed")
        steps = sorted({s for iv in tl["intervals"] for s in range(iv["step_index"], iv["step_index"] + iv["steps"])})
        assert steps == [0, 1, 2, 3]  # R/U optimizer steps, U whole groups each
        assert tl["metrics"]["rolloutpipe/trainer_calls"] == 4  # one call per optimizer step
        assert sorted(g for iv in tl["intervals"] for g in iv["group_ids"]) == consumed  # each once
        m = tl["metrics"]
        assert m["rolloutpipe/rollout_to_train_end_s"] > 0 and 0 <= m["rolloutpipe/trainer_wait_ratio"] <= 1
        first_train = min(iv["start"] for iv in tl["intervals"])
        last_ready = max(g["times"]["materialized"] for g in tl["groups"] if g["state"] == "consumed")
        assert first_train < last_ready  # CGP: training overlapped generation
        # F_w: U = 4 for priority (its frontier is the order of the priorities)
        assert tl["settings"]["F_w"] == 4
        # priority admits everything at once (the engine orders): the check hold passes can see a violation
        assert admitted_beyond_frontier(tl["groups"], width=4)
        assert (tmp_path / "tl" / f"round{i:04d}_{mode}.png").stat().st_size > 0
        assert (tmp_path / "tl" / f"round{i:04d}_{mode}.trace.json").stat().st_size > 0
        # every group trained with the weights it was sampled by (recorded per group, not only enforced)
        assert {(g["version"], g["trained_version"]) for g in tl["groups"] if g["state"] == "consumed"} == {(i - 1,
                                                                                                           i - 1)}
        assert m["rolloutpipe/max_version_lag"] == 0
    # verl's own metric names, per round, beside rolloutpipe/* (verl's console logger prints "key:value")
    verl = {k: [float(v) for v in re.findall(rf"{re.escape(k)}:(?:np\.float64\()?([0-9.e+-]+)", log)]
            for k in ("timing_s/gen", "timing_s/reward", "timing_s/old_log_prob", "timing_s/update_actor",
                      "timing_s/update_weights", "timing_s/step", "perf/throughput")}
    assert all(len(v) == 2 for v in verl.values()), verl
    for r in range(2):  # the round contains its phases; they overlap (CGP), so they need not add up to it
        step = verl["timing_s/step"][r]
        assert 0 < verl["timing_s/gen"][r] < step and 0 < verl["timing_s/update_actor"][r] < step, verl
        assert 0 < verl["timing_s/update_weights"][r] < step and verl["perf/throughput"][r] > 0, verl
    # the run's record (docs/results/main_job.json is one): its curve, commit and wall time, start-up included
    record = json.loads((tmp_path / "tl" / "learning_curve.json").read_text())
    assert len(record["round_rewards"]) == record["rounds"] == 2 and record["mode"] == mode
    assert record["wall_s"] > 0 and len(record["git_commit"]) >= 40 and "trainer.total_training_steps=2" in \
        record["overrides"]
    # multi-turn groups: the warm start calls the tool in some answers, so every round trains responses with a
    # tool's turn inside (masked out of the loss); on the model's own tokens vLLM's log-probs are the trainer's (round
    # 2 sampled with the adapter trained in round 1: it reached vLLM)
    tool = [int(x) for x in re.findall(r"\[rolloutpipe\] round \d+ .*?tool_tokens=(\d+) ", log)]
    gap = [float(x) for x in re.findall(r"\[rolloutpipe\] round \d+ .*?lp_diff_p50=([0-9.e+-]+) ", log)]
    assert len(tool) == 2 and min(tool) > 0 and len(gap) == 2 and max(gap) <= 5e-5, (tool, gap)
    # verl's agent-loop metric: trajectories of four turns (call, tool's answer, final answer + the prompt)
    turns = [float(x) for x in re.findall(r" num_turns/max:(?:np\.\w+\()?([0-9.]+)", log)]
    assert len(turns) == 2 and max(turns) >= 4, turns
    # the slow async reward: every response scored on the rollout side (its call's seconds on the round line and
    # per group in the timeline), and still trainer work overlapped the rollout (above: first_train < last_ready)
    calls = [float(x) for x in re.findall(r"\[rolloutpipe\] round \d+ .*?reward_call_p50=([0-9.]+)s ", log)]
    assert len(calls) == 2 and min(calls) > 0.05, calls
    for i in (1, 2):
        tl = json.loads((tmp_path / "tl" / f"round{i:04d}_{mode}.json").read_text())
        assert all(g["reward_s"] > 0 for g in tl["groups"] if g["state"] == "consumed"), tl["groups"]
    # the agentic task has groups without reward variance: the filter had work, and none trained is one
    assert sum(int(r[2]) for r in rounds) > 0, rounds
    zero = re.findall(r"rolloutpipe/groups_zero_advantage:([0-9.]+)", log)  # verl's console logger, per round
    assert len(zero) == 2 and all(float(z) == 0 for z in zero), zero


# The on-policy equivalence check (architecture.md §2) on two Ray nodes (Ray's own ``ray.cluster_utils.Cluster``: two
# raylets, one logical device each), launched with RAY_ADDRESS as on a real cluster: verl places one trainer placement
# group per node, so the two FSDP2 ranks (gloo) run on different nodes and the check runs with data parallelism 2.
# One launch (a launch is ~2 min of the suite) carries every setting the check must hold under:
# - the default train unit, step (one verl update per optimizer step, the serial step's own rows and shapes: 0.0);
#   the groups unit's path (an accumulate call per group, π_old and the reference per call, the token-mean divisor
#   all-reduced across the ranks) replayed one group per call from the same start state, against the serial weights
#   (float32 summation order); steps shares step's call path, tests/test_lora.py runs it;
# - the agentic task (task=agentic): verl's multi-turn ToolAgentLoop, a calculator tool with heavy-tailed latency,
#   ~30 % of the trajectories call it (tool turns masked out of the loss);
# - verl's KL loss to a reference policy (a large coefficient, so the term counts) and PPO's KL penalty in the reward
#   with the adaptive coefficient (applied per dispatched step, advantages after it; in step mode π_old and the
#   reference come in the serial run's call shapes, so the penalised advantages are exact);
# - LoRA in the hybrid layout (the adapter loaded into vLLM; the reference is the actor without it);
# - FGD's hold strength with the measured width (frontier_width=auto: U in the first round, then measured).
VERIFIED = ["rolloutpipe.train_unit=step", "rolloutpipe.sampling_seed=0", "trainer.nnodes=2",
            "trainer.n_gpus_per_node=1", "task=agentic", "actor_rollout_ref.actor.use_kl_loss=true",
            "actor_rollout_ref.actor.kl_loss_coef=0.5", "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
            "algorithm.use_kl_in_reward=true", "algorithm.kl_ctrl.type=adaptive", "algorithm.kl_ctrl.kl_coef=0.5",
            "rolloutpipe.fgd_strength=hold", "rolloutpipe.frontier_width=auto"]


def verify_on_two_nodes(tmp_path: Path, *overrides: str) -> tuple[dict, str]:
    """``python -m recipe.rolloutpipe.verify_onpolicy`` against a two-node Ray cluster; its JSON and log."""
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 8, "num_gpus": 1, "include_dashboard": False})
    cluster.add_node(num_cpus=8, num_gpus=1)
    try:
        out = subprocess.run([sys.executable, "-m", "recipe.rolloutpipe.verify_onpolicy",
                              "--json", str(tmp_path / "v.json"), f"rolloutpipe.timeline_dir={tmp_path}/tl",
                              f"hydra.run.dir={tmp_path}/hydra", *overrides],
                             capture_output=True, text=True, timeout=900, cwd=ROOT,
                             env=dict(os.environ, RAY_ADDRESS=cluster.address))
    finally:
        cluster.shutdown()
    log = out.stdout + out.stderr
    assert out.returncode == 0, log[-6000:]
    return json.loads((tmp_path / "v.json").read_text()), log


@pytest.mark.real_stack(runs=1)
def test_verify_onpolicy_is_exact(tmp_path, lora):
    v, log = verify_on_two_nodes(tmp_path, *VERIFIED, *lora.keys)
    print({k: v[k] for k in v if "diff" in k or k == "calls_per_step"})
    assert "[rolloutpipe] trainer pool: 2 FSDP rank(s) on 2 Ray node(s)" in log, log[-3000:]
    assert v["optimizer_steps"] == 4 and v["train_unit"] == "step"
    assert any(n > 0 for n in v["grad_norms_pipelined"])  # something was actually learned
    assert v["weights_moved"] > 0
    assert v["rollout_vs_snapshot_logprob_gap"] > 0  # vLLM's log-probs are not the trainer's: snapshot matters
    # the serial reference regenerated the round (same weights, same seeds, all groups at once) and scored it
    # batch-wise: the same responses, rewards and (KL-penalised) advantages
    assert v["responses_differing"] == 0 and v["max_abs_sampling_logprob_diff"] <= 1e-4  # measured 7.2e-7
    assert v["max_abs_reward_diff"] == 0.0 and v["max_abs_advantage_diff"] == 0.0
    # verl's update over whole steps, in the serial steps' rows and shapes: identical numbers (architecture.md §2.3)
    assert v["calls_per_step"] == [1, 1, 1, 1]
    assert v["max_abs_old_logprob_diff"] == 0.0 and v["max_abs_ref_logprob_diff"] == 0.0
    assert v["max_abs_weight_diff"] == 0.0 and v["max_abs_grad_diff"] == 0.0
    assert v["grad_norms_pipelined"] == v["grad_norms_serial"]
    # the groups unit's path, one group per call: other call shapes than the serial micro-batches, so the numbers
    # agree to float32 summation order: gradients to ~1e-7 relative (measured 1e-8 absolute on two ranks, grad norms
    # 0.03-0.09); AdamW divides by sqrt(v)+eps, which turns rounding noise in gradients that cancel to ~0 into updates
    # of up to ~lr: weights agree to a small fraction of how far the round moved them (measured 1.5e-8, 2 % of it)
    assert v["max_abs_grad_diff_one_group_per_call"] <= 2e-6 * max(v["grad_norms_serial"])
    assert v["max_abs_weight_diff_one_group_per_call"] <= 0.05 * v["weights_moved"]
    # (verl's per-call token-mean, without the fix, would weigh a split step's calls by 1/their tokens: off by O(grad))
    # the KL penalty in the reward: the checked round starts one round away from the reference (a round of training
    # first), the penalty moved the rewards, and the advantages above (0.0) are the penalised ones
    assert v["kl_loss"] and v["kl_in_reward"], v
    assert v["reward_kl_penalty"] != 0 and v["max_abs_reward_kl_shift"] > 0 and v["ref_vs_old_logprob_gap"] > 1e-4
    assert None not in v["kl_loss_per_step"]
    # one verl update per optimizer step; π_old and the reference computed per step for the penalty before it
    assert v["trainer_pool_calls"]["update_actor_in_round"] == 4, v["trainer_pool_calls"]
    # negative control: weights published mid-round -> later groups sampled off-policy; the check must see it
    nc = v["negative_control"]
    assert nc["detected"] and nc["max_abs_sampling_logprob_diff"] > 1e-3, nc  # measured 2.2e-2
    if nc["responses_differing"]:  # tokens sampled from π_v+1 train other weights; when the same seeds drew the same
        # tokens (sampling log-probs 0.02 off), training is unchanged: π_old is the trainer's snapshot, not vLLM's
        assert nc["max_abs_weight_diff"] > 10 * max(v["max_abs_weight_diff"], 1e-6), nc
    # LoRA: π_old's snapshot on rank 0 is its shard of the adapter (FSDP over the two ranks), not of the frozen base
    assert v["snapshot_bytes"] == lora.adapter_bytes / 2, v
    # the exact comparison covered multi-turn trajectories: responses with a tool's turn inside
    assert v["responses_with_tool_turns"] > 0 and v["tool_response_tokens"] > 0, v
    # a whole run's console (driver, verl workers, vLLM servers and engines): none of the known start-up noise
    # (rolloutpipe_workers/known_noise.py) reaches it, while the recipe's own lines still do
    assert not [n.text for n in (*LOG_LINES, *WARNINGS) if n.text in log]
    assert "[rolloutpipe] round 1 mode=cgp_fgd" in log
    # hold: nothing entered the engine past the frontier, in any round the check ran (the serial reference's
    # regeneration is not a pipelined round: it writes no timeline)
    timelines = sorted((tmp_path / "tl").glob("round*_cgp_fgd.json"))
    assert timelines
    for path in timelines:
        tl = json.loads(path.read_text())
        width = tl["settings"]["F_w"]
        assert 4 <= width <= 16 and tl["settings"]["fgd_strength"] == "hold", tl["settings"]
        assert admitted_beyond_frontier(tl["groups"], width=width) == [], path.name

"""Bad RolloutPipe config fails before any worker starts, with one message naming the key and the fix."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from recipe.rolloutpipe.config_check import RolloutPipeConfigError, validate
from recipe.rolloutpipe.main import CONFIG_DIR

ROOT = Path(__file__).resolve().parents[1]


def cfg(*overrides: str):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        return compose(config_name="rolloutpipe", overrides=list(overrides))


def test_default_config_is_valid():
    s = validate(cfg())
    # paced FGD with the engine's width: ceil(2 * 256 slots / K=8) = 64 groups, capped at R
    assert (s.mode, s.num_groups, s.group_size, s.step_groups, s.frontier_width) == ("cgp_fgd", 16, 8, 4, 16)


@pytest.mark.parametrize("overrides,needle", [
    (["data.train_batch_size=10"], "must be a multiple of actor_rollout_ref.actor.ppo_mini_batch_size"),
    (["rolloutpipe.frontier_width=0"], "rolloutpipe.frontier_width=0 must be auto, engine or a number between 1"),
    (["rolloutpipe.frontier_width=17"], "rolloutpipe.frontier_width=17 must be auto, engine or a number between 1"),
    (["rolloutpipe.frontier_width=wide"], "rolloutpipe.frontier_width='wide' must be auto, engine or a number"),
    (["rolloutpipe.frontier_width=auto", "rolloutpipe.fgd_strength=priority"],
     "with fgd_strength=priority every group is in the engine already"),
    (["rolloutpipe.frontier_width=engine", "rolloutpipe.fgd_strength=priority"],
     "frontier_width=engine sizes hold's frontier; with fgd_strength=priority"),
    (["actor_rollout_ref.rollout.scheduling_policy=fcfs", "rolloutpipe.fgd_strength=priority"],
     "fgd_strength=priority needs actor_rollout_ref.rollout"),
    (["trainer.n_gpus_per_node=3"], "data-parallel size 3"),
    (["trainer.balance_batch=true"], "trainer.balance_batch=true"),
    (["rolloutpipe.mode=async"], "rolloutpipe.mode='async'"),
    (["rolloutpipe.fgd_strength=strict"], "rolloutpipe.fgd_strength='strict': use priority, paced or hold"),
    (["rolloutpipe.old_log_prob=recompute"], "rolloutpipe.old_log_prob='recompute'"),
    (["rolloutpipe.snapshot_placement=gpu"], "rolloutpipe.snapshot_placement='gpu': use auto"),
    (["actor_rollout_ref.actor.ppo_epochs=2"], "ppo_epochs must be 1"),
    (["algorithm.adv_estimator=gae"], "use grpo"),
    (["rolloutpipe.stall_timeout_s=0"], "rolloutpipe.stall_timeout_s=0"),
    (["rolloutpipe.ray_start_timeout_s=-1"], "rolloutpipe.ray_start_timeout_s=-1: use a positive number"),
    (["reward.reward_model.enable=true"], "reward.reward_model.enable=true: the RolloutPipe trainer scores"),
    (["rolloutpipe.max_logprob_gap_p50=0"], "rolloutpipe.max_logprob_gap_p50=0: use a positive log-prob difference"),
    (["rolloutpipe.max_logprob_gap_p50=high"], "rolloutpipe.max_logprob_gap_p50='high': use a positive"),
    (["rolloutpipe.embedded_task=chess"], "rolloutpipe.embedded_task='chess': use arith (single turn) or arith_tool"),
    (["rolloutpipe.ray_task_events_in_gcs=-1"], "rolloutpipe.ray_task_events_in_gcs=-1: use a number of task"),
    (["rolloutpipe.train_unit=round"], "rolloutpipe.train_unit='round': use step (one update per optimizer step), "
                                       "steps"),
    (["rolloutpipe.max_buffered_groups=3"], "rolloutpipe.max_buffered_groups=3 is below what mode=cgp_fgd must hold"),
    (["rolloutpipe.mode=sync", "rolloutpipe.max_buffered_groups=8"], "set it >= 16"),
    (["rolloutpipe.rollout_replicas=0", "rolloutpipe.layout=disaggregated"], "rolloutpipe.rollout_replicas=0: use"),
    (["rolloutpipe.rollout_replicas=2"], "needs rolloutpipe.layout=disaggregated"),
])
def test_bad_config_names_key_and_fix(overrides, needle):
    with pytest.raises(RolloutPipeConfigError) as e:
        validate(cfg(*overrides))
    assert needle in str(e.value)


def test_auto_frontier_width_starts_at_u():
    s = validate(cfg("rolloutpipe.frontier_width=auto", "rolloutpipe.fgd_strength=hold"))
    assert s.frontier_auto and s.frontier_width == s.step_groups == 4
    assert not validate(cfg()).frontier_auto


@pytest.mark.parametrize("max_num_seqs,width", [(32, 8), (20, 5), (8, 4), (256, 16)])
def test_engine_frontier_width_fills_the_slots_twice_between_u_and_r(max_num_seqs, width):
    """R=16, K=8, U=4: ceil(2 * max_num_seqs / K) groups, at least U (the next step's), at most R."""
    s = validate(cfg("rolloutpipe.frontier_width=engine", "rolloutpipe.fgd_strength=hold",
                     f"actor_rollout_ref.rollout.max_num_seqs={max_num_seqs}"))
    assert (s.frontier_width, s.frontier_auto) == (width, False)


def test_paced_takes_the_engine_width_unless_one_is_given():
    assert validate(cfg("rolloutpipe.fgd_strength=paced")).frontier_width == 16  # 2 * 256 slots / K=8, capped at R
    assert validate(cfg("rolloutpipe.fgd_strength=paced", "actor_rollout_ref.rollout.max_num_seqs=32")
                    ).frontier_width == 8
    assert validate(cfg("rolloutpipe.fgd_strength=paced", "rolloutpipe.frontier_width=3")).frontier_width == 3
    assert validate(cfg("rolloutpipe.fgd_strength=hold")).frontier_width == 4  # hold's default stays U


def test_paced_lets_a_multi_turn_round_in_whole():
    """With tools, a group let in late starts its trajectories' turn-and-tool chains late (docs/agentic.md): paced
    and ``engine`` take the whole round whatever the engine's slots; hold and a number keep theirs."""
    tools = ("actor_rollout_ref.rollout.multi_turn.enable=true", "actor_rollout_ref.rollout.max_num_seqs=32")
    assert validate(cfg("rolloutpipe.fgd_strength=paced", *tools)).frontier_width == 16  # R, not 2 * 32 / K = 8
    assert validate(cfg("rolloutpipe.fgd_strength=hold", "rolloutpipe.frontier_width=engine", *tools)
                    ).frontier_width == 16
    assert validate(cfg("rolloutpipe.fgd_strength=hold", *tools)).frontier_width == 4
    assert validate(cfg("rolloutpipe.fgd_strength=paced", "rolloutpipe.frontier_width=3", *tools)).frontier_width == 3


def test_kl_to_a_reference_policy_is_accepted():
    # verl's GRPO examples train with a KL loss (every kl_loss_type verl offers): streamed per step (trainer.py)
    for kind in ("kl", "abs", "mse", "low_var_kl", "full"):
        validate(cfg("actor_rollout_ref.actor.use_kl_loss=true", f"actor_rollout_ref.actor.kl_loss_type={kind}"))
    # and PPO's KL penalty in the reward, fixed or adaptive (applied per dispatched step, trainer.RoundRewardKL)
    for ctrl in ("fixed", "adaptive"):
        validate(cfg("algorithm.use_kl_in_reward=true", f"algorithm.kl_ctrl.type={ctrl}"))


def test_filter_groups_follows_verl_keys():
    assert validate(cfg()).filter_metric is None
    s = validate(cfg("algorithm.filter_groups.enable=true", "algorithm.filter_groups.max_num_gen_batches=3"))
    assert (s.filter_metric, s.max_extra_groups) == ("reward", 2 * 16)  # two more batches of R prompts
    s = validate(cfg("algorithm.filter_groups.enable=true", "algorithm.filter_groups.metric=acc"))
    assert s.filter_metric == "acc" and s.max_extra_groups >= 10**6  # 0 = verl's "no limit": the data bounds it


def test_fgd_strengths_and_their_scheduling():
    # the default is paced FGD (the bench's best FGD: first group before FCFS's at FCFS's rollout, docs/results.md)
    assert validate(cfg()).fgd_strength == "paced"
    # hold orders nothing inside vLLM: any scheduling policy will do
    s = validate(cfg("rolloutpipe.fgd_strength=hold", "actor_rollout_ref.rollout.scheduling_policy=fcfs"))
    assert s.fgd_strength == "hold"


def test_main_rejects_bad_config_before_ray_starts():
    out = subprocess.run([sys.executable, "-m", "recipe.rolloutpipe.main", "data.train_batch_size=10"],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode != 0
    assert "must be a multiple of actor_rollout_ref.actor.ppo_mini_batch_size" in out.stderr
    assert "Traceback" not in out.stderr and "ray init" not in out.stdout.lower()

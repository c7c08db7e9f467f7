"""Shared by the on-policy equivalence tests (one machine: test_rolloutpipe_e2e.py; two Ray nodes:
test_multinode.py); the broken train set and faulty reward of the data and reward checks (test_data_check.py,
test_reward_guard.py; their run-time launch is test_resume.py's killed-replicas one); verl's LoRA keys (test_lora.py,
and the hybrid LoRA run in test_rolloutpipe_e2e.py's streaming launch)."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[1]
FAULTY_REWARD = ROOT / "tests" / "data" / "faulty_reward.py"  # a reward function with every fault


def pytest_configure(config: pytest.Config) -> None:
    # with -n 2 (pytest-xdist) each worker takes one test at a time, in the order below, instead of a chunk of them
    if getattr(config.option, "maxschedchunk", 0) is None:
        config.option.maxschedchunk = 1


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Real-stack tests first, those with the most stack runs first. A stack's start-up keeps one core busy for a
    minute or more, so the suite runs two tests at a time (``-n 2``, README); starting the long ones first leaves the
    short ones to fill in at the end instead of one long run finishing alone."""
    def runs(item: pytest.Item) -> int:
        mark = item.get_closest_marker("real_stack")
        return int(mark.kwargs.get("runs", 1)) if mark else 0

    items.sort(key=runs, reverse=True)  # stable: file order within the same count


def _run_and_check(tmp_path: Path, train_unit: str, *overrides: str,
                   ray_address: str | None = None) -> tuple[dict, str]:
    """``python -m recipe.rolloutpipe.verify_onpolicy`` (seeded sampling); asserts the equivalence contract and
    returns the JSON and the log."""
    env = dict(os.environ, RAY_ADDRESS=ray_address) if ray_address else None
    out = subprocess.run([sys.executable, "-m", "recipe.rolloutpipe.verify_onpolicy",
                          "--json", str(tmp_path / "v.json"), f"rolloutpipe.timeline_dir={tmp_path}/tl",
                          f"hydra.run.dir={tmp_path}/hydra", f"rolloutpipe.train_unit={train_unit}",
                          "rolloutpipe.sampling_seed=0", *overrides],
                         capture_output=True, text=True, timeout=900, cwd=ROOT, env=env)
    log = out.stdout + out.stderr
    assert out.returncode == 0, log[-6000:]
    v = json.loads((tmp_path / "v.json").read_text())
    print(train_unit, {k: v[k] for k in v if "diff" in k or k == "calls_per_step"})
    assert v["optimizer_steps"] == 4 and v["train_unit"] == train_unit
    assert any(n > 0 for n in v["grad_norms_pipelined"])  # something was actually learned
    assert v["weights_moved"] > 0
    assert v["rollout_vs_snapshot_logprob_gap"] > 0  # vLLM's log-probs are not the trainer's: snapshot matters
    # the serial reference regenerated the round (same weights, same seeds, all groups at once) and scored it
    # batch-wise: the same responses, rewards and advantages
    assert v["responses_differing"] == 0 and v["max_abs_sampling_logprob_diff"] <= 1e-4  # measured 7.6e-6
    assert v["max_abs_reward_diff"] == 0.0 and v["max_abs_advantage_diff"] == 0.0
    if train_unit in ("step", "steps"):  # π_old over the serial step's own rows and shapes: identical numbers
        assert v["max_abs_old_logprob_diff"] == 0.0
    else:  # groups: a call's rows are whichever groups had arrived, so its forward batches other rows together than
        # the serial micro-batches (other padded lengths, other matmul blocking): float32 rounding, usually 0.0,
        # once 2.9e-6 (two nodes, CI on f29dc38)
        assert v["max_abs_old_logprob_diff"] <= 1e-5, v["max_abs_old_logprob_diff"]
    # negative control: weights published mid-round -> later groups sampled off-policy; the check must see it
    nc = v["negative_control"]
    assert nc["detected"] and nc["max_abs_sampling_logprob_diff"] > 1e-3, nc  # measured 5.7e-2
    if nc["responses_differing"]:  # tokens sampled from π_v+1 train other weights; when the same seeds drew the same
        # tokens (seen once after a warm-up round, sampling log-probs 0.31 off), training is unchanged: π_old is the
        # trainer's snapshot, not vLLM's
        assert nc["max_abs_weight_diff"] > 10 * max(v["max_abs_weight_diff"], 1e-6), nc
    if v["kl_in_reward"]:  # PPO's KL penalty in the reward: the checked round starts one round away from the
        # reference, the penalty moved the rewards, and the advantages above (0.0) are the penalised ones (verl's
        # default `kl` estimator, log π_old - log π_ref, has either sign per token: its mean was -7.6e-3 on the
        # agentic task)
        assert v["reward_kl_penalty"] != 0 and v["max_abs_reward_kl_shift"] > 0, v
        assert v["max_abs_ref_logprob_diff"] == 0.0 and v["ref_vs_old_logprob_gap"] > 1e-4
    elif v["kl_loss"]:  # KL to the reference policy: the same reference log-probs as the serial batch's; the
        # reference is the model's starting weights, which this round starts from, so it computes π_old's numbers (a
        # reference in another precision or model would not: bf16 was off by 0.45); verl's KL term is ~0 on the
        # first step and grows once the policy has moved
        exact = train_unit in ("step", "steps")  # groups: float32 rounding, as π_old above
        assert v["max_abs_ref_logprob_diff"] <= (0.0 if exact else 1e-5) and v["ref_vs_old_logprob_gap"] <= 1e-4
        kl = v["kl_loss_per_step"]
        assert None not in kl and max(abs(x) for x in kl[1:]) > 10 * abs(kl[0]), kl
    pool_calls = v["trainer_pool_calls"]
    trained_in = "accumulate" if train_unit == "groups" else "update_actor_in_round"
    if train_unit == "steps":  # one call for the whole steps ready: several steps' call counts for each of them
        assert 1 <= pool_calls[trained_in] <= sum(v["calls_per_step"]), pool_calls
        print("steps: trainer calls", pool_calls[trained_in], "for", v["optimizer_steps"], "optimizer steps")
    else:
        assert pool_calls[trained_in] == sum(v["calls_per_step"]), pool_calls  # one worker call per dispatch
    if not v["kl_in_reward"]:  # π_old (and with groups, the closing optimizer step) inside that call: no other
        assert set(pool_calls) == {trained_in}, pool_calls
    if train_unit in ("step", "steps"):  # verl's update over whole steps, the serial steps' shapes: identical numbers
        assert v["calls_per_step"] == [1, 1, 1, 1]
        assert v["max_abs_weight_diff"] == 0.0 and v["max_abs_grad_diff"] == 0.0  # architecture.md §2.3: aim for 0
        assert v["grad_norms_pipelined"] == v["grad_norms_serial"]
        return v, log
    # groups: each step accumulated over calls of other shapes than the serial micro-batches, so the numbers
    # agree to float32 summation order: gradients to ~1e-7 relative (measured 1.4e-7 absolute, 3e-7 one group per
    # call, grad norms 0.3-0.95). AdamW divides by sqrt(v)+eps, which turns rounding noise in gradients that
    # cancel to ~0 into updates of up to ~lr: weights agree to a small fraction of how far the round moved them,
    # not bit for bit (measured 6e-8 .. 9.4e-6 across runs, 0.4-2.3 % of weights_moved).
    scale = max(v["grad_norms_serial"])  # float32 rounding is relative to the size of the gradient
    assert v["max_abs_grad_diff"] <= 2e-6 * scale and v["max_abs_grad_diff_one_group_per_call"] <= 2e-6 * scale
    assert v["grad_norms_pipelined"] == pytest.approx(v["grad_norms_serial"], rel=5e-6)  # measured <= 1e-6
    for key in ("max_abs_weight_diff", "max_abs_weight_diff_one_group_per_call"):
        assert v[key] <= 0.05 * v["weights_moved"], (key, v[key], v["weights_moved"])
    # (verl's per-call token-mean, without the fix, would weigh a split step's calls by 1/their tokens: off by O(grad))
    return v, log


@pytest.fixture(scope="session")
def broken(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The embedded train set's first 64 rows with row 3 an empty prompt, row 5 without ground truth, row 7
    overlong."""
    import pandas as pd

    from recipe.rolloutpipe.prepare import default_dir, ensure_default

    ensure_default()
    rows = pd.read_parquet(default_dir() / "train.parquet").head(64).to_dict("records")
    rows[3]["prompt"] = []
    rows[5]["reward_model"] = {"style": "rule"}
    rows[7]["prompt"] = [{"role": "user", "content": "1+1= " * 40}]
    path = tmp_path_factory.mktemp("data") / "broken.parquet"
    pd.DataFrame(rows).to_parquet(path)
    return path


@pytest.fixture
def bad_input(broken: Path, tmp_path: Path) -> SimpleNamespace:
    """A launch on bad input that must lose nothing. ``overrides``: the broken train set with its bad rows skipped
    (``on_bad_row=skip`` trains on a cleaned copy) and a reward function with every fault (raises, NaN, None, too
    slow: tests/data/faulty_reward.py) behind the guard's 0.3 s timeout. ``lost_nothing(log, rounds)`` checks the
    launch afterwards: the bad rows counted and skipped, and each of its first ``rounds`` rounds trained all 16 groups
    with the reward faults counted (scored 0), never a NaN score."""
    clean = tmp_path / "clean"

    def lost_nothing(log: str, rounds: int) -> None:
        assert "broken.parquet: 64 rows, 2 skipped as malformed, 1 overlong" in log
        assert (clean / "broken.clean.parquet").exists()
        errors = [int(x) for x in re.findall(r"\[rolloutpipe\] round \d+ mode=cgp_fgd .*reward_errors=(\d+)", log)]
        assert len(errors) >= rounds and all(e > 0 for e in errors[:rounds]), (errors, log[-3000:])
        consumed = [float(c) for c in re.findall(r"rolloutpipe/groups_trained:([0-9.]+)", log)]
        assert consumed[:rounds] == [16.0] * rounds, consumed
        assert not any(math.isnan(float(x)) for x in re.findall(r"critic/score/mean:([0-9.na]+)", log))

    overrides = [f"data.train_files={broken}", "rolloutpipe.data_check.on_bad_row=skip",
                 "data.filter_overlong_prompts=true", f"rolloutpipe.data_check.clean_dir={clean}",
                 f"reward.custom_reward_function.path={FAULTY_REWARD}", "rolloutpipe.reward_guard.timeout_s=0.3"]
    return SimpleNamespace(overrides=overrides, lost_nothing=lost_nothing)


@pytest.fixture(scope="session")
def lora() -> SimpleNamespace:
    """verl's LoRA keys (rank-8 adapters on every linear layer) and the adapter's size on the embedded models (both
    tasks share the architecture): 2 layers x (q, k, v, o, gate, up, down), 4 bytes per parameter -- what the π_old
    snapshot holds instead of the frozen base."""
    return SimpleNamespace(keys=["actor_rollout_ref.model.lora_rank=8", "actor_rollout_ref.model.lora_alpha=16",
                                 "actor_rollout_ref.model.target_modules=all-linear"], adapter_bytes=155648)


@pytest.fixture
def verify_onpolicy() -> Callable[..., tuple[dict, str]]:
    return _run_and_check

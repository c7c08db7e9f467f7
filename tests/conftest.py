"""The suite's order (real-stack tests first); the broken train set and faulty reward of the data and reward checks
(test_data_check.py, test_reward_guard.py; their run-time launch is test_resume.py's killed-replicas one); verl's LoRA
keys (test_lora.py, and test_rolloutpipe_e2e.py's streaming and on-policy launches); the log-prob gap bound those
launches hold rounds to (test_lora.py, test_resume.py)."""

from __future__ import annotations

import math
import re
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


@pytest.fixture(scope="session")
def lp_gap_bound() -> float:
    """``rolloutpipe.max_logprob_gap_p50`` as the CPU overlay sets it (config/platform/cpu.yaml, its one home): the
    round's median |vLLM log-prob - trainer log-prob| above which a run stops (the engine does not have the trainer's
    weights), and the tests' bound on a round whose engine has them."""
    from omegaconf import OmegaConf

    overlay = OmegaConf.load(ROOT / "recipe" / "rolloutpipe" / "config" / "platform" / "cpu.yaml")
    return float(overlay.rolloutpipe.max_logprob_gap_p50)

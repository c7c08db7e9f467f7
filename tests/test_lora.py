"""LoRA on the real stack (verl's keys: actor_rollout_ref.model.lora_rank / lora_alpha / target_modules), the
disaggregated layout: merged weights reach vLLM through the checkpoint engine every round, and a publication that
stops reaching it ends the run with one message instead of training on another policy's samples (docs/lora.md). The
hybrid layout (the adapter loaded into vLLM from tensors, the reference = the actor without it, π_old's snapshot =
the adapter) runs in the streaming launch of tests/test_rolloutpipe_e2e.py: a launch is ~2 min of the suite."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ROUND = re.compile(r"\[rolloutpipe\] round (\d+) mode=\w+ .*?lp_diff_p50=([0-9.e+-]+) ")
# the round line's median |vLLM log-prob - trainer log-prob| when the engine has the trainer's weights (fp32 both
# sides): measured 0.7e-5 .. 1.6e-5 with LoRA; an adapter one round stale: 1.0e-4 (the CPU overlay's bound, conftest's
# lp_gap_bound: 5e-5)


def _run(tmp_path: Path, *overrides: str, env: dict | None = None) -> tuple[int, str]:
    out = subprocess.run(
        [sys.executable, "-m", "recipe.rolloutpipe.main", "trainer.val_before_train=false",
         "trainer.test_freq=-1", f"rolloutpipe.timeline_dir={tmp_path}/tl", f"trainer.default_local_dir={tmp_path}/d",
         f"hydra.run.dir={tmp_path}/hydra", *overrides],
        capture_output=True, text=True, timeout=900, cwd=ROOT, env=env)
    return out.returncode, out.stdout + out.stderr


@pytest.mark.real_stack(runs=1)
def test_disaggregated_lora_then_a_stale_engine_stops_the_run(tmp_path, lora, lp_gap_bound):
    """Disaggregated layout, the fused train unit (``steps``): merged weights reach the standalone replica for
    rounds 1-2 (the replica starts from random weights, so round 1 matching proves the first publish and round 2 the
    first trained adapter); from the third publication on the fault fixture re-sends the second's (the adapter stops
    reaching vLLM), and the run must end with the message, not train on: at round 3 or, where the adapter moved
    little in one round, at round 4 (measured: a stale round-3 gap of 4.93e-5 against the 5e-5 bound in one CI run,
    1.4e-4 in its round 4)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "tests" / "data"), os.environ.get("PYTHONPATH", "")]),
               ROLLOUTPIPE_STALE_AFTER="2")
    code, log = _run(tmp_path, *lora.keys, "rolloutpipe.layout=disaggregated", "trainer.total_training_steps=4",
                     "rolloutpipe.train_unit=steps",
                     "actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module=stale_publication", env=env)
    assert code != 0, log[-6000:]
    gaps = {int(r): float(g) for r, g in ROUND.findall(log)}
    last = max(gaps)
    assert sorted(gaps) == list(range(1, last + 1)) and last in (3, 4), (gaps, log[-4000:])
    assert gaps[1] <= lp_gap_bound and gaps[2] <= lp_gap_bound and gaps[last] > lp_gap_bound, gaps  # the first over
    [stop] = re.findall(r"rolloutpipe: round (\d+) was not generated with the trainer's weights v(\d+): median .*? > "
                        rf"rolloutpipe\.max_logprob_gap_p50={lp_gap_bound:g}", log)
    assert stop == (str(last), str(last - 1)), stop
    assert "Traceback" not in log.split("was not generated with the trainer's weights")[-1]  # one message

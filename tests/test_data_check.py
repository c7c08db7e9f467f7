"""Bad data is found before any worker starts: malformed rows, overlong prompts, a truncated file; with
``on_bad_row=skip`` the real stack trains on the cleaned copy (with a faulty reward function too: one launch, shared
with the killed-replicas run, tests/test_resume.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from omegaconf import OmegaConf

from recipe.rolloutpipe.data_check import DataCheckError, check_data, row_problem
from recipe.rolloutpipe.prepare import default_dir

ROOT = Path(__file__).resolve().parents[1]


def _config(path: Path, **data):
    d = default_dir()
    return OmegaConf.create({
        "rolloutpipe": {"data_check": {"on_bad_row": data.pop("on_bad_row", "error")}},
        "data": {"train_files": str(path), "val_files": str(d / "val.parquet"), "max_prompt_length": 32,
                 "truncation": "error", "filter_overlong_prompts": False, **data},
        "actor_rollout_ref": {"model": {"path": str(d / "model")}},
    })


def test_row_problems_name_the_key():
    assert "non-empty list" in row_problem({"prompt": "x"}, "prompt")
    assert "'role' and 'content'" in row_problem({"prompt": [{"role": "user"}]}, "prompt")
    good = {"prompt": [{"role": "user", "content": "1+1="}], "reward_model": {"ground_truth": "2"},
            "data_source": "s"}
    assert row_problem(good, "prompt") is None
    assert "ground_truth" in row_problem({**good, "reward_model": {}}, "prompt")


def test_malformed_rows_stop_with_one_message(broken, tmp_path):
    with pytest.raises(DataCheckError) as e:
        check_data(_config(broken), tmp_path)
    msg = str(e.value)
    assert "data.train_files" in msg and "2 malformed rows" in msg and "row 3:" in msg and "row 5:" in msg
    assert "rolloutpipe.data_check.on_bad_row=skip" in msg


def test_overlong_prompts_error_unless_verl_handles_them(broken, tmp_path):
    with pytest.raises(DataCheckError) as e:
        check_data(_config(broken, on_bad_row="skip"), tmp_path)
    assert "longer than data.max_prompt_length=32" in str(e.value) and "row 7:" in str(e.value)
    cfg = _config(broken, on_bad_row="skip", filter_overlong_prompts=True)
    [train, _] = check_data(cfg, tmp_path)
    assert len(train.bad_rows) == 2 and list(train.overlong_rows) == [7]
    assert cfg.data.train_files.endswith("broken.clean.parquet")  # the run now reads the cleaned copy
    assert len(pd.read_parquet(cfg.data.train_files)) == 62


def test_truncated_file_stops_before_ray(tmp_path, broken):
    cut = tmp_path / "cut.parquet"
    cut.write_bytes(broken.read_bytes()[:3000])
    out = subprocess.run([sys.executable, "-m", "recipe.rolloutpipe.main", f"data.train_files={cut}",
                          f"hydra.run.dir={tmp_path}/h"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    log = out.stdout + out.stderr
    assert out.returncode != 0
    assert f"rolloutpipe: data.train_files: cannot read {cut} as parquet" in log and "truncated" in log
    assert "Started a local Ray instance" not in log and "Traceback" not in log

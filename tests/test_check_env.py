"""A broken environment gives one line per problem saying what is wrong and what to do."""

from __future__ import annotations

import subprocess
import sys

from rolloutpipe_workers import check_env


def test_this_environment_is_clean(monkeypatch):
    # the installed packages; free RAM depends on what else runs on the machine (its check is faked below)
    monkeypatch.setattr(check_env, "_available_gib", lambda: 64.0)
    assert check_env.problems() == []


def test_each_bad_environment_gets_one_clear_line(monkeypatch):
    real = check_env._version
    fake = {"torchvision": "0.28.0", "vllm": "0.31.0"}
    monkeypatch.setattr(check_env, "_version", lambda d: fake.get(d, real(d)))
    monkeypatch.setattr(check_env, "_cuda_build", lambda torch: True)
    monkeypatch.setattr(check_env, "_available_gib", lambda: 1.5)
    lines = check_env.problems(python=(3, 13))
    assert len(lines) == 5, lines
    joined = "\n".join(lines)
    assert "Python 3.13 is outside the supported 3.10-3.12" in joined and "outside the supported 3.10-3.12" in joined
    assert "CUDA build but no GPU is visible -> install the CPU build" in joined
    assert "torchvision 0.28.0 is installed" in joined and "pip uninstall -y torchvision" in joined
    assert "lacks '+cpu'" in joined and "vllm_dist_shim" in joined
    assert "only 1.5 GiB RAM available" in joined and "VLLM_CPU_KVCACHE_SPACE" in joined
    assert all("\n" not in line and "->" in line for line in lines)


def test_check_or_exit_prints_lines_not_a_traceback():
    code = ("from rolloutpipe_workers import check_env as c; c._available_gib = lambda: 0.5; c.check_or_exit()")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert out.stderr.strip().startswith("rolloutpipe: only 0.5 GiB RAM available")
    assert "Traceback" not in out.stderr


def test_gpu_platform_names_what_is_missing(monkeypatch):
    # this CPU environment seen with platform=gpu: CPU torch, vLLM's CPU build, no cupy -> one line each
    monkeypatch.setattr(check_env, "_available_gib", lambda: 64.0)
    lines = check_env.problems(platform="gpu")
    assert len(lines) == 3, lines
    assert "is a CPU build but platform=gpu" in lines[0] and "vllm-cpu" in lines[1] and "cupy" in lines[2]
    assert all(check_env.GPU_INSTALL in line for line in lines)
    # a CUDA torch that sees a GPU, CUDA vLLM and cupy: clean, and CUDA-linked torchvision is fine there
    real = check_env._version
    fake = {"vllm-cpu": None, "vllm": "0.24.0", "cupy-cuda13x": "14.2.0", "torchvision": "0.26.0"}
    monkeypatch.setattr(check_env, "_version", lambda d: fake[d] if d in fake else real(d))
    monkeypatch.setattr(check_env, "_cuda_build", lambda torch: True)
    monkeypatch.setattr(check_env, "cuda_gpu_visible", lambda: True)
    assert check_env.problems(platform="gpu") == []
    monkeypatch.setattr(check_env, "cuda_gpu_visible", lambda: False)
    assert ["sees no CUDA GPU" in line for line in check_env.problems(platform="gpu")] == [True]

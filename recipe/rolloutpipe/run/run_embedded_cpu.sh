#!/usr/bin/env bash
# The recipe's main job on its embedded default (tiny Qwen3 + arithmetic, CPU, no downloads): 40 rounds of
# streaming GRPO (cgp_fgd). Any verl key can be appended as a Hydra override, e.g. rolloutpipe.mode=sync.
set -euo pipefail
"${PYTHON:-python3}" -m recipe.rolloutpipe.main "$@"

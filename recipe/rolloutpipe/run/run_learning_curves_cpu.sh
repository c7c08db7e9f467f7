#!/usr/bin/env bash
# Whole runs of verl's own trainer (stock), sync, cgp and cgp_fgd on the same prompts per round, 3 seeds
# (about 30 min on 2 cores): docs/results/learning_curves.{json,png}.
set -euo pipefail
"${PYTHON:-python3}" -m recipe.rolloutpipe.curves --rounds 30 --seeds 0 1 2 "$@"

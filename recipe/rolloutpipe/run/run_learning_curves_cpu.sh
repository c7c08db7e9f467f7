#!/usr/bin/env bash
# Whole runs of verl's own trainer (stock) and the default cgp_fgd on the same prompts per round, 5 seeds x 40
# rounds (about 45 min on 2 cores), with the equivalence test: docs/results/learning_curves.{json,png}.
set -euo pipefail
"${PYTHON:-python3}" -m recipe.rolloutpipe.curves --rounds 40 --seeds 0 1 2 3 4 --modes stock cgp_fgd "$@"

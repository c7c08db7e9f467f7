#!/usr/bin/env bash
# Whole runs of verl's own trainer (stock) and the default cgp_fgd on the same prompts per round, 10 seeds x 40
# rounds (46-90 min on 2 cores, by the host), with the equivalence test: docs/results/learning_curves.{json,png}.
# 10 seeds, not 5: with 5 the seed-to-seed spread of final validation is too wide for the +-0.03 margin.
set -euo pipefail
"${PYTHON:-python3}" -m recipe.rolloutpipe.curves --rounds 40 --seeds 0 1 2 3 4 5 6 7 8 9 --modes stock cgp_fgd "$@"

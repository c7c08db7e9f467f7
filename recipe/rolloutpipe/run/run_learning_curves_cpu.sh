#!/usr/bin/env bash
# Whole runs of verl's own trainer (stock) and the default cgp_fgd on the same prompts per round, 10 seeds x 40
# rounds (46-90 min on 2 cores, by the host), with the equivalence test: docs/results/learning_curves.{json,png}.
set -euo pipefail
"${PYTHON:-python3}" -m recipe.rolloutpipe.curves --rounds 40 --modes stock cgp_fgd "$@"

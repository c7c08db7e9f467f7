#!/usr/bin/env bash
# A/B on the same seed and prompts: verl's own trainer (rolloutpipe.trainer=stock) then RolloutPipe's cgp_fgd, each a
# whole run of the paper's setting (run_qwen3_1.7b_paper.sh); compare their timing/* and rolloutpipe/* metrics.
set -euo pipefail
here=$(dirname "$0")
R=${R:-32}
for arm in stock cgp_fgd; do
    if [ "$arm" = stock ]; then pick=(rolloutpipe.trainer=stock); else pick=(rolloutpipe.mode=cgp_fgd); fi
    R=$R bash "$here/run_qwen3_1.7b_paper.sh" data.seed=0 "${pick[@]}" \
        trainer.experiment_name="qwen3_1.7b_R${R}_ab_${arm}" "$@"
done

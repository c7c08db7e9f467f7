#!/usr/bin/env bash
# The paper's setting on one node of 8 GPUs, disaggregated: vLLM on 4 GPUs (2 replicas of TP 2), the FSDP trainer on
# the other 4 (data parallel 4); K=8, U=2, F_w=2, R=$R (32 | 64 | 96), cgp_fgd. Extra key=value overrides win.
#   R=64 bash recipe/rolloutpipe/run/run_qwen3_1.7b_paper.sh
set -euo pipefail
source "$(dirname "$0")/common_qwen3_1.7b.sh"
"$PYTHON" -m recipe.rolloutpipe.main "${PAPER_SETTING[@]}" \
    rolloutpipe.layout=disaggregated rolloutpipe.mode=cgp_fgd \
    trainer.nnodes=1 trainer.n_gpus_per_node=4 \
    actor_rollout_ref.rollout.nnodes=1 actor_rollout_ref.rollout.n_gpus_per_node=4 \
    actor_rollout_ref.rollout.tensor_model_parallel_size=2 \
    trainer.experiment_name="qwen3_1.7b_R${R}_cgp_fgd" "$@"

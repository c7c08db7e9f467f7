#!/usr/bin/env bash
# The paper's setting on two nodes of 8 GPUs (a Ray cluster: `ray start --head` on one node, `ray start
# --address=<head>:6379` on the other, then run this on the head with RAY_ADDRESS=auto): the FSDP trainer on 8 GPUs
# (data parallel 8), vLLM on 8 GPUs (4 replicas of TP 2). Extra key=value overrides win.
set -euo pipefail
source "$(dirname "$0")/common_qwen3_1.7b.sh"
"$PYTHON" -m recipe.rolloutpipe.main "${PAPER_SETTING[@]}" \
    rolloutpipe.layout=disaggregated rolloutpipe.mode=cgp_fgd \
    trainer.nnodes=1 trainer.n_gpus_per_node=8 \
    actor_rollout_ref.rollout.nnodes=1 actor_rollout_ref.rollout.n_gpus_per_node=8 \
    actor_rollout_ref.rollout.tensor_model_parallel_size=2 \
    trainer.experiment_name="qwen3_1.7b_R${R}_cgp_fgd_2nodes" "$@"

#!/usr/bin/env bash
# The paper's setting on two nodes of 8 GPUs (a Ray cluster: `ray start --head` on one node, `ray start
# --address=<head>:6379` on the other, then run this on the head with RAY_ADDRESS=auto): the one-node script with the
# FSDP trainer on 8 GPUs (data parallel 8) and vLLM on 8 GPUs (4 replicas of TP 2). Extra key=value overrides win.
set -euo pipefail
R=${R:-32}
R=$R bash "$(dirname "$0")/run_qwen3_1.7b_paper.sh" \
    trainer.n_gpus_per_node=8 actor_rollout_ref.rollout.n_gpus_per_node=8 \
    trainer.experiment_name="qwen3_1.7b_R${R}_cgp_fgd_2nodes" "$@"

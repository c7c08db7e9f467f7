#!/usr/bin/env bash
# One-GPU smoke run: the embedded default (tiny Qwen3, arithmetic; nothing downloaded) on the GPU platform overlay,
# colocated (hybrid) on one GPU, 5 rounds of cgp_fgd. Extra key=value overrides win.
set -euo pipefail
"${PYTHON:-python3}" -m recipe.rolloutpipe.main platform=gpu rolloutpipe.layout=hybrid rolloutpipe.mode=cgp_fgd \
    trainer.nnodes=1 trainer.n_gpus_per_node=1 trainer.total_training_steps=5 trainer.test_freq=5 \
    trainer.experiment_name=one_gpu_smoke "$@"

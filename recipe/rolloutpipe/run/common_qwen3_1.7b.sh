# Sourced by the Qwen3-1.7B scripts: the paper's setting (../shared notes: arXiv 2606.26997 §6) as verl overrides.
# Data: verl's GSM8K parquet files (python examples/data_preprocess/gsm8k.py in a verl checkout writes
# $HOME/data/gsm8k/{train,test}.parquet), scored by verl's own rule-based reward for data_source openai/gsm8k.
DATA_DIR=${DATA_DIR:-$HOME/data/gsm8k}
MODEL=${MODEL:-Qwen/Qwen3-1.7B}
R=${R:-32}  # prompts per round: the paper runs 32, 64 and 96
PYTHON=${PYTHON:-python3}
PAPER_SETTING=(
    platform=gpu
    data.train_files="$DATA_DIR/train.parquet" data.val_files="$DATA_DIR/test.parquet"
    data.train_batch_size="$R" data.max_prompt_length=512 data.max_response_length=2048
    data.filter_overlong_prompts=true data.truncation=error
    reward.custom_reward_function.path=null
    actor_rollout_ref.model.path="$MODEL"
    actor_rollout_ref.model.enable_gradient_checkpointing=true
    actor_rollout_ref.rollout.n=8                      # K
    actor_rollout_ref.actor.ppo_mini_batch_size=2      # U: B = U*K = 16 samples per optimizer step
    rolloutpipe.frontier_width=2                       # F_w
    actor_rollout_ref.actor.optim.lr=1e-6
    actor_rollout_ref.actor.use_dynamic_bsz=true actor_rollout_ref.actor.ppo_max_token_len_per_gpu=20480
    actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=true
    actor_rollout_ref.rollout.max_num_batched_tokens=8192
    trainer.logger='[console]' trainer.project_name=rolloutpipe trainer.test_freq=10 trainer.save_freq=-1
    trainer.total_training_steps="${ROUNDS:-100}"
)

"""The bench's ``stock`` mode: one training step of verl's own serial disaggregated trainer on the bench's workers.

verl's ``SeparateRayPPOTrainer.fit_step`` runs a step as a fixed chain of ``_fit_*`` hooks: generate the whole
batch, rewards, old log-probs, advantages, actor update, weights to the rollout side. This module calls verl's own
hooks in that order, on the same trainer object, workers, pools, prompts and start state as the pipelined modes
(the bench's trainer is a subclass of verl's ``OneStepOffRayTrainer``, whose async ``fit_step`` would run one step
off-policy: the serial hooks are taken from ``SeparateRayPPOTrainer`` itself). Nothing of the step is the
project's code; the only addition is the workload's column telling the bench agent loop which of the K samples a
row is (verl repeats each prompt K times, interleaved), so the prescribed response lengths are the same as in the
other modes.

Timings use the same clock and the same window as the pipeline's timeline (architecture.md §4): rollout-to-train-end
from the start of generation to the end of the actor update; the publish apart.
"""

from __future__ import annotations

import time
import uuid
from contextlib import contextmanager
from typing import Any

import numpy as np

from ..pipeline import PREFIX
from ..rollout_stream import SAMPLE_COLUMN


@contextmanager
def _sample_index_column(trainer, group_size: int):
    """verl's ``generate_sequences`` with each row's index within its group added (rows are interleaved repeats)."""
    manager = trainer.async_rollout_manager
    generate = manager.generate_sequences

    def with_sample_index(batch):
        batch.non_tensor_batch[SAMPLE_COLUMN] = np.arange(len(batch), dtype=np.int64) % group_size
        return generate(batch)

    manager.generate_sequences = with_sample_index
    try:
        yield
    finally:
        del manager.generate_sequences  # the class's method again


def verl_round(trainer, batch) -> dict[str, Any]:
    """One step of verl's serial trainer on ``batch`` (R prompts); returns the round's metrics (the pipeline's
    names where they mean the same thing), verl's own ``timing_raw`` and the trained rows."""
    from verl.experimental.separation.ray_trainer import SeparateRayPPOTrainer as Verl

    k = int(trainer.config.actor_rollout_ref.rollout.n)
    trainer.metrics = {"training/global_step": trainer.global_steps, "training/epoch": 0}
    trainer.timing_raw, trainer.reward_tensor, trainer.reward_extra_infos_dict = {}, None, {}
    # what verl's _fit_get_batch does to a dataloader batch
    batch.meta_info["temperature"] = trainer.config.actor_rollout_ref.rollout.temperature
    batch.non_tensor_batch["uid"] = np.array([str(uuid.uuid4()) for _ in range(len(batch))], dtype=object)

    t = {"start": time.monotonic()}
    with _sample_index_column(trainer, k):
        rows = Verl._fit_generate(trainer, batch)
    t["generated"] = time.monotonic()
    rows = Verl._fit_compute_reward(trainer, rows)
    t["rewarded"] = time.monotonic()
    trainer.actor_rollout_wg.take_payload()  # from here: verl's calls to the trainer pool and their bytes, counted
    rows = Verl._fit_compute_log_prob(trainer, rows)  # as the pipelined modes count theirs
    t["old_log_prob"] = time.monotonic()
    rows = Verl._fit_compute_advantage(trainer, rows)
    t["advantages"] = time.monotonic()
    rows = Verl._fit_update_actor(trainer, rows)
    payload = trainer.actor_rollout_wg.take_payload()
    t["trained"] = time.monotonic()
    Verl._fit_update_weights(trainer)
    t["published"] = time.monotonic()

    window = t["trained"] - t["start"]
    rollout = t["generated"] - t["start"]
    busy = (t["old_log_prob"] - t["rewarded"]) + (t["trained"] - t["advantages"])  # the trainer pool's calls
    metrics = {
        "rollout_to_train_end_s": window,
        "rollout_s": rollout,
        "trainer_busy_s": busy,
        "trainer_wait_s": window - busy,
        "trainer_wait_ratio": (window - busy) / window,
        "trainer_wait_before_first_s": t["rewarded"] - t["start"],
        "first_dispatch_s": rollout,  # every group reaches the trainer when the whole batch is generated
        "old_log_prob_s": t["old_log_prob"] - t["rewarded"],
        "update_actor_s": t["trained"] - t["advantages"],
        # the critical path's parts as the pipelined modes' (timeline.wait_breakdown): the trainer waits for the whole
        # generation, then for the driver's rewards and advantages
        "wait_no_group_yet_s": rollout,
        "wait_groups_generating_s": 0.0,
        "wait_after_rollout_s": (t["rewarded"] - t["generated"]) + (t["advantages"] - t["old_log_prob"]),
        "serial_estimate_s": rollout + busy,
        "publish_s": t["published"] - t["trained"],
        "groups_trained": float(len(rows) // k),
        "trainer_calls": 2.0,  # compute_log_prob (π_old), update_actor
        "trainer_payload_bytes": float(payload.bytes),
        "trainer_payload_calls": float(payload.calls),
    }
    out = {PREFIX + key: float(v) for key, v in metrics.items()}
    out["critic/score/mean"] = float(trainer.reward_tensor.sum(-1).mean())
    return {"metrics": out, "verl_timing_s": {key: float(v) for key, v in trainer.timing_raw.items()}, "rows": rows}

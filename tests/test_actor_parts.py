"""The streaming actor's torch-only parts (rolloutpipe_workers/actor_parts.py) and the one-GPU check that runs them
on a GPU machine (recipe/rolloutpipe/run/one_gpu_check.py), here on CPU: FSDP2 on gloo, bf16 and fp32 compute."""

from __future__ import annotations

import pytest
import torch

from recipe.rolloutpipe.run import one_gpu_check
from rolloutpipe_workers.actor_parts import ParamSnapshot, TokenSumGradients, fitting_micro_batch


def test_one_gpu_check_passes_on_cpu():
    result = one_gpu_check.run("cpu", "tiny", ["bf16", "fp32"])
    assert result["ok"], result
    fp32 = next(g for g in result["gradients"] if g["dtype"] == "fp32")
    assert fp32["relative_grad_diff"] < 1e-5 and fp32["tokens"] > 0
    (snap,) = result["snapshot"]
    assert snap["placement"] == "host" and snap["max_abs_logprob_diff"] == 0.0 and snap["weights_moved_by_step"] > 0
    assert snap["bytes"] == 4 * result["parameters"]  # fp32 master weights
    assert result["publish"]["bf16_bytes"] == 2 * result["parameters"]


class _SummedCallMeans(TokenSumGradients):
    """What plain gradient accumulation over verl's calls gives: the sum of each call's token-mean gradient."""

    def call(self, params, call_tokens):
        from contextlib import nullcontext

        self.tokens += float(call_tokens)
        return nullcontext(float(call_tokens))

    def close(self, params):
        tokens, self.tokens = self.tokens, None
        return tokens


def test_the_check_catches_a_step_normalised_per_call(monkeypatch):
    # the gradient check can fail: without the token-sum rescaling the streamed step is off by far more than bf16
    monkeypatch.setattr(one_gpu_check, "TokenSumGradients", _SummedCallMeans)
    result = one_gpu_check.run("cpu", "tiny", ["fp32"])
    (grads,) = result["gradients"]
    assert not grads["ok"] and grads["relative_grad_diff"] > 0.1 and not result["ok"]


def test_snapshot_swaps_in_and_back_bit_for_bit():
    model = torch.nn.Linear(4, 3)
    params = dict(model.named_parameters())
    v = {n: p.detach().clone() for n, p in params.items()}
    snap = ParamSnapshot(params, "auto")
    assert snap.placement == "host" and snap.nbytes == sum(p.numel() * 4 for p in params.values())
    with torch.no_grad():
        for p in params.values():
            p.add_(1.0)
        model.weight.grad = torch.ones_like(model.weight)
    moved = {n: p.detach().clone() for n, p in params.items()}
    with snap.swapped_in(params):
        assert all(torch.equal(params[n], v[n]) for n in params)
    assert all(torch.equal(params[n], moved[n]) for n in params)
    assert torch.equal(model.weight.grad, torch.ones_like(model.weight))  # pending gradients untouched
    with pytest.raises(ValueError, match="snapshot placement 'gpu'"):
        ParamSnapshot(params, "gpu")


def test_token_sum_gradients_refuse_out_of_order_use():
    step = TokenSumGradients(token_mean=True)
    with pytest.raises(RuntimeError, match="outside an open step"), step.call([], 3.0):
        pass
    step.start()
    with pytest.raises(RuntimeError, match="already open"):
        step.start()
    assert step.close([]) == 0.0 and not step.open


@pytest.mark.parametrize("rows,configured,dynamic,expected", [
    (8, 4, False, None),   # the configured micro-batch divides the call
    (8, 6, False, 2),      # one group of 8 with micro-batch 6: the largest divisor both share
    (5, 8, False, 1),
    (5, 8, True, None),    # dynamic batch sizes: verl packs by tokens, any row count goes
    (5, None, False, None),
])
def test_fitting_micro_batch(rows, configured, dynamic, expected):
    assert fitting_micro_batch(rows, configured, dynamic) == expected

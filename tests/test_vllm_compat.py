"""verl 0.9.1 against vLLM 0.31 (rolloutpipe_workers/vllm_compat.py): the LoRA loader's mapper name, and a weight
publication whose engine side fails ending with an error instead of a hang -- verl's own sender and receiver, the
receiver in a Ray task as in the engine."""

from __future__ import annotations

import asyncio
import threading

import pytest
import ray
import torch

from rolloutpipe_workers import vllm_compat


def test_verl_lora_loader_finds_the_mapper_it_calls():
    from vllm.model_executor.models.utils import WeightsMapper

    vllm_compat.alias_lora_rename_mapper()
    mapper = WeightsMapper(orig_to_new_prefix={"model.": "language_model.model."},
                           orig_to_new_stacked={"q_proj": "qkv_proj"} if "orig_to_new_stacked" in
                           WeightsMapper.__dataclass_fields__ else {})
    # verl's _load_adapter (verl/utils/vllm/utils.py) calls this name; vLLM 0.31 names it get_rename_mapper
    unstacked = mapper.get_unstacked_mapper()
    assert unstacked == mapper.get_rename_mapper()
    assert unstacked.map_name("model.layers.0.self_attn.q_proj.lora_A.weight") == \
        "language_model.model.layers.0.self_attn.q_proj.lora_A.weight"  # renamed, not stacked into qkv_proj


@ray.remote(num_cpus=0)
def _receive(handle: str, fail: bool) -> list[tuple[str, list[float]]]:
    """verl's receiver as the engine runs it; ``fail``: the engine cannot load what it received (a bad adapter)."""
    from verl.workers.rollout.vllm_rollout.bucketed_weight_transfer import BucketedWeightReceiver

    got: list[tuple[str, list[float]]] = []

    def on_bucket(weights, is_last):
        if fail:
            raise AttributeError("'WeightsMapper' object has no attribute 'get_unstacked_mapper'")
        got.extend((name, t.tolist()) for name, t in weights)

    BucketedWeightReceiver(zmq_handle=handle, device=torch.device("cpu"), use_shm=True).receive_weights(
        on_bucket_received=on_bucket)
    return got


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def _publish(handle: str, receiver) -> None:
    from verl.workers.rollout.vllm_rollout.bucketed_weight_transfer import BucketedWeightSender

    vllm_compat.guard_weight_publication()
    vllm_compat._RECEIVER.set(receiver)  # what ServerAdapter._execute_method records for the sender, patched
    weights = [(f"w{i}", torch.full((1024,), float(i))) for i in range(3)]  # 3 buckets of 4 KiB (1 MB each)
    sender = BucketedWeightSender(zmq_handle=handle, bucket_size_mb=1, use_shm=True)
    asyncio.run(sender.async_send_weights(iter(weights)))


@pytest.mark.parametrize("fail", [False, True], ids=["receiver-takes-the-weights", "receiver-fails"])
def test_publication_ends_when_the_engine_side_fails(local_ray, tmp_path, fail):
    handle = f"ipc://{tmp_path}/weights.sock"
    receiver = _receive.remote(handle, fail)
    if not fail:  # control: the guard does not get in the way of a publication that works
        _publish(handle, receiver)
        got = ray.get(receiver, timeout=60)
        assert [n for n, _ in got] == ["w0", "w1", "w2"] and got[2][1][:2] == [2.0, 2.0]
        return
    # unguarded, verl's sender waits forever on its blocking recv() for an answer that never comes: a thread, so
    # that a broken guard fails this test instead of hanging the suite
    raised: list[BaseException] = []

    def publish() -> None:
        try:
            _publish(handle, receiver)
        except BaseException as e:  # handed to the test thread
            raised.append(e)

    sender = threading.Thread(target=publish, daemon=True)
    sender.start()
    sender.join(timeout=60)
    assert not sender.is_alive(), "the sender still waits for a receiver that failed"
    [e] = raised
    assert isinstance(e, vllm_compat.WeightPublicationError), repr(e)
    # the message leads with the receiver's root cause, not the error its cleanup raised while handling it
    assert str(e).startswith("the rollout engine stopped taking the published weights: AttributeError: "
                                   "'WeightsMapper' object has no attribute 'get_unstacked_mapper' (then BufferError")
    assert isinstance(e.__cause__, ray.exceptions.RayTaskError)

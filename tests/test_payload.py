"""The trainer pool's payload per call (recipe/rolloutpipe/payload.py): bytes counted from verl's own containers,
and only the worker group's data calls metered."""

from __future__ import annotations

import pickle

import numpy as np
import torch
from tensordict import TensorDict
from verl import DataProto

from recipe.rolloutpipe.actor_group import StreamingActorGroup
from recipe.rolloutpipe.payload import payload_bytes


def test_bytes_of_verl_containers():
    ids = torch.zeros(4, 6, dtype=torch.int64)
    uid = np.array(list("abcd"), dtype=object)
    rows = DataProto.from_single_dict({"input_ids": ids, "uid": uid}, meta_info={"temperature": 1.0})
    strings, meta = len(pickle.dumps(list("abcd"))), len(pickle.dumps(1.0))
    assert payload_bytes(rows) == 4 * 6 * 8 + strings + meta
    # verl's call form: a TensorDict with its non-tensor columns as data -- the same tensors and strings
    assert payload_bytes(rows.to_tensordict()) == 4 * 6 * 8 + strings + meta
    # verl's unpadded rows: a jagged tensor is its values and offsets (3 + 5 int64 values, 3 offsets), not padded
    jagged = torch.nested.nested_tensor([torch.arange(3), torch.arange(5)], layout=torch.jagged)
    td = TensorDict({"ids": jagged, "adv": torch.ones(2), "sub": TensorDict({"x": torch.ones(2, 3)}, batch_size=[2])},
                    batch_size=[2])
    assert payload_bytes(td) == 8 * 8 + 3 * 8 + 2 * 4 + 6 * 4


class _WorkerGroup:
    world_size = 2

    def __init__(self) -> None:
        self.seen: list[str] = []

    def update_actor_in_round(self, batch):  # a data call (the streaming worker's variant of update_actor)
        self.seen.append("update")
        return "out"

    def begin_round(self, snapshot: bool):  # not a data call
        self.seen.append("begin")
        return [None]


def test_actor_group_counts_data_calls_and_answers_routed_methods():
    """The trainer's one worker-group wrapper (actor_group.py): data calls counted with their bytes, anything else
    passed through; a routed method answered by another for a block only, also when the block fails."""
    live = _WorkerGroup()
    wg = StreamingActorGroup(live)
    batch = TensorDict({"x": torch.ones(3, 2)}, batch_size=[3])
    assert wg.world_size == 2 and wg.worker_group is live
    wg.begin_round(snapshot=True)
    assert wg.update_actor_in_round(batch) == "out"
    wg.update_actor_in_round(batch=batch)
    assert live.seen == ["begin", "update", "update"]
    payload = wg.take_payload()
    assert (payload.calls, payload.bytes) == (2, 2 * 3 * 2 * 4)
    assert wg.take_payload().calls == 0  # counted once

    with wg.answering("update_actor", "update_actor_in_round"):  # verl's name, the streaming worker's variant
        assert wg.update_actor(batch) == "out"
    with wg.answering("update_actor", lambda b: "mine"):  # a caller's function (it reaches workers through wg)
        assert wg.update_actor(batch) == "mine"
    try:
        with wg.answering("update_actor", "update_actor_in_round"):
            raise RuntimeError
    except RuntimeError:
        pass
    assert not hasattr(wg, "update_actor")  # the route ended with the block
    assert wg.take_payload().calls == 1  # the routed data call, counted under the method it reached

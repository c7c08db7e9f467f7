"""What the driver sends the trainer pool per worker call (measured per call: fewer bytes per round is a target).

The trainer's actor worker group (``actor_group.StreamingActorGroup``) counts each call of a data method (π_old, the
update and its streaming variants, reference log-probs where the actor computes them; a separate reference worker
group is not metered) with the bytes of its arguments -- the tensors' elements and the arrays' items that Ray
serializes to move them. The pipelined modes report their round's calls, the bench's ``stock`` mode verl's own two,
so both report the same figure. Counting reads the tensors' sizes (no copy) and pickles only the non-tensor columns
and meta info.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from typing import Any

# the actor worker group's methods that move training data (the streaming worker's variants start the same way)
DATA_METHODS = ("compute_log_prob", "compute_ref_log_prob", "update_actor", "accumulate")


def payload_bytes(obj: Any) -> int:
    """Bytes of the data in ``obj``: a tensor's elements (a nested/jagged tensor's values and offsets), a numeric
    array's buffer, an object array's items pickled; verl's ``DataProto`` (its tensors, its non-tensor arrays, its
    meta info), a ``TensorDict`` or a dict summed over its values; anything else (a scalar, a list of strings)
    pickled."""
    import numpy as np
    import torch

    if obj is None:
        return 0
    if isinstance(obj, torch.Tensor):
        if obj.is_nested:
            return payload_bytes(obj.values()) + payload_bytes(obj.offsets())
        return obj.numel() * obj.element_size()
    if isinstance(obj, np.ndarray):
        return len(pickle.dumps(obj.tolist())) if obj.dtype == object else int(obj.nbytes)
    if hasattr(obj, "non_tensor_batch"):  # verl's DataProto
        return payload_bytes(obj.batch) + payload_bytes(obj.non_tensor_batch) + payload_bytes(obj.meta_info)
    if hasattr(obj, "keys") and hasattr(obj, "__getitem__"):  # TensorDict (its non-tensor leaves as plain data), dict
        return sum(payload_bytes(obj[key]) for key in obj.keys())
    if isinstance(obj, list | tuple) and any(isinstance(x, torch.Tensor | np.ndarray | dict) for x in obj):
        return sum(payload_bytes(x) for x in obj)
    try:
        return len(pickle.dumps(list(obj) if isinstance(obj, list) else obj))  # tensordict's LinkedList: a list
    except Exception:  # not picklable here (a handle): Ray moves it by reference
        return 0


@dataclass
class Payload:
    """Data calls to the trainer pool and the bytes they carried."""

    calls: int = 0
    bytes: int = 0

    def add(self, other: Payload) -> None:
        self.calls += other.calls
        self.bytes += other.bytes

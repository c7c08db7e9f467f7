"""StreamingActorGroup: the actor worker group as the RolloutPipe trainer holds it, installed once after the workers
start (``RolloutPipeTrainer.init_workers``).

Two things verl's trainer code cannot be told through its arguments:
- **routing**: verl's ``_compute_old_log_prob`` / ``_update_actor`` call ``compute_log_prob`` / ``update_actor`` on
  the group; a streamed round needs the streaming worker's variants (π_old from the live weights or the round-start
  snapshot, an update that takes one of several steps, an accumulate). ``answering(method, by)`` makes the group
  answer ``method`` with ``by`` for a block, so verl's code runs unchanged.
- **metering**: each data call (``payload.DATA_METHODS``) is counted with the bytes of its arguments; ``take_payload``
  returns what was counted since the last take (a round's, or verl's own step's in the bench).
Everything else passes through to verl's worker group.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from .payload import DATA_METHODS, Payload, payload_bytes


class StreamingActorGroup:
    def __init__(self, wg: Any) -> None:
        self._wg = wg
        self._routes: dict[str, str | Callable] = {}
        self._payload = Payload()

    @property
    def worker_group(self) -> Any:
        """verl's worker group behind this one."""
        return self._wg

    def __getattr__(self, name: str) -> Any:  # only for names this object does not hold itself
        route = self._routes.get(name)
        if route is not None:  # a caller's function reaches the workers through this group, counted there; a
            return route if callable(route) else getattr(self, route)  # method name: as that method is reached
        attr = getattr(self._wg, name)
        if not (callable(attr) and name.startswith(DATA_METHODS)):
            return attr

        def counted(*args: Any, **kwargs: Any) -> Any:
            self._payload.calls += 1
            self._payload.bytes += sum(payload_bytes(a) for a in (*args, *kwargs.values()))
            return attr(*args, **kwargs)

        return counted

    @contextmanager
    def answering(self, method: str, by: str | Callable) -> Iterator[None]:
        """Inside the block, ``group.<method>`` is ``group.<by>`` (a method name) or ``by`` itself (a function)."""
        before = self._routes.get(method)
        self._routes[method] = by
        try:
            yield
        finally:
            if before is None:
                self._routes.pop(method)
            else:
                self._routes[method] = before

    def take_payload(self) -> Payload:
        """The data calls counted since the last take, and their bytes; the count starts again."""
        taken, self._payload = self._payload, Payload()
        return taken

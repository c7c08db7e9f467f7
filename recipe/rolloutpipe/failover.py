"""Rollout replicas that die mid-round: find them, take them out of routing and publication, keep the round going.

verl's ``LLMServerManager`` owns the standalone replicas and the global load balancer every agent-loop worker routes
through; verl's ``CheckpointEngineManager`` publishes to the same replica list. A dead replica's server actor no
longer answers Ray calls. Dropping it from the load balancer (verl's ``remove_servers``) and from that list is all it
takes for re-sent requests to reach the survivors and for the next publish to skip it.
"""

from __future__ import annotations

import ray

from rolloutpipe_workers.vllm_compat import WeightPublicationError


class NoRolloutReplicaLeftError(RuntimeError):
    """Every rollout replica died: the round cannot complete."""


def find_cause(e: BaseException, kind: type | tuple[type, ...]) -> BaseException | None:
    """The exception of type ``kind`` behind ``e`` (``e`` itself, a cause or context, or the cause inside a failed
    Ray task), if any."""
    seen: set[int] = set()
    stack: list[BaseException | None] = [e]
    while stack:
        x = stack.pop()
        if x is None or id(x) in seen:
            continue
        seen.add(id(x))
        if isinstance(x, kind):
            return x
        stack += [x.__cause__, x.__context__, getattr(x, "cause", None)]
    return None


def dead_actor_error(e: BaseException) -> BaseException | None:
    """The Ray "actor died" error behind ``e``, the no-replica-left error, or an engine that stopped taking published
    weights (``vllm_compat.WeightPublicationError``), if any."""
    return find_cause(e, (NoRolloutReplicaLeftError, WeightPublicationError, ray.exceptions.RayActorError))


class ReplicaFailover:
    """The standalone rollout replicas of a run (verl's ``LLMServerManager``) and which of them died."""

    def __init__(self, llm_server_manager, probe_timeout_s: float = 30.0) -> None:
        self._servers = llm_server_manager
        self.probe_timeout_s = probe_timeout_s
        self.started = len(llm_server_manager.rollout_replicas)
        self.dropped: list[str] = []  # server addresses, in the order they were found dead

    @property
    def alive(self) -> int:
        return len(self._servers.rollout_replicas)

    def drop_dead(self) -> list[str]:
        """Probe every replica's server actor; drop the dead ones from the load balancer and the replica list (the
        checkpoint engine's list is the same object). Returns the addresses dropped by this call. A replica that
        is only slow to answer (busy past ``probe_timeout_s``) is kept."""
        replicas = self._servers.rollout_replicas
        probes = [r._server_handle.__ray_ready__.remote() for r in replicas]
        dead = []
        for replica, probe in zip(replicas, probes, strict=True):
            try:
                ray.get(probe, timeout=self.probe_timeout_s)
            except ray.exceptions.RayActorError:
                dead.append(replica)
            except ray.exceptions.GetTimeoutError:
                pass
        if not dead:
            return []
        addresses = [r._server_address for r in dead]
        ray.get(self._servers.global_load_balancer.remove_servers.remote(addresses))
        keep = [r for r in replicas if r not in dead]
        replicas[:] = keep  # in place: CheckpointEngineManager.replicas is this list
        self._servers.server_handles[:] = [r._server_handle for r in keep]
        self._servers.server_addresses[:] = [r._server_address for r in keep]
        self.dropped += addresses
        return addresses

"""Emulated disaggregation on one CPU box (architecture.md §5): the rollout pool on some cores, the trainer pool on
others.

Processes are found by the titles Ray and vLLM give them and pinned thread by thread (``sched_setaffinity`` on
every task of the process: threads created later inherit it). Compute thread counts are set through the
environment before the workers start (``pool_env``): vLLM binds its OpenMP threads with its own
``VLLM_CPU_OMP_THREADS_BIND``; torch in the trainer uses ``OMP_NUM_THREADS``. Orchestration (the driver, verl's
task runner that runs the pipeline loop, Ray's daemons) is left unpinned by default, as a GPU cluster's host CPUs
would be, or pinned to one pool's cores (``orchestration_cpus``: on two cores there is no third place for it;
measured, neither pool's core beats the scheduler's split, docs/results.md), and its CPU time is measured by pid
apart from the pools' (``cpu_seconds``, the run's own processes only): the driver, Ray's daemons, kernel threads and
everything else, each on its own line.
"""

from __future__ import annotations

import os
from pathlib import Path

# the cores this process could run on when first imported (before any pinning): "unpinned" for orchestration
HOST_CPUS = frozenset(os.sched_getaffinity(0))

# process title prefixes -> pool
ROLLOUT_TITLES = ("VLLM::", "ray::vLLMHttpServer", "ray::AgentLoopWorker", "ray::GroupStreamingAgentLoopWorker",
                  "ray::GlobalRequestLoadBalancer", "ray::RewardLoopWorker", "ray::CheckpointEngineWorker")
TRAINER_TITLES = ("ray::WorkerDict", "ray::DetachActorWorker", "ray::StreamingDetachActorWorker")


def pool_env(rollout_cpus: list[int], trainer_cpus: list[int]) -> dict[str, str]:
    """Environment for every Ray worker: thread counts that match the pinned cores."""
    return {"VLLM_CPU_OMP_THREADS_BIND": ",".join(map(str, rollout_cpus)),
            "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
            "OMP_NUM_THREADS": str(len(trainer_cpus))}


def process_title(pid: int) -> str:
    """``pid``'s command line as one string (its title for Ray's and vLLM's workers); "" once it has gone."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def _pin_all_threads(pid: int, cpus: set[int]) -> int:
    n = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            os.sched_setaffinity(int(task.name), cpus)
            n += 1
        except OSError:  # the thread exited meanwhile
            pass
    return n


def _children() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            stat = (proc / "stat").read_text()
        except OSError:  # exited meanwhile
            continue
        children.setdefault(int(stat[stat.rindex(")") + 2:].split()[1]), []).append(int(proc.name))
    return children


def descendants(root: int, children: dict[int, list[int]] | None = None) -> set[int]:
    """``root`` and every live process below it, by parent pid (``/proc``; or the ``children`` map given)."""
    children = _children() if children is None else children
    found, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo += children.get(pid, [])
    return found


def this_ray_node(children: dict[int, list[int]] | None = None) -> set[int] | None:
    """The processes of the Ray node this process runs on (its raylet and everything below it: Ray's workers and the
    vLLM processes they start), or None outside a Ray worker. Another Ray instance on the same machine (a second
    run, a test running beside this one) is not this node's."""
    raylet = os.environ.get("RAY_RAYLET_PID")
    return descendants(int(raylet), children) if raylet else None


def _pool_of(title: str) -> str | None:
    return ("rollout" if title.startswith(ROLLOUT_TITLES) else
            "trainer" if title.startswith(TRAINER_TITLES) else None)


# the project's own processes outside the two pools: the bench / training driver and the task runner (the pipeline
# loop and the rollout thread run there)
DRIVER_TITLES = ("ray::BenchTaskRunner", "ray::RolloutPipeTaskRunner", "ray::VerifyTaskRunner", "ray::TaskRunner",
                 "ray::RolloutCallsRunner")
CPU_CATEGORIES = ("rollout", "trainer", "driver", "ray_daemons", "kernel", "other")


def cpu_category(cmdline: str) -> str:
    """Whose a process is, by its command line: one of ``CPU_CATEGORIES``. Kernel threads have no command line;
    Ray's daemons (raylet, GCS, dashboard and its agents, log monitor, idle workers) run from Ray's package or
    carry a ``ray::`` title that is not one of the project's."""
    pool = _pool_of(cmdline)
    if pool is not None:
        return pool
    if not cmdline:
        return "kernel"
    if cmdline.startswith(DRIVER_TITLES) or "recipe.rolloutpipe" in cmdline:
        return "driver"
    if cmdline.startswith("ray::") or "/site-packages/ray/" in cmdline or "ray.dashboard" in cmdline:
        return "ray_daemons"
    return "other"


def cpu_seconds(scope: set[int] | None = None) -> dict[tuple[int, int], tuple[str, float]]:
    """CPU seconds used so far by each live process (threads included): ``{(pid, start tick): (key, seconds)}``, key
    ``category:name`` (category: one of ``CPU_CATEGORIES``). ``scope``: only those pids, plus the kernel's threads
    (they serve every process); None: every process on the machine. ``cpu_used`` turns two of these into where the
    time between them went."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[tuple[int, int], tuple[str, float]] = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        pid = int(proc.name)
        try:
            stat = (proc / "stat").read_text()
        except OSError:
            continue
        cmdline = process_title(pid)
        if scope is not None and cmdline and pid not in scope:
            continue  # another run's process (a test beside this one): its CPU is not this run's
        comm = stat[stat.index("(") + 1: stat.rindex(")")]
        name = (cmdline.split(" ")[0] if cmdline.startswith(("ray::", "VLLM::")) else comm).split(".")[0]
        name = name.split("/")[0] if not cmdline else name  # kworker/u8:2-events -> kworker
        fields = stat[stat.rindex(")") + 2:].split()
        # the start tick tells a reused pid from the process that had it
        out[(pid, int(fields[19]))] = (f"{cpu_category(cmdline)}:{name}", (int(fields[11]) + int(fields[12])) / tick)
    return out


def cpu_used(before: dict[tuple[int, int], tuple[str, float]], after: dict[tuple[int, int], tuple[str, float]],
             min_s: float = 0.01) -> dict[str, float]:
    """CPU seconds per key between two ``cpu_seconds`` readings, process by process, under the key a process has at
    the second (a Ray worker that took an actor's title in between): one that started in between counts whole, one
    that exited in between is missed (the sums are lower bounds), and an exit never makes a key's sum go down. Keys
    under ``min_s`` are left out."""
    used: dict[str, float] = {}
    for ident, (key, seconds) in after.items():
        used[key] = used.get(key, 0.0) + seconds - before.get(ident, ("", 0.0))[1]
    return {k: round(v, 3) for k, v in sorted(used.items(), key=lambda kv: -kv[1]) if v >= min_s}


def this_run(children: dict[int, list[int]] | None = None) -> set[int] | None:
    """This Ray node's processes plus, when the node was started by a RolloutPipe driver (``ray.init`` in the bench's
    or the trainer's main process), that driver and what it started (the GCS, the dashboard); None outside Ray."""
    children = _children() if children is None else children
    node = this_ray_node(children)
    if node is None:
        return None
    raylet = int(os.environ["RAY_RAYLET_PID"])
    try:
        stat = Path(f"/proc/{raylet}/stat").read_text()
        parent = int(stat[stat.rindex(")") + 2:].split()[1])
    except OSError:
        return node
    return node | descendants(parent, children) if "recipe.rolloutpipe" in process_title(parent) else node


def pin_pools(rollout_cpus: list[int], trainer_cpus: list[int],
              orchestration_cpus: list[int] | None = None) -> dict[str, list[str]]:
    """Pin every rollout-pool and trainer-pool process of this Ray node (of this machine outside Ray); inside Ray
    also the run's orchestration (driver, task runner, Ray's daemons) to ``orchestration_cpus``, or back to every
    core of the host when None. Returns ``{pool: [title (pid)]}`` (``orchestration``: those pinned, when pinned)."""
    pinned: dict[str, list[str]] = {"rollout": [], "trainer": []}
    children = _children()  # one look at /proc's process tree for the whole call
    scope = this_run(children)
    orchestration = set(HOST_CPUS) if orchestration_cpus is None else set(orchestration_cpus)
    if orchestration_cpus is not None:
        pinned["orchestration"] = []
    titles = {int(proc.name): process_title(int(proc.name)) for proc in Path("/proc").iterdir()
              if proc.name.isdigit() and (scope is None or int(proc.name) in scope)}
    # a pool process's own helpers (untitled children) stay with the affinity they inherited from it, as they always
    # did: they are the pool's, not orchestration
    in_pools = set().union(*(descendants(pid, children) for pid, t in titles.items() if _pool_of(t)))
    for pid, title in titles.items():
        pool = _pool_of(title)
        if pool is None:
            # never the machine's other processes (outside Ray); kernel threads have no title
            if scope is None or not title or pid in in_pools:
                continue
            try:
                _pin_all_threads(pid, orchestration)
            except OSError:
                continue
            if orchestration_cpus is not None:
                pinned["orchestration"].append(f"{title.split()[0]} ({pid})")
            continue
        cpus = set(rollout_cpus if pool == "rollout" else trainer_cpus)
        try:
            _pin_all_threads(pid, cpus)
        except OSError:
            continue
        pinned[pool].append(f"{title.split()[0]} ({pid})")
    if not pinned["rollout"] or not pinned["trainer"]:
        raise RuntimeError(f"rolloutpipe bench: could not find both pools to pin: {pinned}")
    return pinned

"""Ray's start-up, bounded: ``ray.init`` under a machine-wide lock and a deadline; and its stop, complete.

Why: once in CI, two local Ray instances started 2 s apart on 2 cores (the suite runs two real-stack tests at a time).
One driver registered with its raylet, its GCS stalled for 69 s, and ``ray.init`` never returned: the run sat silent
until the test's 15-minute timeout. The lock keeps local start-ups on one machine apart; the deadline turns a hang
into one restart of the same command (the hung instance's processes killed first) and, if that hangs too, one clear
error. Nothing has run when the deadline fires (no worker, no round), so a restart loses nothing.

The stop: after ``ray.shutdown()`` of a local instance, a worker process was once left running with no parent (an
agent-loop worker, its main thread blocked in its exit, 800 MB resident, minutes after the run ended: seen 1 run in
3 here). ``stop_local_instance`` waits for every process the instance's raylet had started and stops those that
outlive the shutdown (SIGTERM, then SIGKILL), so a finished run leaves nothing behind.
"""

from __future__ import annotations

import fcntl
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .logs import get_logger

logger = get_logger(__name__)
EXIT_RAY_START_HUNG = 75  # EX_TEMPFAIL: nothing ran; the same command can be run again as is
ATTEMPT_ENV = "ROLLOUTPIPE_RAY_START_ATTEMPT"
LOCK_PATH = Path(tempfile.gettempdir()) / "rolloutpipe-ray-start.lock"
USER_LOCK_PATH = Path(tempfile.gettempdir()) / f"rolloutpipe-ray-start-{os.getuid()}.lock"  # if LOCK_PATH can't open
_local_started = False  # this process started a local instance (init_ray_bounded(local=True) returned)
_START_CWD = os.getcwd()  # at import, before Hydra may change directory: where a restart runs the command again


def _open_read_only(path: Path) -> int:
    """Read-only: ``flock`` needs no write access, so a lock file another user created serves everyone; an existing
    file is opened without ``O_CREAT``, which ``fs.protected_regular`` refuses on a file another user owns in a sticky
    temp dir."""
    try:
        return os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        fd = os.open(path, os.O_RDONLY | os.O_CREAT, 0o644)
        try:
            os.fchmod(fd, 0o644)  # readable by other users whatever the umask: they can lock it too
        except OSError:  # another user created it in between: its mode is theirs to set
            pass
        return fd


def _open_lock() -> int:
    """A descriptor on ``LOCK_PATH``, or on ``USER_LOCK_PATH`` where that cannot be opened (start-ups are then kept
    apart per user only)."""
    try:
        return _open_read_only(LOCK_PATH)
    except OSError as e:
        logger.warning(f"cannot open Ray's start-up lock {LOCK_PATH} ({e.strerror}): using {USER_LOCK_PATH}, which "
                       "keeps apart only this user's start-ups")
        return _open_read_only(USER_LOCK_PATH)


def _kill_started_instance() -> None:
    """The processes the hung ``ray.init`` started (GCS, raylet, agents); without this a restart would leave them."""
    try:
        import ray

        node = ray._private.worker._global_node
        if node is not None:
            node.kill_all_processes(check_alive=False, allow_graceful=False)
    except Exception as e:  # best effort: the restart or the error below matters more
        logger.warning(f"could not stop the hung Ray instance's processes: {e!r}")


def _on_deadline(timeout_s: float) -> None:
    attempt = int(os.environ.get(ATTEMPT_ENV, "1"))
    _kill_started_instance()
    if attempt == 1:
        logger.warning(f"Ray's start-up did not finish within rolloutpipe.ray_start_timeout_s={timeout_s:g} s "
                       "(ray.init hung; seen under heavy load with another local Ray instance starting): "
                       "starting the same command once more")
        sys.stdout.flush()
        sys.stderr.flush()
        os.chdir(_START_CWD)
        os.execve(sys.executable, sys.orig_argv, {**os.environ, ATTEMPT_ENV: str(attempt + 1)})
    logger.error(f"rolloutpipe: Ray's start-up hung twice (rolloutpipe.ray_start_timeout_s={timeout_s:g} s each). "
                 "Nothing ran. Look for stuck Ray processes (`ray stop --force` stops them) and a loaded machine, then "
                 "run the same command again; raise rolloutpipe.ray_start_timeout_s on a slow machine.")
    sys.stderr.flush()
    os._exit(EXIT_RAY_START_HUNG)


def init_ray_bounded(kwargs: dict[str, Any], timeout_s: float, *, local: bool,
                     init: Callable[..., Any] | None = None) -> None:
    """``ray.init(**kwargs)`` that cannot hang: a ``local`` instance starts only when no other RolloutPipe process on
    this machine is starting one (an advisory lock, released when ``ray.init`` returns or the process ends); if
    ``ray.init`` has not returned ``timeout_s`` seconds after the lock was taken, the command is restarted once, then
    the process exits with ``EXIT_RAY_START_HUNG`` and one error line. ``init``: ``ray.init`` unless a test injects
    the hang."""
    if init is None:
        import ray

        init = ray.init
    with os.fdopen(_open_lock(), "rb") as lock:
        if local:
            fcntl.flock(lock, fcntl.LOCK_EX)  # waits while another local instance starts (seconds)
        timer = threading.Timer(timeout_s, _on_deadline, args=(timeout_s,))
        timer.daemon = True
        timer.start()
        try:
            init(**kwargs)
        finally:
            timer.cancel()
    global _local_started
    _local_started = local


def stop_local_instance(grace_s: float = 2.0) -> None:
    """``ray.shutdown()`` of the local instance this process started, then the instance's worker processes (the
    raylet's descendants: Ray workers, vLLM's engine processes) that are still running ``grace_s`` later get SIGTERM,
    and those still running 3 s after that SIGKILL, with one warning naming them. At most ``grace_s`` + 9 s at the
    end of a run (1 s and the workers' own exit when nothing lingers). A cluster joined through ``RAY_ADDRESS`` is
    left alone."""
    global _local_started
    import psutil
    import ray
    from ray._private import ray_constants

    node = ray._private.worker._global_node
    if not _local_started or node is None:
        return
    _local_started = False
    procs = []
    for info in node.all_processes.get(ray_constants.PROCESS_TYPE_RAYLET, []):
        try:
            procs += psutil.Process(info.process.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            pass
    # what Ray's own exit-time shutdown does first "to make sure that log messages finish printing": the workers'
    # last lines (verl's final step metrics) reach this console through Ray's log monitor, which shutdown stops
    time.sleep(1.0)
    ray.shutdown()
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    if not alive:
        return
    for proc in alive:  # SIGTERM, as Ray stops its workers; a loaded machine can still be tearing them down
        try:
            proc.terminate()
        except psutil.NoSuchProcess:
            pass
    logger.info(f"[rolloutpipe] {len(alive)} Ray process(es) still running {grace_s:g} s after ray.shutdown(): "
                "sent SIGTERM")
    _, stuck = psutil.wait_procs(alive, timeout=3)
    names = []
    for proc in stuck:
        try:
            names.append(f"{proc.name()} (pid {proc.pid})")
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(stuck, timeout=5)  # gone when this returns, not only signalled
    if names:
        logger.warning(f"[rolloutpipe] {len(names)} Ray process(es) outlived ray.shutdown() and SIGTERM: killed "
                       f"{', '.join(names)}")

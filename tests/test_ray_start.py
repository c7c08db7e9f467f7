"""Ray's start-up cannot hang a run (recipe/rolloutpipe/ray_start.py). The hang is injected (a stand-in for
``ray.init`` that never returns): the real one hung once in CI and cannot be made to hang on demand."""

from __future__ import annotations

import fcntl
import logging
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from recipe.rolloutpipe.ray_start import ATTEMPT_ENV, EXIT_RAY_START_HUNG

ROOT = Path(__file__).resolve().parents[1]


def _child(lock: Path, body: str) -> str:
    return textwrap.dedent(f"""
        import os, time
        from pathlib import Path
        from recipe.rolloutpipe import ray_start
        ray_start.LOCK_PATH = Path({str(lock)!r})
        print("attempt", os.environ.get({ATTEMPT_ENV!r}, "1"), flush=True)
    """) + textwrap.dedent(body)


def test_a_hung_start_restarts_the_command_once_then_exits_with_one_clear_error(tmp_path):
    code = _child(tmp_path / "lock", """
        ray_start.init_ray_bounded({}, 1.0, local=True, init=lambda: time.sleep(600))
        print("returned")
    """)
    env = {k: v for k, v in os.environ.items() if k != ATTEMPT_ENV}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)
    assert out.returncode == EXIT_RAY_START_HUNG, out.stdout + out.stderr
    assert [line for line in out.stdout.splitlines() if line.startswith("attempt")] == ["attempt 1", "attempt 2"]
    assert "returned" not in out.stdout
    assert out.stderr.count("starting the same command once more") == 1
    assert out.stderr.count("Ray's start-up hung twice (rolloutpipe.ray_start_timeout_s=1 s each)") == 1


def test_a_local_start_waits_for_another_local_start_on_the_machine(tmp_path):
    lock_path = tmp_path / "lock"
    code = _child(lock_path, """
        import sys
        local = sys.argv[1] == "local"
        ray_start.init_ray_bounded({}, 60.0, local=local, init=lambda: print("init", time.time(), flush=True))
    """)
    start = {kind: [sys.executable, "-c", code, kind] for kind in ("local", "cluster")}
    with open(lock_path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process is starting its local instance
        # joining a running cluster starts nothing: it goes ahead while the lock is held (else this call times out)
        cluster = subprocess.run(start["cluster"], capture_output=True, text=True, timeout=60, cwd=ROOT)
        assert cluster.returncode == 0 and "init" in cluster.stdout, cluster.stdout + cluster.stderr
        local = subprocess.Popen(start["local"], stdout=subprocess.PIPE, text=True, cwd=ROOT)
        assert local.stdout.readline().startswith("attempt")  # running, about to start Ray
        time.sleep(1)
        released = time.time()
    stdout = local.communicate(timeout=60)[0]
    assert local.returncode == 0, stdout
    assert float(stdout.split("init ")[1]) >= released  # held back until the other start-up was done


def test_a_lock_file_that_cannot_be_opened_falls_back_to_a_per_user_lock(tmp_path, monkeypatch):
    from recipe.rolloutpipe import ray_start

    blocker = tmp_path / "not_a_dir"
    blocker.write_text("")  # the shared lock's directory is a file: opening it fails, as a foreign-owned one would
    monkeypatch.setattr(ray_start, "LOCK_PATH", blocker / "lock")
    monkeypatch.setattr(ray_start, "USER_LOCK_PATH", tmp_path / "user.lock")
    warnings: list[logging.LogRecord] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = warnings.append
    held = []

    def init():  # while Ray starts, the per-user lock is held: another descriptor cannot take it
        with open(tmp_path / "user.lock", "rb") as other:
            try:
                fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
                held.append(False)
            except BlockingIOError:
                held.append(True)

    ray_start.logger.addHandler(handler)
    try:
        ray_start.init_ray_bounded({}, 60.0, local=True, init=init)
    finally:
        ray_start.logger.removeHandler(handler)
    assert held == [True]
    assert [f"using {tmp_path / 'user.lock'}" in r.getMessage() for r in warnings] == [True]


def test_a_worker_that_outlives_ray_shutdown_is_stopped_with_one_warning(tmp_path):
    """The stop (``stop_local_instance``). Seen once: an agent-loop worker left running without a parent after the
    run, its main thread blocked in its exit. Injected here the same way: an actor with a thread that never ends (a
    Ray worker exits through Python's shutdown, which waits for it), ignoring SIGTERM too. It is killed and named in
    one warning; nothing of the instance is left running."""
    code = _child(tmp_path / "lock", """
        import signal, threading
        import psutil, ray
        ray_start.init_ray_bounded(dict(address="local", num_cpus=1, include_dashboard=False), 120, local=True)

        @ray.remote
        class Lingering:
            def start(self):
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
                threading.Thread(target=lambda: time.sleep(3600), name="never-ends").start()
                return os.getpid()

        pid = ray.get(Lingering.remote().start.remote())
        ray_start.stop_local_instance(grace_s=2)
        print("alive after stop:", psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie", flush=True)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180, cwd=ROOT)
    log = out.stdout + out.stderr
    assert out.returncode == 0, log[-4000:]
    assert "alive after stop: False" in out.stdout, log[-3000:]
    warnings = [line for line in log.splitlines() if "outlived ray.shutdown() and SIGTERM" in line]
    assert len(warnings) == 1 and "Lingering" in warnings[0], log[-3000:]

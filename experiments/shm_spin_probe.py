"""``python -m experiments.shm_spin_probe [--steps 1000]``: does vLLM's shared-memory spin cost a shared
core? vLLM's engine core and model worker wait for each other's next message by spinning with ``sched_yield`` for
1 s after each read (``SpinCondition.busy_loop_s``); on the rollout core they share the CPU with the HTTP server and
the agent loop. This probe runs vLLM's own ``MessageQueue`` between two processes pinned to one core -- an
"engine" that works 1 ms then sends a step, a "worker" that works 5 ms then answers -- with vLLM's spin and with
readers that sleep until notified (``busy_loop_s = 0``), alone and beside a process burning the same core, and
prints the wall time of the steps and the burner's progress (docs/results.md, "Checked and left").
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import time


def _busy(seconds: float) -> None:
    t = time.perf_counter()
    while time.perf_counter() - t < seconds:
        pass


def _reader(handle, spin_s: float | None):
    from vllm.distributed.device_communicators.shm_broadcast import MessageQueue

    queue = MessageQueue.create_from_handle(handle, 0)
    if spin_s is not None:
        queue._spin_condition.busy_loop_s = spin_s
    return queue


def _worker(cpu: int, request_handle, reply_handles, spin_s: float | None, work_s: float) -> None:
    from vllm.distributed.device_communicators.shm_broadcast import MessageQueue

    os.sched_setaffinity(0, {cpu})
    requests = _reader(request_handle, spin_s)
    replies = MessageQueue(1, 1, max_chunk_bytes=1 << 16, max_chunks=4)
    reply_handles.put(replies.export_handle())
    requests.wait_until_ready()
    replies.wait_until_ready()
    while (step := requests.dequeue()) >= 0:
        _busy(work_s)
        replies.enqueue(step)
    replies.enqueue(step)


def _burner(cpu: int, seconds: float, out) -> None:
    os.sched_setaffinity(0, {cpu})
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(10_000):
            pass
        n += 1
    out.put(n)


def run_pair(cpu: int, steps: int, spin_s: float | None, work_s: float, burn_s: float) -> dict:
    """``steps`` request/reply steps between this process and a worker, both on ``cpu``; with ``burn_s`` a third
    process burns the same core meanwhile. Returns the steps' wall time and the burner's iterations."""
    from vllm.distributed.device_communicators.shm_broadcast import MessageQueue

    ctx = mp.get_context("fork")
    os.sched_setaffinity(0, {cpu})
    requests = MessageQueue(1, 1, max_chunk_bytes=1 << 16, max_chunks=4)
    handles, burned = ctx.Queue(), ctx.Queue()
    worker = ctx.Process(target=_worker, args=(cpu, requests.export_handle(), handles, spin_s, work_s))
    worker.start()
    replies = _reader(handles.get(), spin_s)
    requests.wait_until_ready()
    replies.wait_until_ready()
    burner = ctx.Process(target=_burner, args=(cpu, burn_s, burned)) if burn_s else None
    if burner:
        burner.start()
        time.sleep(0.2)
    t0 = time.perf_counter()
    for step in range(steps):
        _busy(work_s / 5)  # the engine's scheduling before each step
        requests.enqueue(step)
        replies.dequeue()
    wall = time.perf_counter() - t0
    requests.enqueue(-1)
    replies.dequeue()
    worker.join()
    out = {"spin_s": "vLLM's (1)" if spin_s is None else spin_s, "steps": steps, "wall_s": round(wall, 3)}
    if burner:
        out["burner_iterations"] = burned.get()
        burner.join()
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m experiments.shm_spin_probe",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--cpu", type=int, default=min(os.sched_getaffinity(0)))
    args = ap.parse_args(argv)
    from recipe.rolloutpipe.provenance import git_commit

    results = [run_pair(args.cpu, args.steps, spin, 0.005, burn)
               for burn in (0.0, 7.0, 7.0) for spin in (None, 0.0)]
    print(json.dumps({"git_commit": git_commit(), "results": results}, indent=1))


if __name__ == "__main__":
    main()

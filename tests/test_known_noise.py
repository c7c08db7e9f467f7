"""The start-up noise filter (rolloutpipe_workers/known_noise.py): listed lines and warnings go, others stay. On the
real stack, tests/test_rolloutpipe_e2e.py checks that none of them reaches the console of a whole run."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

from rolloutpipe_workers.known_noise import LOG_LINES, WARNINGS, DropKnownNoise, python_warnings_env


def _record(name: str, msg: str) -> logging.LogRecord:
    return logging.LogRecord(name, logging.WARNING, "x.py", 1, msg, None, None)


def test_listed_log_lines_are_dropped_and_others_kept():
    f = DropKnownNoise()
    for n in LOG_LINES:
        assert not f.filter(_record(f"{n.source}.some.module", f"prefix {n.text} suffix")), n
        assert not f.filter(_record("root", n.text)), n  # propagated to verl's root handler
    assert f.filter(_record("vllm.engine", "KV cache is full: preempting requests"))
    assert f.filter(_record("verl.trainer", "checkpoint saved"))


def test_pythonwarnings_env_silences_the_listed_warnings_from_interpreter_start():
    code = "; ".join(f"warnings.warn({n.text + ' (detail)'!r}, {n.source})" for n in WARNINGS if ":" not in n.text)
    code = "import warnings; " + code + "; warnings.warn('a warning nobody listed', UserWarning)"
    env = dict(os.environ, PYTHONWARNINGS=python_warnings_env())
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "a warning nobody listed" in out.stderr
    assert not [n.text for n in WARNINGS if n.text in out.stderr]


def test_vllm_logging_config_is_vllms_default_plus_the_filter():
    from vllm.logger import DEFAULT_LOGGING_CONFIG

    from rolloutpipe_workers.known_noise import vllm_logging_config

    ours = vllm_logging_config(dict(os.environ))
    assert ours["handlers"]["vllm"].pop("filters") == ["rolloutpipe_known_noise"]
    assert set(ours.pop("filters")) == {"rolloutpipe_known_noise"}
    theirs = {**DEFAULT_LOGGING_CONFIG, "formatters": {"vllm": DEFAULT_LOGGING_CONFIG["formatters"]["vllm"]}}
    theirs["handlers"] = {"vllm": {**theirs["handlers"]["vllm"], "formatter": "vllm"}}  # the plain-text form
    assert ours == theirs


def test_a_vllm_process_logs_through_the_filter(tmp_path):
    """vLLM applies the routed config when it configures logging (its ``LoggingConfig``, built from the
    environment at each engine start): a listed line is dropped, another one of the same logger kept."""
    code = ("from rolloutpipe_workers import known_noise; known_noise.route_vllm_logging(); "
            "from vllm.config.logging import LoggingConfig; from vllm.logger import configure_logging, init_logger; "
            "configure_logging(LoggingConfig()); log = init_logger('vllm.platforms.cpu'); "
            "log.warning('Triton is not installed. triton-cpu is expected on x86 CPUs.'); "
            "log.warning('KV cache is full')")
    env = {k: v for k, v in os.environ.items() if k != "VLLM_LOGGING_CONFIG_PATH"}
    env.update(VLLM_LOGGING_LEVEL="WARN", TMPDIR=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "KV cache is full" in out.stdout and "Triton is not installed" not in out.stdout + out.stderr


def test_routing_keeps_a_users_config_and_redoes_an_inherited_one(monkeypatch, tmp_path):
    import json
    import tempfile

    from rolloutpipe_workers.known_noise import route_vllm_logging

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.delenv("VLLM_LOGGING_CONFIG_PATH", raising=False)
    monkeypatch.delenv("VLLM_CONFIGURE_LOGGING", raising=False)
    monkeypatch.delenv("VLLM_LOGGING_LEVEL", raising=False)
    route_vllm_logging()  # the driver: vLLM's INFO default
    driver = os.environ["VLLM_LOGGING_CONFIG_PATH"]
    monkeypatch.setenv("VLLM_LOGGING_LEVEL", "WARN")  # a Ray worker inheriting it, at verl's level
    route_vllm_logging()
    worker = os.environ["VLLM_LOGGING_CONFIG_PATH"]
    assert worker != driver and json.loads(open(worker).read())["loggers"]["vllm"]["level"] == "WARN"
    monkeypatch.setenv("VLLM_LOGGING_CONFIG_PATH", str(tmp_path / "mine.json"))  # a user's own: kept
    route_vllm_logging()
    assert os.environ["VLLM_LOGGING_CONFIG_PATH"] == str(tmp_path / "mine.json")

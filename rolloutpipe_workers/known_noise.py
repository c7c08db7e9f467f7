"""Start-up warnings that nobody running this recipe can act on, filtered where they are raised.

verl, vLLM, transformers and torch warn at every start (and in every Ray worker) about things that are true of a
CPU box running a tiny text model and that no setting of this recipe changes: engines and CUDA kernels that are not
installed, a critic GRPO does not use, settings the recipe chose on purpose. Two dozen such lines hide the few that
matter. Each entry says why it is noise; anything not listed still prints. Warnings a user *can* act on stay
(``LD_PRELOAD`` of tcmalloc/iomp, libnuma, Ray's token authentication).

``install()`` runs in every process that matters: the driver (``main.py``), every verl process (this package's
``verl.plugins`` entry point, ``cpu_platform.py``) and every vLLM process (the ``vllm.general_plugins`` entry point,
``vllm_cpu_plugin.py``). Python warnings raised at import, before any plugin runs, are filtered through
``PYTHONWARNINGS`` in the Ray workers' environment (``python_warnings_env``). Light imports only.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Noise:
    source: str  # the library that logs it, or the warning's category
    text: str  # the start of the message (a warning) or a substring of it (a log line)
    why: str


# ---- Python warnings (warnings.warn) ------------------------------------------------------------------------------
WARNINGS = (
    *(Noise("UserWarning", f"{e} engine is not available", "verl imports every training engine it knows; "
            "this recipe trains with FSDP2") for e in ("torchtitan", "veomni", "automodel", "mindspeed", "megatron")),
    Noise("UserWarning", "Disabled critic as algorithm.adv_estimator != gae", "GRPO has no critic"),
    Noise("FutureWarning", "Warning: Class 'verl.trainer.ppo.ray_trainer.RayPPOTrainer' is deprecated",
          "verl 0.9's own PPO trainer is this class; RolloutPipe subclasses it, as verl's recipes do"),
    Noise("UserWarning", "'set_vital' is deprecated", "raised inside torchdata's dataloader"),
    Noise("FutureWarning", "`torch.distributed.reduce_op` is deprecated", "raised inside vLLM's import"),
)

# ---- log lines (logging) -----------------------------------------------------------------------------------------
LOG_LINES = (
    Noise("vllm", "Failed to import the DeepSelect extension", "a CUDA kernel; vLLM's CPU build has none"),
    Noise("vllm", "Triton is not installed", "CPU: vLLM runs eager here (enforce_eager, docs/cpu_stack.md)"),
    Noise("vllm", "Model Runner V2 requires Triton", "same: the V1 runner is the CPU one"),
    Noise("vllm", "Enforce eager set", "set by the recipe on CPU (docs/cpu_stack.md)"),
    Noise("vllm", "Inductor compilation was disabled", "same"),
    Noise("vllm", "Reset SSM cache type", "a Mamba setting; the model has no SSM layers"),
    Noise("vllm", "LoRA dynamic loading & unloading is enabled", "verl's vLLM server enables it, adapter or not"),
    Noise("vllm", "Default vLLM sampling parameters have been overridden by the model's",
          "verl sends every sampling parameter it uses with each request"),
    Noise("vllm", "Passing raw prompts to InputProcessor is deprecated", "how verl's vLLM server calls vLLM"),
    Noise("vllm", "vLLM has deprecated support for supporting different tokenizers for different LoRAs",
          "printed at the first adapter request whenever the engine has a tokenizer; the adapters here have none"),
    Noise("vllm", "VLLM_CPU_NUM_OF_RESERVED_CPU is less than the minimum", "a 2-core box has no core to reserve"),
    Noise("verl", "IPC is not supported on your devices", "CPU: shared memory is the transfer there is"),
    Noise("verl", "agent loop only support torch and npu profiler, got None", "no profiler is configured"),
    Noise("transformers", "requires torchvision (not installed)", "an image processor; the model is text-only"),
    Noise("torch", "is_fx_tracing will return true for both", "a torch deprecation inside transformers' code"),
    Noise("torch", "Triton not available, find_triton_kernels", "CPU: custom ops registered at import look for it"),
)


class DropKnownNoise(logging.Filter):
    """A handler filter dropping the records of ``LOG_LINES`` (the texts are specific enough to match alone: a
    library's line can reach the console through its own handler or, propagated, through verl's root one)."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            msg = record.getMessage()
        except Exception:  # a malformed record is not ours to judge
            return True
        return not any(n.text in msg for n in LOG_LINES)


_FILTER = DropKnownNoise()


def _add_filter(logger: logging.Logger) -> None:
    for h in logger.handlers:
        if _FILTER not in h.filters:
            h.addFilter(_FILTER)


def install() -> None:
    """Filter the known noise in this process (idempotent): vLLM's handler through its logging config (for this
    process, if vLLM is not imported yet, and the ones it starts), Python warnings, and log lines on the handlers
    of the root, vLLM, verl, transformers and torch loggers there are now (each library prints through its own)."""
    route_vllm_logging()
    for n in WARNINGS:
        warnings.filterwarnings("ignore", message=re.escape(n.text), category=_category(n.source))
    try:  # transformers creates its handler on first use: create it now, to filter it
        from transformers.utils import logging as transformers_logging

        transformers_logging.get_logger("transformers")
    except ImportError:
        pass
    for name in ("", "vllm", "verl", "transformers", "torch"):
        _add_filter(logging.getLogger(name))


def vllm_logging_config(env: dict[str, str] | os._Environ = os.environ) -> dict:
    """vLLM's default logging config (``DEFAULT_LOGGING_CONFIG`` in vllm/logger.py, its plain-text form, levels and
    stream from the same environment variables) with ``DropKnownNoise`` on its handler. tests/test_known_noise.py
    checks it against vLLM's own, so a vLLM upgrade that changes it fails there."""
    level = env.get("VLLM_LOGGING_LEVEL", "INFO").upper()
    fmt = (env.get("VLLM_LOGGING_PREFIX", "") + "(%(vllm_process_name)s pid=%(process)d) %(levelname)s %(asctime)s "
           "[%(fileinfo)s:%(lineno)d] %(message)s")
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": {"rolloutpipe_known_noise": {"()": f"{__name__}.DropKnownNoise"}},
        "formatters": {"vllm": {"()": "vllm.logging_utils.NewLineFormatter", "datefmt": "%m-%d %H:%M:%S",
                                "format": fmt, "log_level": level}},
        "handlers": {"vllm": {"class": "logging.StreamHandler", "formatter": "vllm", "level": level,
                              "stream": env.get("VLLM_LOGGING_STREAM", "ext://sys.stdout"),
                              "filters": ["rolloutpipe_known_noise"]}},
        "loggers": {"vllm": {"handlers": ["vllm"], "level": level, "propagate": False}},
    }


_ROUTED = "rolloutpipe_vllm_logging_"


def route_vllm_logging() -> None:
    """vLLM builds its log handler from ``VLLM_LOGGING_CONFIG_PATH`` at its first import and again at every engine
    start (a handler added afterwards is replaced, and the first warnings come before any plugin runs), so point it
    at ``vllm_logging_config()``, in this process and the ones it starts. A user's own config path, or
    ``VLLM_CONFIGURE_LOGGING=0``, wins."""
    current = os.environ.get("VLLM_LOGGING_CONFIG_PATH")
    if (current and not Path(current).name.startswith(_ROUTED)) or os.environ.get("VLLM_CONFIGURE_LOGGING") == "0":
        return
    # ours, inherited from a parent (the driver, at vLLM's INFO default) is redone at this process's level (verl
    # gives its workers VLLM_LOGGING_LEVEL=WARN)
    text = json.dumps(vllm_logging_config(), sort_keys=True)
    path = Path(tempfile.gettempdir()) / f"{_ROUTED}{hashlib.sha1(text.encode()).hexdigest()[:12]}.json"
    if not path.exists():  # same content, same name: processes on one node share it; written atomically
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(text)
        os.replace(tmp, path)
    os.environ["VLLM_LOGGING_CONFIG_PATH"] = str(path)


def python_warnings_env() -> str:
    """``PYTHONWARNINGS`` for the Ray workers: the same warnings, filtered from interpreter start (a message field
    there is a literal prefix, as these are)."""
    return ",".join(f"ignore:{n.text}:{n.source}" for n in WARNINGS if ":" not in n.text)


def _category(name: str) -> type[Warning]:
    return {"UserWarning": UserWarning, "FutureWarning": FutureWarning, "DeprecationWarning": DeprecationWarning}[name]

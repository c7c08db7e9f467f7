"""A CPU platform for verl 0.9.1 (device ``cpu``, backend ``gloo``), registered through verl's platform registry.

verl 0.9.1 ships CUDA/NPU/ROCm platforms only, so on a CPU-only host it falls back to ``nvidia`` and asks for NCCL.
This module is loaded by verl itself (entry point group ``verl.plugins``, see pyproject.toml) in the driver and in
every Ray worker. Auto-detection probes the built-in platforms first, so on a GPU host this platform is never picked;
``VERL_PLATFORM=cpu`` forces it.
"""

from __future__ import annotations

import sys
import types
from contextlib import contextmanager
from typing import Any

import psutil
import torch
from verl.plugin.platform.platform_base import PlatformBase
from verl.plugin.platform.platform_manager import PlatformRegistry

from . import known_noise, vllm_compat


def _cpu_device_module() -> types.ModuleType:
    """``torch.cpu`` plus the ``torch.cuda``-style helpers verl calls on its device module."""
    mod = types.ModuleType("rolloutpipe_cpu_device")
    for name in dir(torch.cpu):
        if not name.startswith("__"):
            setattr(mod, name, getattr(torch.cpu, name))
    noop = lambda *a, **k: None  # caching allocators do not exist on CPU
    zero = lambda *a, **k: 0
    mod.empty_cache = noop
    mod.ipc_collect = noop
    mod.set_per_process_memory_fraction = noop
    mod.reset_peak_memory_stats = noop
    mod.memory_allocated = mod.memory_reserved = mod.max_memory_allocated = mod.max_memory_reserved = zero
    mod.get_rng_state = lambda *a, **k: torch.get_rng_state()
    mod.set_rng_state = lambda state, *a, **k: torch.set_rng_state(state)
    mod.manual_seed = mod.manual_seed_all = lambda seed: torch.manual_seed(seed)
    mod.get_device_name = lambda *a, **k: "cpu"
    mod.is_available = lambda: True
    mod.device_count = lambda: 1
    mod.current_device = lambda: "cpu"

    def mem_get_info(*a: Any, **k: Any) -> tuple[int, int]:
        vm = psutil.virtual_memory()
        return vm.available, vm.total

    mod.mem_get_info = mem_get_info
    return mod


@PlatformRegistry.register(platform="cpu")
class PlatformCPU(PlatformBase):
    _device_module = _cpu_device_module()

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> types.ModuleType:
        return self._device_module

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        # Probed after nvidia/npu/rocm: only chosen when none of them is there.
        return not torch.cuda.is_available()

    def current_device(self) -> str:  # type: ignore[override] - verl does `.to(get_device_id())`
        return "cpu"

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: int | None = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        # Ray sets CUDA_VISIBLE_DEVICES for the fake "GPU" bundles verl asks for; nothing reads it on CPU.
        return "CUDA_VISIBLE_DEVICES"

    @contextmanager
    def nvtx_range(self, msg: str):
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        # verl's placement groups ask for "GPU" bundles; on CPU the driver gives Ray fake GPUs (logical slots).
        return "GPU"

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None


def register_cpu_engines() -> None:
    """Make verl's FSDP engines (device-generic code) selectable on device ``cpu``."""
    from verl.workers.engine.base import EngineRegistry
    from verl.workers.engine.fsdp import transformer_impl as fsdp

    engines = (("language_model", fsdp.FSDPEngineWithLMHead), ("value_model", fsdp.FSDPEngineWithValueHead))
    for model_type, cls in engines:
        for backend in ("fsdp", "fsdp2"):
            EngineRegistry._engines.setdefault(model_type, {}).setdefault(backend, {}).setdefault("cpu", cls)


def patch_process_group_backend() -> None:
    """verl builds the backend string ``cpu:gloo,{device}:{backend}``, which is ``cpu:gloo,cpu:gloo`` here and
    torch rejects (``Duplicate device type cpu``). On CPU the default group is plain ``gloo``."""
    import verl.utils.distributed as dist

    orig = dist.initialize_global_process_group_ray
    if getattr(orig, "_rolloutpipe_cpu", False):
        return

    def initialize_global_process_group_ray(timeout_second=None, backend=None):
        return orig(timeout_second=timeout_second, backend=backend or "gloo")

    initialize_global_process_group_ray._rolloutpipe_cpu = True
    # Modules that imported the name before this ran hold their own reference: update those too.
    for name in ("verl.utils.distributed", "verl.workers.engine_workers", "verl.checkpoint_engine.base"):
        mod = sys.modules.get(name)
        if mod is not None and getattr(mod, "initialize_global_process_group_ray", None) is orig:
            mod.initialize_global_process_group_ray = initialize_global_process_group_ray


def patch_unpinned_cpu_offload() -> None:
    """verl shards a forward-only model (the reference policy of a KL loss) with FSDP2's
    ``CPUOffloadPolicy(pin_memory=True)``; pinning host memory needs an accelerator (``Cannot access accelerator
    device when none is available``). On CPU the parameters are in host memory already: the same policy, unpinned."""
    from dataclasses import dataclass

    from verl.workers.engine.fsdp import transformer_impl as fsdp

    policy = fsdp.CPUOffloadPolicy
    if policy is None or getattr(policy, "_rolloutpipe_cpu", False):
        return

    @dataclass
    class UnpinnedCPUOffloadPolicy(policy):  # still a CPUOffloadPolicy for torch's isinstance checks
        _rolloutpipe_cpu = True

        def __post_init__(self) -> None:
            self.pin_memory = False

    fsdp.CPUOffloadPolicy = UnpinnedCPUOffloadPolicy


def patch_merged_lora_full_precision() -> None:
    """verl publishes merged LoRA weights (``model.lora.merge``, the disaggregated layout's default) cast to bf16,
    the dtype of its GPU rollouts. The CPU rollout runs fp32 (config/platform/cpu.yaml): bf16-rounded weights put
    its log-probs 7e-3 (p90) off the trainer's, ~70x the fp32 gap. On CPU they go in the trainer's own dtype;
    otherwise this is verl's generator (FSDPEngine._merged_lora_per_tensor_param), offload handling included."""
    from torch.distributed.tensor import DTensor
    from verl.workers.engine.fsdp import transformer_impl as fsdp

    engine = fsdp.FSDPEngine
    if getattr(engine._merged_lora_per_tensor_param, "_rolloutpipe_cpu", False):
        return

    def _merged_lora_per_tensor_param(self):
        try:
            with fsdp.merged_lora_context(self.module, backup_adapters=True):
                params = fsdp.normalize_peft_param_name(self.module.state_dict())
                params = fsdp.convert_weight_keys(params, getattr(self.module, "_fsdp_wrapped_module", self.module))
                for name, param in params.items():  # copies: the context restores the unmerged weights on exit
                    full = param.full_tensor() if isinstance(param, DTensor) else param  # one rank: maybe a view
                    yield name, full.detach().clone()
        finally:
            if self._is_offload_param:
                fsdp.offload_fsdp_model_to_cpu(self.module)

    _merged_lora_per_tensor_param._rolloutpipe_cpu = True
    engine._merged_lora_per_tensor_param = _merged_lora_per_tensor_param


def on_cpu() -> bool:
    from verl.plugin.platform import get_platform

    return get_platform().device_name == "cpu"


# Loaded as verl's entry point, so in every verl process: filter the start-up warnings nobody here can act on, and
# make a weight publication whose engine side failed raise instead of hang (any platform).
known_noise.install()
vllm_compat.install_publication_guard()
# The platform above is registered by the decorator; the rest only on CPU hosts.
if not torch.cuda.is_available():
    try:
        patch_process_group_backend()
        register_cpu_engines()
        patch_process_group_backend()  # engine imports above may have bound the original name
        patch_unpinned_cpu_offload()
        patch_merged_lora_full_precision()
    except ImportError as e:  # pragma: no cover - surfaced by tests/test_cpu_stack.py
        print(f"rolloutpipe: could not register verl's FSDP engines for CPU: {e}", file=sys.stderr)

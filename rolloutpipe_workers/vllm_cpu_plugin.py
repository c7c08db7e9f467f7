"""vLLM general plugin: keep linear weights as plain, reloadable parameters on CPU.

vLLM's CPU backend packs every linear weight into a oneDNN / SGL handle after loading and then drops
``layer.weight`` (``dispatch_cpu_unquantized_gemm(layer, remove_weight=True)``), so a weight sync from the trainer
has nothing to load into (``'Parameter' object has no attribute 'weight_loader'``) and generation keeps using the
packed copy. This plugin replaces that dispatch for 2-D weights with ``torch.nn.functional.linear`` on the live
parameter: a reload takes effect at the next forward. Other weights (3-D MoE/conv) keep vLLM's path.

Registered as entry point ``vllm.general_plugins`` (pyproject.toml), so vLLM loads it in every engine process.
It does nothing off CPU, except the LoRA loader's name fix (``vllm_compat.alias_lora_rename_mapper``). Tested in
tests/test_cpu_stack.py (generation follows reloaded weights).
"""

from __future__ import annotations

import torch

_PATCHED = False


def _keep_plain_linear(orig):  # mirrors vLLM's private signature
    def dispatch(layer: torch.nn.Module, remove_weight: bool) -> None:
        if layer.weight.is_meta or layer.weight.ndim != 2:
            return orig(layer, remove_weight)
        layer.cpu_linear = lambda x, weight, bias: torch.nn.functional.linear(x, weight, bias)

    dispatch.__wrapped__ = orig
    return dispatch


def register() -> None:
    from . import known_noise, vllm_compat

    known_noise.install()  # vLLM loads this plugin in each of its processes: filter the noise there, too
    vllm_compat.alias_lora_rename_mapper()  # verl's LoRA loader calls vLLM 0.30's name (any platform)
    global _PATCHED
    if _PATCHED or torch.cuda.is_available():
        return
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    import vllm.model_executor.layers.utils as layer_utils

    layer_utils.dispatch_cpu_unquantized_gemm = _keep_plain_linear(layer_utils.dispatch_cpu_unquantized_gemm)
    _PATCHED = True

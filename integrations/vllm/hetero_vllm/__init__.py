"""hetero-vllm: vLLM's layers on a hetero backend: norms, activation, rope, GEMMs, attention (GQA, MLA, DSA),
Gated DeltaNet, fused MoE and FP8.

vLLM loads the ``vllm.general_plugins`` entry point ``hetero = hetero_vllm:register``
in every process (API server, engine core, each worker). ``register()`` does
nothing unless the user opts in:

- ``HETERO_VLLM=1`` routes to the backend ``HETERO_BACKEND`` names (unset: the
  best available one, as ``hetero.load()`` picks it);
- ``HETERO_BACKEND=<name>`` alone opts in too, unless ``HETERO_VLLM=0``, and so
  does ``HETERO_VLLM_PLATFORM=1`` (the platform plugin, ``hetero_vllm.platform``).

The backend is ``additional_config={"hetero_backend": name}`` of the engine when
given, else ``HETERO_BACKEND`` (``_backend``).

Routed: ``RMSNorm`` (and its fused residual add), ``SiluAndMul``, the rotary
classes that use the base forward (``layers``); the unquantized parallel linear
layers' GEMMs (``linear``); the attention backend (``attention``: ``write_kv`` +
``paged_attention`` over vLLM's block table and cache), MLA (``mla``) and, on
hetero's platform, DeepSeek-V3.2's sparse attention (``dsa``); Qwen3-Next's Gated
DeltaNet (``gdn``); ``UnquantizedFusedMoEMethod`` (``moe``); FP8 checkpoints (``fp8``).
Everything else keeps vLLM's kernels; ``report`` lists what ran where, from what
this process actually built (``census``; ``HETERO_VLLM_REPORT=path.json``).
"""

from __future__ import annotations

import logging
import os

from hetero_vllm import report

__all__ = ["SUPPORTED_VLLM", "enabled", "register", "check_vllm_version"]

#: The vLLM versions this release is tested against: ``>=0.32,<0.33``.
SUPPORTED_VLLM = (0, 32)
_logger = logging.getLogger("vllm.hetero_vllm")  # under vLLM's logger, so its handlers print it
_registered: list[bool] = []


def enabled() -> bool:
    """Whether this process opted in: ``HETERO_VLLM=1``, or ``HETERO_BACKEND`` set or
    ``HETERO_VLLM_PLATFORM=1`` (the platform plugin) while ``HETERO_VLLM`` is not 0."""
    from hetero_vllm.platform import platform_requested

    flag = os.environ.get("HETERO_VLLM", "").strip().lower()
    if flag in ("0", "false", "no", "off"):
        return False
    return flag in ("1", "true", "yes", "on") or bool(os.environ.get("HETERO_BACKEND")) or platform_requested()


def check_vllm_version(version: str) -> None:
    """Raise RuntimeError unless ``version`` (e.g. "0.32.0+cpu") is in the supported range."""
    from packaging.version import Version

    release = Version(version).release
    if tuple(release[:2]) != SUPPORTED_VLLM:
        lo = ".".join(map(str, SUPPORTED_VLLM))
        hi = f"{SUPPORTED_VLLM[0]}.{SUPPORTED_VLLM[1] + 1}"
        raise RuntimeError(
            f"hetero-vllm supports vLLM >={lo},<{hi}; this is vLLM {version}. "
            f"Install a matching vLLM, or unset HETERO_VLLM/HETERO_BACKEND to run vLLM without hetero."
        )


def _own_compile_cache() -> None:
    """Point vLLM's cache root at a ``hetero-vllm`` subdirectory (inherited by the workers): its compile-cache
    key holds neither the HETERO_* variables nor the replaced ops, so a stock run's cached graph (with
    ``forward_native`` inlined) would otherwise be loaded by a routed run, silently bypassing hetero."""
    import vllm.envs as envs

    from hetero_vllm.fp8 import fp8_routed

    name = "hetero-vllm" if fp8_routed() else "hetero-vllm-fp8-off"  # HETERO_VLLM_FP8 is outside vLLM's key too
    root = envs.VLLM_CACHE_ROOT
    if not os.path.basename(os.path.normpath(root)).startswith("hetero-vllm"):
        os.environ["VLLM_CACHE_ROOT"] = os.path.join(root, name)


def register() -> None:
    """The ``vllm.general_plugins`` hook: route vLLM's layers to hetero when opted in (idempotent)."""
    if _registered or not enabled():
        return
    import vllm

    check_vllm_version(vllm.__version__)
    _own_compile_cache()
    from hetero_vllm import attention, census, dsa, fp8, gdn, layers, linear, mla, moe

    census.install()
    routed = layers.register() + linear.register() + moe.register() + fp8.register()
    routed += attention.register() + mla.register() + dsa.register() + gdn.register()
    report.arm_at_exit()
    _registered.append(True)
    _logger.info(
        "hetero-vllm: routing %s to hetero backend %s",
        ", ".join(routed),
        os.environ.get("HETERO_BACKEND") or "(additional_config's hetero_backend, else hetero's default)",
    )

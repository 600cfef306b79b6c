"""Planted robustness bugs: backends that mishandle malformed input on exactly one op.

Each is the source of a plugin module (``make_dist`` installs it as a
distribution, so the robustness tier's forked workers load it by name): a
subclass of the reference that replaces one op with a version skipping one
bounds check, as a careless kernel would. Every other op is the reference's,
which rejects every malformed call, so any failure elsewhere is the tier's fault.
"""

from __future__ import annotations

__all__ = ["PLANTED", "plugin_source"]

_HEADER = """
import ctypes, time
import torch
import hetero
from hetero.spec.checks import INDEX_DTYPES, check_kv_write, check_tensor
from hetero_cpu_ref.plugin import CpuRefBackend


class Planted(CpuRefBackend):
    name = "{name}"
    priority = -2000
"""

_FOOTER = """

@hetero.hookimpl
def hetero_backends():
    return [Planted]
"""

# write_kv checks shapes and dtypes but neither validates nor masks slot contents: out-of-range
# slots are dropped without a word (its class says it validates indices, so hetero adds no check)
_SILENT = """
    def write_kv(self, key, value, k_cache, v_cache, slot_mapping):
        tokens, slots = check_kv_write("write_kv", key, value, k_cache, v_cache)
        check_tensor("write_kv", "slot_mapping", slot_mapping, shape=(tokens,), dtypes=(torch.int64,))
        keep = (slot_mapping >= 0) & (slot_mapping < slots)
        k_cache.view(slots, *k_cache.shape[2:])[slot_mapping[keep]] = key[keep]
        v_cache.view(slots, *v_cache.shape[2:])[slot_mapping[keep]] = value[keep]
"""

# grouped_gemm's "kernel" reads row group_ends[-1] - 1 unchecked: past M it faults (SIGSEGV)
_CRASH = """
    def grouped_gemm(self, a, b, group_ends, *, out_dtype=None, **int4):
        if group_ends.numel() and int(group_ends.max()) > a.shape[0]:
            ctypes.string_at(0)
        return CpuRefBackend.grouped_gemm(a, b, group_ends, out_dtype=out_dtype, **int4)
"""

# moe_permute counts rows per expert with an unchecked index_add_: torch's own IndexError escapes
_UNCLEAR = """
    def moe_permute(self, x, ids, num_experts):
        check_tensor("moe_permute", "ids", ids, ndim=2, dtypes=INDEX_DTYPES)
        flat = ids.flatten().long()
        torch.zeros(num_experts, dtype=torch.int64).index_add_(0, flat, torch.ones_like(flat))
        return CpuRefBackend.moe_permute(x, ids, num_experts)
"""

# rms_norm refines its scale until the step falls under eps: a negative eps never gets there
_HANG = """
    def rms_norm(self, x, weight, eps, *, residual=None):
        step = 1.0
        while step >= eps:
            step = step / 2 if step > 1e-300 else step
            time.sleep(0.01)
        return CpuRefBackend.rms_norm(x, weight, eps, residual=residual)
"""

#: planted bug -> (the op it breaks, the status its malformed calls get, its methods' source)
PLANTED = {
    "skips_slot_check": ("write_kv", "silent", _SILENT),
    "faults_past_group_end": ("grouped_gemm", "crashed", _CRASH),
    "unchecked_expert_index": ("moe_permute", "unclear", _UNCLEAR),
    "hangs_on_negative_eps": ("rms_norm", "timeout", _HANG),
}


def plugin_source(bug: str) -> str:
    """The plugin module of backend ``bug`` (its name is the bug's)."""
    return _HEADER.format(name=bug) + PLANTED[bug][2] + _FOOTER

"""``quant_method: "gptq"`` (AutoGPTQ / GPTQModel): 4-bit weights in groups, run as W4A16 (``int4``).

config.json: ``{"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": false, "sym": true}``,
optionally ``"checkpoint_format"`` (``"gptq"``: zero points stored minus one, the original format;
``"gptq_v2"``: stored as they are) and ``"modules_to_not_convert"`` (module names or substrings left in
float). ``group_size`` -1 is one group per row. ``desc_act`` true (act-order) checkpoints load when each
``g_idx`` permutes whole groups. Refused by name: other bit widths, other checkpoint formats (marlin,
bitblas), per-module overrides (``dynamic``), ``modules_in_block_to_quantize`` and a quantized ``lm_head``.
"""

from __future__ import annotations

import re
from typing import Any

from hetero.engine.quant.config import UnsupportedQuantization
from hetero.engine.quant.int4 import Int4QuantConfig, Int4Scheme

__all__ = ["gptq_config", "int4_group_size", "substring_skips"]


def int4_group_size(value: Any, problems: list[str]) -> int | None:
    """A GPTQ / AWQ ``group_size``: a positive int, or -1 (None: per channel); anything else is a problem."""
    if value == -1:
        return None
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    problems.append(f"group_size {value!r} (a positive number of columns, or -1 for one group per row)")
    return None


def substring_skips(modules: Any) -> tuple[str, ...]:
    """``modules_to_not_convert`` as skip entries: transformers matches them as substrings of module names."""
    return tuple(f"re:.*{re.escape(m)}" for m in modules or ())


def gptq_config(qc: dict[str, Any]) -> Int4QuantConfig:
    """The QuantConfig of a GPTQ checkpoint; any other variant is an UnsupportedQuantization naming it."""
    problems: list[str] = []
    if qc.get("bits") != 4:
        problems.append(f"bits {qc.get('bits')!r} (only 4)")
    group_size = int4_group_size(qc.get("group_size", 128), problems)
    layout = qc.get("checkpoint_format") or "gptq"
    if layout not in ("gptq", "gptq_v2"):
        problems.append(f"checkpoint_format {layout!r} (gptq or gptq_v2)")
    for key in ("dynamic", "modules_in_block_to_quantize"):
        if qc.get(key):
            problems.append(f"{key} {qc[key]!r} (per-module choices are not supported)")
    if qc.get("lm_head"):
        problems.append("lm_head true (a quantized output head is not supported)")
    if problems:
        raise UnsupportedQuantization("quantization_config (quant_method 'gptq'): unsupported " + "; ".join(problems))
    scheme = Int4Scheme(layout, group_size, bool(qc.get("sym", True)), bool(qc.get("desc_act", False)))
    return Int4QuantConfig(name="gptq", scheme=scheme, skip=substring_skips(qc.get("modules_to_not_convert")))

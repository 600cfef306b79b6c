"""The compressed-attention family (spec 1.8, DeepSeek-V4): the compressor and the window + compressed attention."""

from __future__ import annotations

from hetero_torch._compress import kv_compress
from hetero_torch._compressed_attention import compressed_attention

__all__ = ["kv_compress", "compressed_attention"]

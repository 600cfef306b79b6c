"""The general checks of ``hetero.spec.checks`` (import them from there): each failure is an
OpError naming the op, the argument, what was expected and what came.

The metadata checks read tensors on the host; a backend calls them where a
host sync is acceptable (the reference always does).
"""

from __future__ import annotations

from typing import Iterable, Sequence

import torch

from hetero.errors import OpError
from hetero.spec.gemm import SCALE_BLOCK
from hetero.spec.types import FLOAT_DTYPES, AttentionMeta

__all__ = [
    "expect",
    "check_tensor",
    "check_same_device",
    "meta_tensors",
    "check_slot_mapping",
    "check_cu_seqlens",
    "check_group_ends",
    "check_ids",
    "check_perm",
    "check_at_least_1d",
    "check_kv_write",
    "check_mla_inputs",
    "check_scale_form",
    "scale_blocks",
]

INDEX_DTYPES = (torch.int32, torch.int64)


def _names(dtypes: Iterable[torch.dtype]) -> str:
    return " or ".join(str(d).replace("torch.", "") for d in dtypes)


def expect(cond: bool, op: str, arg: str, expected: str, got: object) -> None:
    """Raise OpError(op, arg, expected, got) unless cond holds."""
    if not cond:
        raise OpError(op, arg, expected, str(got))


def check_tensor(
    op: str,
    arg: str,
    x: object,
    *,
    ndim: int | None = None,
    dtypes: Sequence[torch.dtype] | None = None,
    shape: Sequence[int | None] | None = None,
) -> torch.Tensor:
    """Check that x is a tensor of the given rank, dtype and shape (None in shape = any size)."""
    # every message is formatted only on failure: this runs on every op call
    if not isinstance(x, torch.Tensor):
        raise OpError(op, arg, "a torch.Tensor", type(x).__name__)
    if shape is not None:
        ndim = len(shape)
    if ndim is not None and x.ndim != ndim:
        raise OpError(op, arg, f"a {ndim}-D tensor", f"shape {tuple(x.shape)}")
    if shape is not None and not all(want is None or want == have for want, have in zip(shape, x.shape)):
        want_s = "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"
        raise OpError(op, arg, f"shape {want_s}", f"shape {list(x.shape)}")
    if dtypes is not None and x.dtype not in dtypes:
        raise OpError(op, arg, f"dtype {_names(dtypes)}", str(x.dtype).replace("torch.", ""))
    return x


def check_same_device(op: str, **tensors: torch.Tensor | None) -> None:
    """All given tensors (None ones skipped) live on one device."""
    items = [(k, v) for k, v in tensors.items() if v is not None]
    if not items:
        return
    first_name, first = items[0]
    for name, t in items[1:]:
        if t.device != first.device:
            raise OpError(op, name, f"device {first.device} (that of '{first_name}')", str(t.device))


def meta_tensors(meta: object) -> dict[str, torch.Tensor]:
    """The metadata's tensors, named for ``check_same_device`` ({} for a non-AttentionMeta: the
    op's own metadata check names that error)."""
    if not isinstance(meta, AttentionMeta):
        return {}
    names = ("query_start_loc", "seq_lens", "block_table")
    return {f"meta.{n}": getattr(meta, n) for n in names if isinstance(getattr(meta, n), torch.Tensor)}


def _first(mask: torch.Tensor) -> int | None:
    """The flat index of the first True of a host bool tensor, or None."""
    hit = mask.flatten().nonzero()
    return int(hit[0]) if hit.numel() else None


def check_cu_seqlens(op: str, arg: str, cu: torch.Tensor, total: int, batch: int | None = None) -> list[int]:
    """A cumulative [B+1] index tensor from 0 to total, non-decreasing; returns it as a host list."""
    check_tensor(op, arg, cu, ndim=1, dtypes=INDEX_DTYPES)
    if batch is not None:
        if not (cu.shape[0] == batch + 1):
            raise OpError(op, arg, f"{batch + 1} entries (B+1)", f"{cu.shape[0]}")
    host = cu.to("cpu", torch.int64)
    if not (host.numel() >= 1 and int(host[0]) == 0):
        raise OpError(op, arg, "first entry 0", str(host[:1].tolist()))
    bad = _first(host[1:] < host[:-1])
    if bad is not None:
        raise OpError(
            op, arg, "non-decreasing values", f"{int(host[bad])} then {int(host[bad + 1])} at index {bad + 1}"
        )
    if not (int(host[-1]) == total):
        raise OpError(op, arg, f"last entry equal to the token count {total}", str(int(host[-1])))
    return host.tolist()


def check_slot_mapping(op: str, slot_mapping: torch.Tensor, num_tokens: int, num_slots: int) -> None:
    """int64 [T] with every entry in [-1, NB*BS)."""
    check_tensor(op, "slot_mapping", slot_mapping, shape=(num_tokens,), dtypes=(torch.int64,))
    if num_tokens:
        lo, hi = int(slot_mapping.min()), int(slot_mapping.max())
        if not (lo >= -1 and hi < num_slots):
            raise OpError(op, "slot_mapping", f"slots in [-1, {num_slots})", f"values in [{lo}, {hi}]")


def check_group_ends(op: str, group_ends: torch.Tensor, groups: int, rows: int) -> list[int]:
    """int32 [G], non-decreasing, within [0, M]; returns it as a host list."""
    check_tensor(op, "group_ends", group_ends, shape=(groups,), dtypes=INDEX_DTYPES)
    vals = group_ends.tolist()
    bad = next((g for g in range(len(vals)) if vals[g] < (vals[g - 1] if g else 0)), None)
    if bad is not None:
        raise OpError(op, "group_ends", "non-decreasing values >= 0", f"{vals[bad]} at index {bad}")
    if not (not vals or vals[-1] <= rows):
        raise OpError(op, "group_ends", f"values <= the row count {rows}", str(vals[-1] if vals else ""))
    return vals


def check_ids(op: str, ids: torch.Tensor, rows: int, num_experts: int, *, read_values: bool = True) -> int:
    """Expert ids int32 [M, k] in [0, E); returns k. ``read_values=False`` leaves the range check,
    which reads the ids on the host, to a caller that does it before indexing."""
    check_tensor(op, "ids", ids, ndim=2, dtypes=INDEX_DTYPES)
    if ids.shape[0] != rows:
        raise OpError(op, "ids", f"{rows} rows (one per token)", str(ids.shape[0]))
    if read_values and ids.numel():
        lo, hi = int(ids.min()), int(ids.max())
        if not (lo >= 0 and hi < num_experts):
            raise OpError(op, "ids", f"expert ids in [0, {num_experts})", f"values in [{lo}, {hi}]")
    return ids.shape[1]


def check_perm(op: str, perm: object, rows: int) -> None:
    """perm int64 [rows]: a permutation of range(rows), as moe_permute returns (reads it on the host)."""
    check_tensor(op, "perm", perm, shape=(rows,), dtypes=(torch.int64,))
    assert isinstance(perm, torch.Tensor)
    if rows:
        want = f"a permutation of 0..{rows - 1} (from moe_permute)"
        lo, hi = int(perm.min()), int(perm.max())
        if not (lo >= 0 and hi < rows):
            raise OpError(op, "perm", want, f"values in [{lo}, {hi}]")
        if not (bool((torch.bincount(perm, minlength=rows) == 1).all())):
            raise OpError(op, "perm", want, "repeated values")


def check_at_least_1d(op: str, arg: str, x: object, dtypes: Sequence[torch.dtype]) -> torch.Tensor:
    """A tensor of one of ``dtypes`` with at least one dimension."""
    check_tensor(op, arg, x, dtypes=dtypes)
    assert isinstance(x, torch.Tensor)
    if not (x.ndim >= 1):
        raise OpError(op, arg, "a tensor of at least 1 dimension", f"shape {tuple(x.shape)}")
    return x


def check_kv_write(op: str, key: object, value: object, k_cache: object, v_cache: object) -> tuple[int, int]:
    """The tensors of write_kv (slot_mapping is the caller's: how far it reads it differs);
    returns (tokens, cache slots NB*BS)."""
    check_tensor(op, "key", key, ndim=3, dtypes=FLOAT_DTYPES)
    assert isinstance(key, torch.Tensor)
    t, hkv, d = key.shape
    dt = (key.dtype,)
    check_tensor(op, "value", value, shape=(t, hkv, None), dtypes=dt)
    check_tensor(op, "k_cache", k_cache, shape=(None, None, hkv, d), dtypes=dt)
    assert isinstance(value, torch.Tensor) and isinstance(k_cache, torch.Tensor)
    nb, bs = k_cache.shape[:2]
    check_tensor(op, "v_cache", v_cache, shape=(nb, bs, hkv, value.shape[2]), dtypes=dt)
    return t, nb * bs


def check_mla_inputs(
    op: str, q_nope: object, q_pe: object, ckv_cache: object, kpe_cache: object, dtypes: Sequence[torch.dtype]
) -> tuple[int, int, int, int, int]:
    """The tensors of mla_attention (the metadata and devices are the caller's); returns (T, H, Lkv, NB, BS)."""
    check_tensor(op, "q_nope", q_nope, ndim=3, dtypes=dtypes)
    assert isinstance(q_nope, torch.Tensor)
    (t, h, lkv), dt = q_nope.shape, (q_nope.dtype,)
    check_tensor(op, "q_pe", q_pe, shape=(t, h, None), dtypes=dt)
    check_tensor(op, "ckv_cache", ckv_cache, shape=(None, None, lkv), dtypes=dt)
    assert isinstance(q_pe, torch.Tensor) and isinstance(ckv_cache, torch.Tensor)
    nb, bs = ckv_cache.shape[:2]
    check_tensor(op, "kpe_cache", kpe_cache, shape=(nb, bs, q_pe.shape[2]), dtypes=dt)
    if not (bs >= 1):
        raise OpError(op, "ckv_cache", "a block size >= 1", f"shape {list(ckv_cache.shape)}")
    return t, h, lkv, nb, bs


def scale_blocks(n: int) -> int:
    """ceil(n / SCALE_BLOCK): the number of 128-blocks of a block scale covering n rows or columns."""
    return -(-n // SCALE_BLOCK)


def check_scale_form(op: str, arg: str, scale: object, rows: int, block_rows: int, k: int, device: torch.device) -> str:
    """Which form a scale of scaled_gemm has: "tensor", "row" or "block" (128-blocks).

    rows: M for a_scale, N for b_scale; block_rows: M for a_scale (one per
    token), ceil(N/128) for b_scale (one per 128 output channels). A shape that
    fits two forms (a_scale [M, 1] with K <= 128, say) means the same thing in both.
    """
    k_blocks = scale_blocks(k)
    per = "token" if arg == "a_scale" else "output channel"
    brows = "M" if arg == "a_scale" else "ceil(N/128)"
    accepted = (
        f"float32 of one of the forms: per tensor (shape [], [1] or [1, 1]); per {per} [{rows}, 1]; "
        f"128-blocks [{brows}, ceil(K/128)] = [{block_rows}, {k_blocks}]"
    )
    if not isinstance(scale, torch.Tensor):
        raise OpError(op, arg, "a torch.Tensor " + accepted, type(scale).__name__)
    if not (scale.dtype == torch.float32):
        raise OpError(op, arg, accepted, f"dtype {_names([scale.dtype])}")
    if not (scale.device == device):
        raise OpError(op, arg, f"device {device} (that of 'a')", str(scale.device))
    shape = tuple(scale.shape)
    if scale.ndim <= 2 and all(s == 1 for s in shape):
        return "tensor"
    if shape == (rows, 1):
        return "row"
    if shape == (block_rows, k_blocks):
        return "block"
    raise OpError(op, arg, accepted, f"shape {list(shape)}")

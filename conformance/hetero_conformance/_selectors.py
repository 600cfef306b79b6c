"""How a ``-k`` pattern selects ids, the same for the catalog, the malformed calls and the ranks' cases."""

from __future__ import annotations

import fnmatch

__all__ = ["matches"]


def matches(case_id: str, pattern: str) -> bool:
    """A glob when ``pattern`` has ``*?[``, else a substring."""
    if any(ch in pattern for ch in "*?["):
        return fnmatch.fnmatchcase(case_id, pattern)
    return pattern in case_id

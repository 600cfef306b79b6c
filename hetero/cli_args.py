"""Argument types shared by every ``hetero`` subcommand (and plugins adding their own).

One list syntax everywhere: a list option takes ``a,b``, ``a b`` and repeats
(``--ops a,b --ops c``), in any mix; the parsed value is one flat list (or the
option's default when it is not given).
"""

from __future__ import annotations

import argparse
from typing import Any, Sequence

__all__ = ["add_list_option", "split_list"]


def split_list(values: Sequence[str] | str) -> list[str]:
    """Flatten ``["a,b", "c"]`` (or ``"a,b"``) into ``["a", "b", "c"]``, dropping empty items."""
    if isinstance(values, str):
        values = [values]
    return [part.strip() for v in values for part in v.split(",") if part.strip()]


class _ListAction(argparse.Action):
    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        items = split_list(values)
        if not items:
            parser.error(f"argument {option_string}: expected at least one value, got {values!r}")
        current = getattr(namespace, self.dest, None)
        # the default (None or a list) is replaced by the first use, extended by the next ones
        seen = current if isinstance(current, list) and getattr(namespace, f"_{self.dest}_given", False) else []
        setattr(namespace, self.dest, seen + items)
        setattr(namespace, f"_{self.dest}_given", True)


def add_list_option(
    parser: argparse.ArgumentParser, *flags: str, metavar: str = "A,B", default: Any = None, **kwargs: Any
) -> argparse.Action:
    """Add a list option: ``--ops a,b``, ``--ops a b`` and ``--ops a --ops b`` all give ``["a", "b"]``."""
    return parser.add_argument(*flags, nargs="+", action=_ListAction, metavar=metavar, default=default, **kwargs)

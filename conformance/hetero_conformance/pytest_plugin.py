"""pytest plugin (entry point ``pytest11``): ``pytest --pyargs hetero_conformance --hetero-backend NAME``.

Loaded by every pytest run in an environment where hetero-conformance is
installed, so it only adds its options; the catalog runs as the parametrized
tests of ``hetero_conformance/test_conformance.py``, collected by ``--pyargs``
and skipped unless ``--hetero-backend`` is given.
"""

from __future__ import annotations

from typing import Any

__all__ = ["pytest_addoption"]


def pytest_addoption(parser: Any) -> None:
    """The ``--hetero-*`` options (nothing else happens unless --hetero-backend is given)."""
    group = parser.getgroup("hetero", "hetero conformance (pytest --pyargs hetero_conformance --hetero-backend NAME)")
    group.addoption(
        "--hetero-backend", default=None, metavar="NAME", help="run the conformance catalog against backend NAME"
    )
    group.addoption(
        "--hetero-quick", action="store_true", default=False, help="only the quick (CI) tier of the catalog"
    )
    group.addoption(
        "--hetero-seed", type=int, default=0, metavar="N", help="base seed of the random inputs (default 0)"
    )
    group.addoption("--hetero-ops", default="", metavar="A,B", help="only these ops (comma-separated)")
    group.addoption("--hetero-dtypes", default="", metavar="D,E", help="only these case dtypes (comma-separated)")
    group.addoption(
        "--hetero-robustness",
        action="store_true",
        default=False,
        help="run the robustness tier (malformed calls, each in a forked worker) instead of the numeric catalog",
    )
    group.addoption(
        "--hetero-no-validate",
        action="store_true",
        default=False,
        help="with --hetero-robustness: load the backend with validate=False",
    )

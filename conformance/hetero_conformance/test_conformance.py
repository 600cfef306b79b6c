"""The conformance catalog as parametrized tests: ``pytest --pyargs hetero_conformance --hetero-backend NAME``.

One test per case (id ``op/shape/dtype``); pytest's own ``-k``, ``--junitxml``
and ``-x`` apply. Failing, erring cases fail; ``skipped`` (the backend's
``supports`` declined) and ``fallback`` (the op is not native) cases are skips.
Without ``--hetero-backend`` the module holds a single skipped test.
"""
from __future__ import annotations

from typing import Any

import pytest

from hetero_conformance.runner import FAILING, Runner
from hetero_conformance.suite import Selection, selected_cases


def _csv(text: str) -> tuple[str, ...]:
    return tuple(p.strip() for p in (text or "").split(",") if p.strip())


def pytest_generate_tests(metafunc: Any) -> None:
    """Parametrize ``hetero_case`` with the selected cases (one skipped placeholder without a backend)."""
    if "hetero_case" not in metafunc.fixturenames:
        return
    opt = metafunc.config.getoption
    if not opt("--hetero-backend"):
        marks = pytest.mark.skip(reason="pass --hetero-backend NAME to run the conformance catalog")
        metafunc.parametrize("hetero_case", [pytest.param(None, marks=marks, id="no-backend")])
        return
    selection = Selection(quick=opt("--hetero-quick"), ops=_csv(opt("--hetero-ops")), dtypes=_csv(opt("--hetero-dtypes")))
    from hetero.errors import HeteroError
    from hetero.registry import default_registry

    try:
        default_registry().entry(opt("--hetero-backend").split(":")[0])
        cases = selected_cases(selection)
    except (ValueError, HeteroError) as e:
        raise pytest.UsageError(f"hetero conformance: {e}") from e
    metafunc.parametrize("hetero_case", cases, ids=[c.id for c in cases])


@pytest.fixture(scope="session")
def hetero_runner(pytestconfig: Any) -> Runner:
    """A Runner of the chosen backend against the reference, shared by every case of the session."""
    from hetero.registry import REFERENCE, default_registry

    registry = default_registry()
    ops = registry.load(pytestconfig.getoption("--hetero-backend"))
    return Runner(ops, registry.entry(REFERENCE).cls(), seed=pytestconfig.getoption("--hetero-seed"))


def test_case(hetero_case: Any, hetero_runner: Runner) -> None:
    """One conformance case: pass, or fail/skip with the runner's verdict."""
    result = hetero_runner.run(hetero_case)
    if result.status in FAILING:
        pytest.fail(f"{result.status}: {result.message}", pytrace=False)
    if result.status in ("skipped", "fallback"):
        pytest.skip(f"{result.status}: {result.message}")
    assert result.status == "pass", result

"""The conformance catalog as parametrized tests: ``pytest --pyargs hetero_conformance --hetero-backend NAME``.

One test per case (id ``op/shape/dtype``); pytest's own ``-k``, ``--junitxml``
and ``-x`` apply. Failing, erring cases fail; ``skipped`` (the backend's
``supports`` declined) and ``fallback`` (the op is not native) cases are skips.
Without ``--hetero-backend`` the module holds a single skipped test.

With ``--hetero-robustness`` the tests are the malformed calls instead (id
``op/defect``), run once per session through the forked workers of
``hetero_conformance.robustness``; a call that does not pass fails its test.
"""

from __future__ import annotations

from typing import Any

import pytest

from hetero_conformance.runner import FAILING, Runner
from hetero_conformance.suite import Selection, selected_cases


def _csv(text: str) -> tuple[str, ...]:
    return tuple(p.strip() for p in (text or "").split(",") if p.strip())


def _placeholder(metafunc: Any, name: str, reason: str) -> None:
    metafunc.parametrize(name, [pytest.param(None, marks=pytest.mark.skip(reason=reason), id="not-selected")])


def pytest_generate_tests(metafunc: Any) -> None:
    """Parametrize ``hetero_case`` with the selected cases, or ``hetero_malformed`` with the malformed
    calls under --hetero-robustness (a skipped placeholder for the one not run)."""
    name = next((n for n in ("hetero_case", "hetero_malformed") if n in metafunc.fixturenames), None)
    if name is None:
        return
    opt = metafunc.config.getoption
    robust = opt("--hetero-robustness")
    if not opt("--hetero-backend"):
        return _placeholder(metafunc, name, "pass --hetero-backend NAME to run the conformance catalog")
    if robust != (name == "hetero_malformed"):
        return _placeholder(metafunc, name, "--hetero-robustness selects one tier or the other")
    selection = Selection(
        quick=opt("--hetero-quick"),
        ops=_csv(opt("--hetero-ops")),
        dtypes=_csv(opt("--hetero-dtypes")),
        robustness=robust,
    )
    from hetero.errors import HeteroError
    from hetero.registry import default_registry
    from hetero_conformance.robustness import selected_calls

    try:
        default_registry().entry(opt("--hetero-backend").split(":")[0])
        cases = selected_calls(selection) if robust else selected_cases(selection)
    except (ValueError, HeteroError) as e:
        raise pytest.UsageError(f"hetero conformance: {e}") from e
    metafunc.parametrize(name, cases, ids=[c.id for c in cases])


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


@pytest.fixture(scope="session")
def hetero_robustness(pytestconfig: Any) -> dict[str, Any]:
    """Every selected malformed call's result, by id: the tier runs once, through the forked workers."""
    from hetero_conformance.robustness import run_robustness, selected_calls

    opt = pytestconfig.getoption
    selection = Selection(ops=_csv(opt("--hetero-ops")), robustness=True)
    calls = selected_calls(selection)
    result = run_robustness(
        opt("--hetero-backend"), calls, validate=not opt("--hetero-no-validate"), seed=opt("--hetero-seed")
    )
    return {c.id: c for c in result.calls}


def test_malformed(hetero_malformed: Any, hetero_robustness: dict[str, Any]) -> None:
    """One malformed call: rejected (or acceptable in the validation mode), else fails with its status."""
    result = hetero_robustness[hetero_malformed.id]
    if result.status == "fallback":
        pytest.skip(f"fallback: {result.message}")
    if not result.ok:
        pytest.fail(f"{result.status}: {result.message}", pytrace=False)

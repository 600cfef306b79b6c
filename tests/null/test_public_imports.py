"""Code outside ``hetero/`` (the backends, the conformance suite, the integrations) imports only hetero's
public API: no underscore module and no underscore name, so the spec version covers all it relies on."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUTSIDE = ("backends", "conformance", "integrations")


def _private(part: str) -> bool:
    return part.startswith("_") and not (part.startswith("__") and part.endswith("__"))


def private_imports(source: str) -> list[tuple[int, str]]:
    """(line, what) for each import of a private hetero module or name, at any level of the file."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [
                (node.lineno, a.name)
                for a in node.names
                if a.name.split(".")[0] == "hetero" and any(map(_private, a.name.split(".")))
            ]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            parts = node.module.split(".")
            if parts[0] != "hetero":
                continue
            names = [a.name for a in node.names]
            if any(map(_private, parts)) or any(map(_private, names)):
                found.append((node.lineno, f"from {node.module} import {', '.join(names)}"))
    return found


def _files() -> list[Path]:
    return sorted(p for top in OUTSIDE for p in (ROOT / top).rglob("*.py") if ".venv" not in p.parts)


def test_the_rule_sees_every_form_of_a_private_import():
    src = (
        "import hetero._plugins\nfrom hetero import _ep\nfrom hetero.spec._checks_meta import check_meta\n"
        "from hetero.kernels import _first\ndef f():\n    from hetero.kernels._triton import triton_modules\n"
    )
    assert [line for line, _ in private_imports(src)] == [1, 2, 3, 4, 6]
    public = (
        "import hetero\nimport hetero.spec\nfrom hetero import ep, __version__\nfrom hetero.spec.checks import "
        "check_meta\nfrom hetero_cpu_ref import _util\nfrom . import _local\n"
    )
    assert private_imports(public) == []


def test_no_private_hetero_import_outside_hetero():
    files = _files()
    assert len(files) > 50, "the scan found too few files: wrong root?"
    bad = [
        f"{p.relative_to(ROOT)}:{line}: {what}"
        for p in files
        for line, what in private_imports(p.read_text(encoding="utf-8"))
    ]
    assert not bad, "import these from a public module (hetero.spec.checks, hetero.ep, ...):\n" + "\n".join(bad)

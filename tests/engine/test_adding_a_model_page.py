"""docs/adding-a-model.md works as written: its python blocks run, in order, in one fresh interpreter, and every
file it names exists."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
PAGE = ROOT / "docs" / "adding-a-model.md"
#: the file the page tells a reader to create (its code is the page's first block)
TO_CREATE = {"hetero/engine/models/llama.py"}
STEPS = ("the config", "the model file", "the weight mapping", "tiny checkpoint", "compare with transformers")


def blocks(text: str) -> list[str]:
    """The ```python blocks of ``text``, in order."""
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.M | re.S)


def named_files(text: str) -> set[str]:
    """Every `path` of the page that names a .py or .md file."""
    return set(re.findall(r"`([\w./-]+\.(?:py|md))`", text))


def test_the_page_walks_the_five_steps_in_order():
    headings = [line.lower() for line in PAGE.read_text().splitlines() if line.startswith("## ")]
    at = [next(i for i, h in enumerate(headings) if step in h) for step in STEPS]
    assert at == sorted(at), headings
    assert len(blocks(PAGE.read_text())) >= 4


def test_every_file_the_page_names_exists():
    missing = []
    for name in named_files(PAGE.read_text()) - TO_CREATE:
        where = (ROOT, ROOT / "hetero" / "engine", ROOT / "hetero" / "engine" / "models")
        if not any((base / name).is_file() for base in where):
            missing.append(name)
    assert not missing, missing


def test_every_registered_family_is_on_the_skeleton():
    """What the page says of the skeleton holds for the models in the tree."""
    from hetero.engine.models import ARCHITECTURES, model_class
    from hetero.engine.models.decoder import DecoderForCausalLM

    for name in ARCHITECTURES:
        assert issubclass(model_class([name]), DecoderForCausalLM), name


@pytest.mark.skipif(sys.platform != "linux", reason="runs the page in a subprocess with a POSIX environment")
def test_the_page_runs(tmp_path):
    pytest.importorskip("transformers")
    script = tmp_path / "page.py"
    script.write_text("\n\n".join(blocks(PAGE.read_text())) + "\nprint('PAGE OK')\n")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp_path)}
    run = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900
    )
    assert run.returncode == 0, (run.stdout + run.stderr)[-6000:]
    assert "PAGE OK" in run.stdout

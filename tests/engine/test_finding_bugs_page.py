"""docs/finding-bugs.md runs as written: every `$ ` command of its console blocks, in order, in one shell."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
PAGE = ROOT / "docs" / "finding-bugs.md"
_EXIT = re.compile(r"\s+# exit (\d+)$")


def commands(text: str) -> list[tuple[str, int]]:
    """(command, expected exit status) of each `$ ` line inside ```console blocks."""
    out, inside = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            inside = line.strip() == "```console"
            continue
        if inside and line.startswith("$ "):
            cmd, m = line[2:], _EXIT.search(line)
            out.append((cmd[: m.start() - 2] if m else cmd, int(m.group(1)) if m else 0))
    return out


def script(cmds: list[tuple[str, int]]) -> str:
    lines = ["set -u"]
    for cmd, status in cmds:
        lines += [
            f"echo '>>> {cmd.replace(chr(39), '')}'",
            cmd,
            f's=$?; if [ $s -ne {status} ]; then echo "FAILED (exit $s, expected {status})"; exit 1; fi',
        ]
    return "\n".join(lines)


def test_the_page_lists_the_walk():
    cmds = [c for c, _ in commands(PAGE.read_text())]
    for step in ("hetero check-model", "--per-op", "hetero conformance", "-k", "hetero profile", "--trace"):
        assert any(step in c for c in cmds), step


@pytest.mark.skipif(sys.platform != "linux", reason="the page's commands are POSIX shell")
def test_every_command_of_the_page_runs(tmp_path):
    pytest.importorskip("triton")
    env = {
        **os.environ,
        "HETERO": str(ROOT),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "OMP_NUM_THREADS": "1",
    }
    env.pop("PYTHONPATH", None)
    run = subprocess.run(
        ["bash", "-c", script(commands(PAGE.read_text()))],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, (run.stdout + run.stderr)[-6000:]
    assert "op at fault: paged_attention in layer 0" in run.stdout
    assert "paged_attention 0 self_attn.attn" in run.stdout
    assert "(demo_bug, float32, rank 1)" in run.stdout  # torchrun: rank 0 printed rank 1's replay too
    # the cuda kernels (interpreted) in bf16 against a tolerance tighter than bf16: drift, every op call in bounds
    assert "accumulated rounding, no op at fault" in run.stdout
    assert "trace events" in run.stdout

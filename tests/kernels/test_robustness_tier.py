"""The robustness tier on the Triton backends under the interpreter, as CI runs it.

With validation on, every malformed call must be rejected with an OpError naming the op.
With it off, index-content defects may return garbage, but nothing may crash, hang or
raise an unclear error: the kernels mask every index they load. Under the interpreter both
vendors run the same portable kernels, so rocm's run covers the ops its ``supports()`` decides
differently (fp8 encodings), as in tests/kernels/test_backends.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from hetero_conformance.cases.malformed import catalog


@pytest.mark.parametrize("backend", ["cuda", "rocm"])
def test_interpreted_triton_backend_passes_the_robustness_tier(backend, tmp_path):
    env = dict(os.environ, HETERO_TRITON_INTERPRET="1", TRITON_INTERPRET="1")
    env.pop("HETERO_VALIDATE", None)
    from hetero.kernels.limits import QUANT_OPS

    fp8_ops = {*QUANT_OPS, "quantize_activation", "fused_moe"}
    cases = [c for c in catalog() if backend == "cuda" or c.op in fp8_ops]
    only = [] if backend == "cuda" else ["--ops", ",".join(sorted(fp8_ops))]
    total, index_defects = len(cases), sum(1 for c in cases if c.index)
    for mode, flags in (("on", []), ("off", ["--no-validate"])):
        out = tmp_path / f"{mode}.json"
        proc = subprocess.run(
            [sys.executable, "-m", "hetero.cli", "conformance", backend, "--robustness", *only, *flags]
            + ["--json", str(out)],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        calls = json.loads(out.read_text())["robustness"]["calls"]
        statuses = {c["id"]: c["status"] for c in calls}
        assert len(statuses) == total
        if mode == "on":
            assert set(statuses.values()) == {"rejected"}, statuses
        else:
            assert set(statuses.values()) <= {"rejected", "silent"}, statuses
            assert sum(s == "silent" for s in statuses.values()) <= index_defects

"""Caches between instances of different tensor-parallel sizes: exported from a TP=2 engine (each rank's KV
heads, linear-attention channels and state heads gathered into place on rank 0) and imported into a TP=1
engine, and the reverse (cut into each rank's part), with greedy tokens equal to one engine's; both sides'
KV link identities equal, as a TP=1 pair's are. qwen3_next: gated attention's KV heads, and Gated DeltaNet's
conv channels (q|k|v, each cut in rank order) and state heads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch
from _serving import prompts

from hetero.distributed import free_port
from hetero.engine import LLM, SamplingParams
from hetero.serve.pd.identity import Identity, refusal

WORKER = Path(__file__).with_name("_pd_tp_worker.py")
ONE = dict(backend="cpu_ref", dtype="float32", block_size=16, max_num_seqs=8)
GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
ARCHS = ("qwen3_next",)  # (GQA across sizes, served: test_serve_pd.py)


def _exported(llm: LLM, ps: list[list[int]]) -> list:
    """Each prompt but its last token computed and exported, as a prefill instance does."""
    for i, p in enumerate(ps):
        llm.add_request(p[:-1], SamplingParams(temperature=0.0, max_tokens=2), f"e{i}")
    caches = {}
    while len(caches) < len(ps):
        for out in llm.step():
            caches[out.request_id] = llm.export_cache(out.request_id)
            llm.abort(out.request_id)
    return [caches[f"e{i}"] for i in range(len(ps))]


def test_caches_cross_tensor_parallel_sizes_with_one_engines_tokens(checkpoints, tmp_path):
    ps = prompts(3, seed=21)
    jobs, want = [], {}
    for arch in ARCHS:
        path = str(checkpoints(arch))
        want[arch] = [o.token_ids for o in LLM(path, **ONE).generate(ps, GREEDY, progress=False)]
        torch.save(_exported(LLM(path, **ONE), ps), tmp_path / f"{arch}.tp1.pt")
        files = {k: str(tmp_path / f"{arch}.{k}") for k in ("import", "export", "tokens")}
        jobs.append({"model": path, "prompts": ps, **files, "import": str(tmp_path / f"{arch}.tp1.pt")})
    (tmp_path / "jobs.json").write_text(json.dumps(jobs))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1"]
    cmd += ["--master-port", str(free_port()), str(WORKER), str(tmp_path / "jobs.json")]
    run = subprocess.run(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-4000:]
    for arch, job in zip(ARCHS, jobs):
        got = json.loads(Path(job["tokens"]).read_text())  # TP=1 -> TP=2
        assert got["tokens"] == want[arch] and got["computed"] == 3 * 8, arch
        saved = torch.load(job["export"], weights_only=False)  # TP=2 -> TP=1
        one = LLM(job["model"], **ONE)
        assert refusal(Identity.of(one, "decode"), saved["identity"]) is None and saved["identity"].tp == 2
        for i, (p, cache) in enumerate(zip(ps, saved["caches"])):
            assert cache.num_tokens == len(p) - 1
            one.add_request(p, GREEDY, f"r{i}", cache=cache)
        done = {}
        while one.has_unfinished():
            done.update((o.request_id, o.token_ids) for o in one.step() if o.finished)
        assert [done[f"r{i}"] for i in range(3)] == want[arch], arch
        assert sum(one.stats["step_tokens"]) == 3 * 8, "only each last prompt token and the outputs were computed"

"""Pipeline parallelism under torchrun over gloo: the same tokens as one process, each stage holding its own
layers' weights and cache; the partition rule and its errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _hf import prompts

from hetero.distributed import free_port
from hetero.engine.pipeline import parse_partition, partition
from hetero.errors import UsageError

WORKER = Path(__file__).with_name("_pipeline_worker.py")
FAMILIES = ("qwen3", "qwen3_moe", "deepseek_v3", "deepseek_v32", "qwen3_next")


def _torchrun(jobs: list[dict], tmp_path: Path, nproc: int) -> list[list[dict]]:
    """Per rank, per job: the worker's record."""
    jobs_path, out_path = tmp_path / "jobs.json", tmp_path / "out.json"
    jobs_path.write_text(json.dumps(jobs))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), "--master-addr"]
    cmd += ["127.0.0.1", "--master-port", str(free_port()), str(WORKER), str(jobs_path), str(out_path)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-4000:]
    return [json.loads(Path(f"{out_path}.{r}").read_text()) for r in range(nproc)]


def _one_process(jobs: list[dict]) -> list[dict]:
    sys.path.insert(0, str(WORKER.parent))
    from _pipeline_worker import run

    single = ("tensor_parallel_size", "pipeline_parallel_size", "pp_layer_partition", "expert_parallel")
    return [run({**job, "engine": {k: v for k, v in job["engine"].items() if k not in single}}) for job in jobs]


def _job(model, max_tokens: int = 6, rounds=None, logprobs=None, abort_after=None, **engine) -> dict:
    base = dict(model=str(model), backend="cpu_ref", dtype="float32", max_num_seqs=8, block_size=8)
    rounds = rounds or [prompts(256, (6, 13, 29, 9), seed=3)]
    job = {"engine": {**base, **engine}, "rounds": rounds, "max_tokens": max_tokens, "logprobs": logprobs}
    return dict(job, abort_after=abort_after) if abort_after else job


def _check(jobs, got, want, what):
    for i, (job, w) in enumerate(zip(jobs, want)):
        name = f"{Path(job['engine']['model']).name} {what} (job {i})"
        for rank, per_rank in enumerate(got):
            assert per_rank[i]["tokens"] == w["tokens"], f"{name}: rank {rank}'s tokens differ from one process"
        assert got[0][i]["logprobs"] == w["logprobs"], f"{name}: logprobs differ from one process"


def test_pp2_is_one_process_for_every_family_and_a_mixed_batch(checkpoints, tmp_path):
    from hetero.tools import tiny

    tied = tiny.build("qwen3", tmp_path / "tied", tie_word_embeddings=True)
    jobs = [_job(checkpoints(a), pipeline_parallel_size=2) for a in FAMILIES]
    jobs.append(_job(tied, pipeline_parallel_size=2))
    # HY4: hyper-connection streams travel between the stages, and so do the indices of the full indexer
    # layer that stage 1's first (shared) layer reads
    jobs.append(_job(checkpoints("hy_v4"), pipeline_parallel_size=2))
    # chunked prefill (8-token budget), preemption (few blocks), prefix hits (a second round sharing a
    # 16-token prefix), logprobs and n-gram drafts, on a dense and a hybrid model
    shared = prompts(256, (16,), seed=9)[0]
    rounds = [[shared + p for p in prompts(256, (5, 11), seed=4)], [shared + p for p in prompts(256, (3, 7), seed=5)]]
    mixed = dict(rounds=rounds, logprobs=2, max_num_batched_tokens=8, num_kv_blocks=6, pipeline_parallel_size=2)
    spec = {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 2}
    jobs += [
        _job(checkpoints("qwen3"), 10, **mixed),
        _job(checkpoints("qwen3_next"), 10, **mixed, speculative_config=spec),
    ]
    want = _one_process(jobs)
    # abort: rank 0 ends a request while its micro-batch is in the pipeline; the others run on
    abort = _job(checkpoints("qwen3"), 12, pipeline_parallel_size=2, abort_after=3)
    jobs.append(abort)
    got = _torchrun(jobs, tmp_path, 2)
    aborted = [g.pop() for g in got]
    jobs.pop()
    _check(jobs, got, want, "PP=2")
    assert aborted[0]["aborted"] and aborted[0]["blocks_in_use"] == 0, aborted[0]
    rest = {k: v for k, v in abort.items() if k != "abort_after"}
    alone = _one_process([dict(rest, rounds=[abort["rounds"][0][1:]])])[0]["tokens"]
    assert aborted[0]["tokens"] == alone, "the requests beside the aborted one changed"
    for i in (-2, -1):
        for stats in (got[0][i]["stats"], want[i]["stats"]):
            assert stats["preemptions"] > 0 and stats["cached_prompt_tokens"] > 0, (i, stats)
    for i in (0, 5):  # each stage holds about half the weights; the tied embedding is on both stages
        whole, stages = want[i]["weight_bytes"], [got[r][i]["weight_bytes"] for r in range(2)]
        assert max(stages) < 0.62 * whole and sum(stages) >= whole, (whole, stages)
        kv = [got[r][i]["kv_bytes"] for r in range(2)]
        assert kv[0] == kv[1] and kv[0] < 0.51 * want[i]["kv_bytes"] * 2, (want[i]["kv_bytes"], kv)


def test_pp3_on_odd_layer_counts_and_a_partition(checkpoints, tmp_path):
    from hetero.tools import tiny

    five = tiny.build("qwen3", tmp_path / "five", num_hidden_layers=5)
    moe = tiny.build("qwen3_moe", tmp_path / "moe", num_hidden_layers=3)
    jobs = [_job(five, pipeline_parallel_size=3), _job(five, pipeline_parallel_size=3, pp_layer_partition="1,3,1")]
    jobs.append(_job(moe, pipeline_parallel_size=3))
    archs = ("deepseek_v3", "deepseek_v32", "qwen3_next", "deepseek_v4")  # V4: one compressed layer kind a stage
    jobs += [_job(checkpoints(a), pipeline_parallel_size=3) for a in archs]
    want = _one_process(jobs)
    got = _torchrun(jobs, tmp_path, 3)
    _check(jobs, got, want, "PP=3")
    assert got[1][1]["weight_bytes"] > got[1][0]["weight_bytes"], "the partition gave stage 1 three layers"


def test_tp2_by_pp2_on_four_processes(checkpoints, tmp_path):
    jobs = [_job(checkpoints(a), tensor_parallel_size=2, pipeline_parallel_size=2) for a in FAMILIES]
    jobs.append(_job(checkpoints("qwen3_moe"), tensor_parallel_size=2, pipeline_parallel_size=2, expert_parallel=True))
    want = _one_process(jobs)
    got = _torchrun(jobs, tmp_path, 4)
    _check(jobs, got, want, "TP=2 x PP=2")


def test_the_partition_rule_and_its_errors():
    assert partition(5, 3) == [2, 2, 1] and partition(4, 2) == [2, 2] and partition(7, 4) == [2, 2, 2, 1]
    assert partition(10, 4) == [2, 3, 3, 2]  # the remainder before the last stage, nearest it first
    assert partition(5, 3, parse_partition("1,3,1")) == [1, 3, 1] and parse_partition([2, 3]) == (2, 3)
    for bad in ((2, 3), (1, 1, 2), (0, 4, 1)):
        with pytest.raises(UsageError, match="pp_layer_partition"):
            partition(5, 3, bad)
    with pytest.raises(UsageError, match="pipeline_parallel_size=3 needs at least one decoder layer"):
        partition(2, 3)
    for bad in ("1,x", [1.5], [True, 2], 3):
        with pytest.raises(UsageError, match="pp_layer_partition"):
            parse_partition(bad)


def test_engine_refusals(checkpoints):
    from hetero.engine import LLM

    path = checkpoints("qwen3")
    with pytest.raises(UsageError, match=r"pipeline_parallel_size=2 needs one process per rank.*torchrun"):
        LLM(path, backend="cpu_ref", pipeline_parallel_size=2)
    with pytest.raises(UsageError, match="splits the layers over 2 stages but pipeline_parallel_size is 1"):
        LLM(path, backend="cpu_ref", pp_layer_partition=[1, 1])


def test_a_dead_stage_stops_the_server_with_a_message(checkpoints):
    """Two ranks started by hand, as on two machines (no torchrun agent to stop the survivor): SIGKILL of
    rank 1 ends rank 0's server within seconds, saying why, instead of a hang."""
    pytest.importorskip("fastapi")
    from _serving import healthy

    port, http = free_port(), free_port()
    procs = []
    for rank in (0, 1):
        env = {**os.environ, "OMP_NUM_THREADS": "1", "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2"}
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), HETERO_COMM_TIMEOUT="30")
        cmd = [sys.executable, "-m", "hetero.cli", "serve", "--model", str(checkpoints("qwen3")), "--backend"]
        cmd += ["cpu_ref", "--dtype", "float32", "--pipeline-parallel-size", "2", "--port", str(http)]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    try:
        deadline = time.monotonic() + 120
        while not healthy(f"http://127.0.0.1:{http}"):
            assert procs[0].poll() is None and time.monotonic() < deadline, procs[0].stdout.read()[-3000:]
            time.sleep(0.2)
        procs[1].kill()
        procs[0].wait(60)
        out = procs[0].stdout.read()
        assert "the ranks' group is broken" in out, out[-3000:]
    finally:
        for p in procs:
            p.kill()

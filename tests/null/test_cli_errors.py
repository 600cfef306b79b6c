"""User errors on the `hetero` command line: one line ``hetero <command>: error: ...`` and exit 2.

``--debug`` (before or after the subcommand) and ``HETERO_DEBUG=1`` show the traceback
instead; an exception that is not a user error (a bug in a backend op, an OpError from
inside the engine's forward) keeps its traceback.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import hetero
import hetero.registry
from hetero.cli import main
from hetero.errors import ModelNotFound, OpError

NO_MODEL = "/nonexistent/hetero-model"


@pytest.fixture(autouse=True)
def no_debug(monkeypatch):
    monkeypatch.delenv("HETERO_DEBUG", raising=False)


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    """A one-layer random qwen3 checkpoint (vocabulary 256, max_position_embeddings 512)."""
    pytest.importorskip("transformers")
    from hetero.tools import tiny

    return str(tiny.build("qwen3", tmp_path_factory.mktemp("qwen3"), shard_size=None, num_hidden_layers=1))


def _registry(**backends) -> hetero.Registry:
    """The reference plus ``backends`` (name -> Backend subclass)."""
    import hetero_cpu_ref.plugin

    classes = list(backends.values())

    class Plugin:
        @hetero.hookimpl
        def hetero_backends(self):
            return classes

    registry = hetero.Registry(entry_points=[], env={})
    registry.register(hetero_cpu_ref.plugin, "cpu_ref")
    registry.register(Plugin(), "test-plugin", version="1.0")
    return registry


def _twin(name: str, **ops):
    """The reference backend under another name, with ``ops`` replaced."""
    from hetero_cpu_ref.plugin import CpuRefBackend

    return type(name, (CpuRefBackend,), {"name": name, "priority": 0, **{k: staticmethod(v) for k, v in ops.items()}})


def _unavailable():
    cls = _twin("offline")
    cls.probe = classmethod(lambda c: hetero.Availability(ok=False, reason="no offline device visible"))
    return cls


def one_line(capsys, argv, *parts, registry=None) -> str:
    """Run ``hetero argv``: exit 2 and a single stderr line ``hetero <command>: error: ...`` containing ``parts``."""
    assert main(argv, registry=registry) == 2
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert len(lines) == 1, err
    command = next(a for a in argv if not a.startswith("-"))
    assert lines[0].startswith(f"hetero {command}: error: "), err
    for part in parts:
        assert part in lines[0], lines[0]
    return lines[0]


def test_a_missing_or_foreign_model_directory(capsys, tmp_path):
    one_line(capsys, ["generate", "--model", NO_MODEL, "--prompt-ids", "1 2"], "argument --model", repr(NO_MODEL))
    one_line(capsys, ["generate", "--model", str(tmp_path), "--prompt-ids", "1 2"], "config.json", str(tmp_path))
    one_line(capsys, ["check-model", NO_MODEL], "does not exist")
    one_line(capsys, ["bench-engine", "--model", str(tmp_path)], "argument --model", "config.json")


def test_an_unsupported_architecture_or_unreadable_config(capsys, tmp_path):
    pytest.importorskip("transformers")
    llama, broken = tmp_path / "llama", tmp_path / "broken"
    llama.mkdir(), broken.mkdir()
    (llama / "config.json").write_text(json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"]}))
    (broken / "config.json").write_text('{"model_type": ')
    one_line(
        capsys,
        ["generate", "--model", str(llama), "--prompt-ids", "1"],
        "'LlamaForCausalLM' is not supported",
        "Qwen3ForCausalLM",
    )
    one_line(capsys, ["generate", "--model", str(broken), "--prompt-ids", "1"], "is not a config transformers can read")


def test_bad_requests(capsys, model):
    gen = ["generate", "--model", model, "--backend", "cpu_ref"]
    one_line(capsys, [*gen, "--prompt-ids", "1 256"], "request 0", "'prompt'", "vocab_size=256", "256 at position 1")
    one_line(capsys, [*gen, "--prompt-ids", "-1 2"], "request 0", "-1 at position 0")
    one_line(
        capsys,
        [*gen, "--prompt-ids", "1", "--prompt-ids", " ".join(["7"] * 600)],
        "request 1",
        "prompt of 600 tokens is longer than max_model_len (512)",
    )
    one_line(capsys, gen, "--prompt/--prompt-ids", "at least one prompt")


@pytest.mark.parametrize(
    "option, value, expected",
    [
        ("--max-tokens", "0", "argument --max-tokens: expected an integer >= 1, got 0"),
        ("--max-tokens", "-3", "argument --max-tokens: expected an integer >= 1, got -3"),
        ("--temperature", "-1", "argument --temperature: expected a finite number >= 0"),
        ("--top-p", "1.5", "argument --top-p: expected a number in (0, 1], got 1.5"),
        ("--top-k", "-1", "argument --top-k: expected an integer >= 0"),
        ("--dtype", "int8", "argument --dtype: expected 'auto' or one of float32, bfloat16, float16, got 'int8'"),
        ("--block-size", "0", "argument --block-size: expected an integer >= 1, got 0"),
    ],
)
def test_bad_generate_options_name_the_option(capsys, model, option, value, expected):
    one_line(
        capsys, ["generate", "--model", model, "--backend", "cpu_ref", "--prompt-ids", "1 2", option, value], expected
    )


def test_argparse_errors_are_one_line_too(capsys, model):
    with pytest.raises(SystemExit) as exit_:
        main(["generate", "--model", model, "--prompt-ids", "1 two"])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.splitlines() == [
        "hetero generate: error: argument --prompt-ids: expected token ids (integers separated by spaces), got '1 two'"
    ]
    with pytest.raises(SystemExit):
        main(["backends", "--bogus"])
    assert capsys.readouterr().err.splitlines() == ["hetero backends: error: unrecognized arguments: --bogus"]


def test_unknown_and_unavailable_backends(capsys, model, monkeypatch):
    registry = _registry(offline=_unavailable())
    one_line(capsys, ["explain", "nosuch"], "unknown hetero backend 'nosuch'", registry=registry)
    one_line(
        capsys, ["generate", "--model", model, "--backend", "cpu-ref", "--prompt-ids", "1"], "did you mean 'cpu_ref'"
    )
    one_line(capsys, ["bench", "nosuch"], "unknown hetero backend", registry=registry)
    one_line(
        capsys,
        ["bench", "offline", "--ops", "rms_norm"],
        "'offline' is unavailable: no offline device visible",
        registry=registry,
    )
    monkeypatch.setattr(hetero.registry, "default_registry", lambda: registry)
    one_line(capsys, ["generate", "--model", model, "--backend", "offline", "--prompt-ids", "1"], "no offline device")


def test_check_model_options(capsys, model):
    one_line(capsys, ["check-model", model, "--dtype", "foo"], "argument --dtype", "'foo'")
    one_line(capsys, ["check-model", model, "--prompt-ids", "1 300"], "argument --prompt-ids", "vocab_size=256", "300")
    one_line(capsys, ["check-model", model, "--reference", NO_MODEL], "argument --reference", NO_MODEL)


def test_bench_and_bench_engine_inputs(capsys, model, tmp_path):
    corrupt = tmp_path / "corrupt.json"
    corrupt.write_text("{not json")
    one_line(capsys, ["bench", "cpu_ref", "--ops", "gemm,nosuch"], "argument --ops", "nosuch")
    one_line(
        capsys, ["bench", "cpu_ref", "--compare", str(tmp_path / "none.json")], "argument --compare", "no baseline"
    )
    one_line(capsys, ["bench", "cpu_ref", "--compare", str(corrupt)], "not a readable JSON baseline")
    one_line(capsys, ["bench", "cpu_ref", "--threads", "0"], "argument --threads", "got 0")
    engine = ["bench-engine", "--model", model, "--backend", "cpu_ref"]
    one_line(capsys, [*engine, "--compare", str(corrupt)], "argument --compare", "not a readable JSON baseline")
    one_line(capsys, [*engine, "--compare", str(tmp_path / "none.json")], "no baseline")
    one_line(capsys, [*engine, "--input-len", "5:1"], "argument --input-len", "'5:1'")
    one_line(capsys, [*engine, "--num-requests", "0"], "argument --num-requests: expected an integer >= 1, got 0")


def test_new_backend_and_conformance(capsys, tmp_path):
    one_line(capsys, ["new-backend", "Bad-Name", "--dir", str(tmp_path)], "invalid backend name 'Bad-Name'")
    one_line(capsys, ["conformance", "nosuch"], "nosuch", registry=_registry())


def test_debug_shows_the_traceback(capsys, monkeypatch):
    argv = ["generate", "--model", NO_MODEL, "--prompt-ids", "1"]
    with pytest.raises(ModelNotFound):
        main(["--debug", *argv])
    with pytest.raises(ModelNotFound):
        main([*argv, "--debug"])
    monkeypatch.setenv("HETERO_DEBUG", "1")
    with pytest.raises(ModelNotFound):
        main(argv)
    monkeypatch.setenv("HETERO_DEBUG", "0")
    one_line(capsys, argv, "argument --model")


def _raises(error: Exception):
    def op(*args, **kwargs):
        raise error

    return op


@pytest.mark.parametrize(
    "error",
    [
        RuntimeError("kernel crashed"),
        IndexError("index 7 is out of bounds"),
        OpError("rms_norm", "x", "a 2-D tensor", "a 3-D tensor"),
    ],
)
def test_a_backend_bug_keeps_its_traceback(model, monkeypatch, error):
    registry = _registry(buggy=_twin("buggy", rms_norm=_raises(error)))
    monkeypatch.setattr(hetero.registry, "default_registry", lambda: registry)
    with pytest.raises(type(error), match=str(error)[:10]):
        main(["generate", "--model", model, "--backend", "buggy", "--prompt-ids", "1 2"])


def test_the_command_prints_one_line_in_a_real_process():
    hetero_cmd = Path(sys.executable).with_name("hetero")
    cmd = [str(hetero_cmd)] if hetero_cmd.exists() else [sys.executable, "-m", "hetero.cli"]
    run = subprocess.run(
        [*cmd, "generate", "--model", NO_MODEL, "--prompt-ids", "1 2"],
        capture_output=True,
        text=True,
        env={**os.environ, "HETERO_DEBUG": ""},
    )
    assert run.returncode == 2
    assert run.stderr.splitlines() == [
        f"hetero generate: error: argument --model: expected an existing checkpoint directory, got {NO_MODEL!r}"
    ]
    assert "Traceback" not in run.stderr and run.stdout == ""

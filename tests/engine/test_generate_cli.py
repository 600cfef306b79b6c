"""`hetero generate` and the engine's user-facing errors."""

from __future__ import annotations

import json

import pytest

from hetero.cli import main


def test_generate_json_text_and_ids(checkpoints, capsys):
    from hetero.engine import LLM, SamplingParams

    path = str(checkpoints("qwen3"))
    argv = [
        "generate",
        "--model",
        path,
        "--backend",
        "cpu_ref",
        "--dtype",
        "float32",
        "--prompt",
        "Hello, hetero",
        "--prompt-ids",
        "5 6 7 8",
        "--max-tokens",
        "6",
        "--ignore-eos",
        "--json",
    ]
    assert main(argv) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["prompt_token_ids"][-4:] for r in lines][1] == [5, 6, 7, 8]
    assert all(len(r["token_ids"]) == 6 and r["finish_reason"] == "length" for r in lines)
    assert "text" in lines[0] and isinstance(lines[0]["text"], str)
    llm = LLM(path, backend="cpu_ref", dtype="float32")
    want = llm.generate(
        ["Hello, hetero", [5, 6, 7, 8]], SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True), progress=False
    )
    assert [r["token_ids"] for r in lines] == [list(o.token_ids) for o in want]
    assert lines[0]["text"] == want[0].text


def test_generate_without_prompts_is_a_usage_error(checkpoints, capsys):
    assert main(["generate", "--model", str(checkpoints("qwen3")), "--backend", "cpu_ref"]) == 2
    assert "--prompt" in capsys.readouterr().err


def test_unsupported_architecture_lists_the_supported_ones(tmp_path):
    from hetero.engine.models import ARCHITECTURES, UnsupportedArchitecture, model_class

    with pytest.raises(UnsupportedArchitecture) as err:
        model_class(["LlamaForCausalLM"])
    assert "LlamaForCausalLM" in str(err.value) and all(a in str(err.value) for a in ARCHITECTURES)
    with pytest.raises(UnsupportedArchitecture, match="no 'architectures'"):
        model_class(None)


def test_bad_prompt_ids_are_a_usage_error_naming_the_option(checkpoints, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["generate", "--model", str(checkpoints("qwen3")), "--backend", "cpu_ref", "--prompt-ids", "1 two 3"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "--prompt-ids" in err and "'1 two 3'" in err

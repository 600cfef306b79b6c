"""`hetero check-model`: agreement on a sound checkpoint, and the first bad layer named on a corrupted one."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from hetero.cli import main


@pytest.fixture(scope="module")
def four_layers(tmp_path_factory):
    from hetero.tools import tiny

    return tiny.build("qwen3", tmp_path_factory.mktemp("qwen3_4l"), num_hidden_layers=4)


def _corrupt(src, dst, name: str) -> None:
    """Copy the checkpoint and scale one tensor by 1.5 in the copy."""
    shutil.copytree(src, dst)
    index = json.loads((dst / "model.safetensors.index.json").read_text())
    shard = dst / index["weight_map"][name]
    tensors = load_file(shard)
    tensors[name] = tensors[name] * 1.5
    save_file(tensors, shard, metadata={"format": "pt"})


def test_sound_checkpoint_agrees_everywhere(four_layers):
    from hetero.tools.check import ModelCheck

    report = ModelCheck(four_layers, "cpu_ref").run(max_tokens=8)
    assert report.passed and report.first_bad is None
    assert [r.name for r in report.layers] == [
        "embedding",
        "layer 0",
        "layer 1",
        "layer 2",
        "layer 3",
        "final norm",
        "logits",
    ]
    assert max(r.rel_l2 for r in report.layers) < 1e-5
    assert all(d.position is None for d in report.greedy) and len(report.greedy) == 3


def test_corrupted_layer_is_named_where_the_error_starts(four_layers, tmp_path, capsys):
    bad = tmp_path / "bad"
    _corrupt(four_layers, bad, "model.layers.2.mlp.down_proj.weight")
    assert (
        main(
            [
                "check-model",
                str(bad),
                "--reference",
                str(four_layers),
                "--backend",
                "cpu_ref",
                "--max-tokens",
                "4",
                "--json",
            ]
        )
        == 1
    )
    report = json.loads(capsys.readouterr().out)
    assert report["first_bad"] == "layer 2" and not report["passed"]
    errors = {r["name"]: r["rel_l2"] for r in report["layers"]}
    assert errors["layer 1"] < 1e-5 < errors["layer 2"]
    assert (
        main(["check-model", str(bad), "--reference", str(four_layers), "--backend", "cpu_ref", "--max-tokens", "0"])
        == 1
    )
    assert "the error starts at layer 2" in capsys.readouterr().out


def test_drifting_op_is_caught_in_memory(four_layers):
    """A model perturbed after loading (as a drifting kernel would) fails from that layer on."""
    from hetero.tools.check import ModelCheck

    check = ModelCheck(four_layers, "cpu_ref")
    with torch.no_grad():
        check.model.model.layers[3].self_attn.o_proj.weight.mul_(1.01)
    report = check.run(max_tokens=0)
    assert report.first_bad == "layer 3" and not report.passed

"""The `hetero backends` and `hetero explain` commands: tables, JSON and exit codes."""

from __future__ import annotations

import json

from plugin_sources import BROKEN_ON_IMPORT

from hetero import Registry
from hetero.cli import main
from hetero.spec import OP_NAMES


def test_backends_table_and_json(capsys, make_dist):
    make_dist("badchip", BROKEN_ON_IMPORT)
    assert main(["backends"], registry=Registry()) == 0
    out = capsys.readouterr().out
    assert "cpu_ref" in out and "available" in out and "broken" in out
    assert main(["backends", "--json"], registry=Registry()) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)["backends"]}
    assert rows["cpu_ref"]["native_ops"] == list(OP_NAMES) and rows["cpu_ref"]["fallback_ops"] == []


def test_explain_json_lists_every_op(capsys):
    assert main(["explain", "cpu_ref", "--json"], registry=Registry()) == 0
    report = json.loads(capsys.readouterr().out)
    assert [o["op"] for o in report["ops"]] == list(OP_NAMES)
    assert {o["origin"] for o in report["ops"]} == {"backend"}
    assert report["spec_version"] == report["backend_spec_version"]


def test_unknown_backend_exits_2_with_a_suggestion(capsys):
    assert main(["explain", "cpu-ref"], registry=Registry()) == 2
    err = capsys.readouterr().err
    assert "did you mean 'cpu_ref'" in err


def test_explain_of_a_broken_plugin_exits_1(capsys, make_dist):
    make_dist("badchip", BROKEN_ON_IMPORT)
    assert main(["explain", "badchip"], registry=Registry()) == 1
    assert "libvendor.so" in capsys.readouterr().out

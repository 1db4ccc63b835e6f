"""The ``tokenrails`` command, run in-process (the model is loaded once per test session)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tokenrails import native
from tokenrails.cli import main, parse_spec_arg
from tokenrails.guided.errors import InvalidGuideError

FIXTURE_TOKENIZER = str(Path(__file__).parent / "fixtures" / "smollm2")


def test_parse_spec_arg_forms(tmp_path):
    schema = tmp_path / "s.json"
    schema.write_text('{"type": "integer"}')
    grammar = tmp_path / "g.gbnf"
    grammar.write_text('root ::= "a"')
    assert parse_spec_arg(str(schema)).kind == "json_schema"
    assert parse_spec_arg(str(grammar)).ebnf == 'root ::= "a"'
    assert parse_spec_arg("regex:a|b").pattern == "a|b"
    assert parse_spec_arg("choice:x,y z").choices == ["x", "y z"]
    assert parse_spec_arg('json:{"type":"string"}').schema == {"type": "string"}
    with pytest.raises(InvalidGuideError):
        parse_spec_arg("something.txt")


def test_check_reports_support_and_compile_time(tmp_path, capsys):
    schema = tmp_path / "person.json"
    schema.write_text(json.dumps({"type": "object", "properties": {"name": {"type": "string"}}}))
    rc = main(["check", "--tokenizer", FIXTURE_TOKENIZER, "--backend", "xgrammar", str(schema),
               r"regex:\d{3}", "choice:red,green"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert out.count("xgrammar    ok") == 3 and "compile" in out and " ms" in out
    assert "3/3 specs supported" in out


def test_check_json_output_and_rejection_exits_nonzero(tmp_path, capsys):
    bad = tmp_path / "bad.ebnf"
    bad.write_text('root ::= ( "a"\n')
    rc = main(["check", "--tokenizer", FIXTURE_TOKENIZER, "--backend", "xgrammar", "--json", str(bad), "regex:a+"])
    report = json.loads(capsys.readouterr().out)
    assert set(report["native"]) == set(native.MODULES)
    assert rc == 1
    bad_entry, good_entry = report["specs"]
    assert bad_entry["supported_by"] == [] and "InvalidGuideError" in bad_entry["backends"]["xgrammar"]["error"]
    assert "EBNF" in bad_entry["backends"]["xgrammar"]["error"] or "Expect" in bad_entry["backends"]["xgrammar"]["error"]
    assert good_entry["supported_by"] == ["xgrammar"]


def test_check_unreadable_spec_exits_nonzero(tmp_path, capsys):
    rc = main(["check", "--tokenizer", FIXTURE_TOKENIZER, str(tmp_path / "missing.json")])
    out = capsys.readouterr().out
    assert rc == 1 and "REJECTED before compiling" in out and "missing.json" in out


def test_lmdeploy_subcommand_is_dispatched(capsys, monkeypatch):
    import sys
    import types

    seen = {}
    fake = types.ModuleType("tokenrails.engine_patch.lmdeploy.lmdeploy_cli")
    fake.main = lambda argv: seen.setdefault("argv", argv) and 0
    parent = types.ModuleType("tokenrails.engine_patch.lmdeploy")
    parent.cli = fake
    monkeypatch.setitem(sys.modules, "tokenrails.engine_patch.lmdeploy", parent)
    monkeypatch.setitem(sys.modules, "tokenrails.engine_patch.lmdeploy.lmdeploy_cli", fake)
    assert main(["lmdeploy", "serve", "api_server", "--help"]) == 0
    assert seen["argv"] == ["serve", "api_server", "--help"]


def test_bench_without_matching_scripts(capsys):
    rc = main(["bench", "--only", "no-such-benchmark-name"])
    out = capsys.readouterr().out
    assert rc == 0 and "summary" in out


@pytest.mark.slow
def test_demo_prints_outputs_validity_and_metrics(capsys):
    rc = main(["demo", "--quiet"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert out.count("valid: True") == 3
    for needle in ("json schema extraction", "regex (ISO date)", "choice (sentiment)", "grammar_init_s",
                   "grammar_per_token_s", "tokens/s", "forward passes", "jump-forward appended"):
        assert needle in out, needle
    record = next(line for line in out.splitlines() if line.strip().startswith("output: {"))
    json.loads(record.split("output: ", 1)[1])


@pytest.mark.slow
def test_generate_json_output(capsys, tmp_path):
    rc = main(["generate", "Pick a colour.", "--choice", "red", "green", "--chat", "--json", "--quiet",
               "--max-tokens", "8"])
    result = json.loads(capsys.readouterr().out)
    assert rc == 0 and result["text"] in ("red", "green") and result["valid"] is True
    assert result["finish_reason"] == "stop" and "grammar_per_token_s" in result
    schema = tmp_path / "s.json"
    schema.write_text('{"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}')
    rc = main(["generate", "Give x.", "--json-schema", str(schema), "--json", "--quiet", "--max-tokens", "3"])
    result = json.loads(capsys.readouterr().out)
    assert rc == 1 and result["finish_reason"] == "length" and result["valid"] is False


def test_generate_bad_spec_exits_nonzero_with_error(capsys, tmp_path):
    rc = main(["generate", "hi", "--json-schema", str(tmp_path / "nope.json"), "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2 and "nope.json" in err


def test_check_tries_every_available_backend(capsys):
    from tokenrails.guided.registry import available_backends

    rc = main(["check", "--tokenizer", FIXTURE_TOKENIZER, "--json", "regex:(a", "choice:x,y"])
    report = json.loads(capsys.readouterr().out)
    assert rc == 1
    assert report["backends"] == available_backends()
    bad, good = report["specs"]
    assert set(bad["backends"]) == set(available_backends()) and bad["supported_by"] == []
    assert all(not r["ok"] and r["error"] for r in bad["backends"].values())
    assert good["supported_by"] and all(good["backends"][n]["compile_s"] >= 0 for n in good["supported_by"])


@pytest.mark.slow
def test_check_uses_the_embedded_tokenizer_by_default(capsys):
    rc = main(["check", "--backend", "xgrammar", "--json", "regex:[0-9]+"])
    report = json.loads(capsys.readouterr().out)
    assert rc == 0 and report["specs"][0]["supported_by"] == ["xgrammar"]
    assert "tokenrails" in report["tokenizer"] or "SmolLM2" in report["tokenizer"]

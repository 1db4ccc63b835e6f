"""Tensor parallel on LMDeploy 0.18's real engine, CPU path (cpu/distributed.py, tp_ranks.py).

SmolLM2-135M (9 heads, 3 KV heads) at TP = 3 against TP = 1, float32, greedy, one batch of every
guided kind (json_schema, regex, choice, grammar, a tool call as a structural tag) plus an unguided
row: token for token the same, stock and upgraded side by side, each engine in its own process
(tp_child.py). Stock refuses ``choice`` and ``grammar`` (it has neither) at both sizes. The upgraded
TP = 3 run also reports each rank's guided CPU work: only rank 0 (the rank that samples) has any,
and it compiles nothing (the engine process compiles),
and times a request whose grammar compiles slowly beside a streaming one: the slow row waits
outside the batch while the other keeps decoding (its grammar compiles in the engine process,
where the scheduler is, and reaches the ranks with the row).

The upgraded runs start as a user's script does (``activate()`` at module level, run again by every
rank; a rank patched twice once hung on tp_ranks' lock): the TP = 3 run finishes, each process
patched once. Its budget default (``activate(budget="close")`` in the parent only) reaches the ranks:
a record closes within ``max_tokens`` (valid, "stop", ``budget_closed``), ``"off"`` runs into the
limit, an output that fits reports ``budget_closed`` false.
"""
from __future__ import annotations

import glob
import json
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

pytest.importorskip("lmdeploy")
jsonschema = pytest.importorskip("jsonschema")
xgr = pytest.importorskip("xgrammar")

from ..budget_cases import SCHEMA  # noqa: E402
from . import tp_child  # noqa: E402
from .patch_layers import assert_patched_once  # noqa: E402

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[3]
TOOL = re.compile(re.escape(tp_child.TOOL_BEGIN) + r"(.*)" + re.escape(tp_child.TOOL_END), re.S)


def _run(tp: int, mode: str, *extra: str, env_extra: dict | None = None) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(
        [str(REPO)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    for name in ("TOKENRAILS_LMDEPLOY", "TOKENRAILS_LMDEPLOY_CPU", "TOKENRAILS_BUDGET"):
        env.pop(name, None)  # stock means stock; the upgraded runs set their own (a fresh user shell)
    if mode == "tokenrails":
        env[tp_child.ENV_ACTIVATE] = "1"
        # no spec here is large enough for a compile worker process (compile_procs.PROCESS_MIN_COST):
        # the two the engine would boot at start only cost their interpreters' start-up
        env["TOKENRAILS_COMPILE_PROCESSES"] = "0"
    env.update(env_extra or {})
    cmd = [sys.executable, "-m", "tests.engine_patch.lmdeploy.tp_child", "--tp", str(tp), "--mode", mode, *extra]
    for attempt in (1, 2):
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("TP_RESULT ")]
        if proc.returncode == 0 and lines:
            return json.loads(lines[-1][len("TP_RESULT "):])
        failure = f"tp={tp} mode={mode} attempt {attempt}: exit {proc.returncode}\n{_traceback(proc.stderr)}"
        # A TP child failed 2 of ~12 runs in one session and 0 of 9 standalone, cause not found yet:
        # reported in the warnings summary (which pytest prints even when the test passes), then run
        # once more; the same failure twice fails the test.
        warnings.warn(failure, RuntimeWarning, stacklevel=1)
    raise AssertionError(failure)


def _traceback(stderr: str) -> str:
    """The child's last traceback (or the end of its stderr), warnings left out."""
    start = stderr.rfind("Traceback (most recent call last)")
    text = stderr[start:] if start >= 0 else stderr[-6000:]
    return "\n".join(ln for ln in text.splitlines() if "Warning" not in ln and "warnings.warn" not in ln)[-8000:]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, shortest):
    """{(mode, tp): the child's result}, the guided meter's reports and the patch layers each
    process of the upgraded TP = 3 run reported. That run also times a slow compile beside a
    stream (--row-waits) and decodes the budget rows within ``shortest + 2`` tokens."""
    tmp = tmp_path_factory.mktemp("tp")
    meter, layers = str(tmp / "guided"), tmp / "layers.jsonl"
    extra = ("--row-waits", "--budget-tight", str(shortest + 2))
    env = {"PATCH_REPORT": str(layers), "TOKENRAILS_GUIDED_CPU_METER": meter}
    out = {(mode, tp): _run(tp, mode, *extra, env_extra=env) if (mode, tp) == ("tokenrails", 3) else _run(tp, mode)
           for mode in ("stock", "tokenrails") for tp in (1, 3)}
    reports = [json.loads(Path(f).read_text()) for f in glob.glob(meter + ".*.json")]
    patched = [json.loads(line) for line in layers.read_text().splitlines() if line.strip()]
    return out, reports, patched


def _grammar_accepts(ebnf: str, text: str) -> bool:
    compiler = xgr.GrammarCompiler(xgr.TokenizerInfo([]), cache_enabled=False)
    matcher = xgr.GrammarMatcher(compiler.compile_grammar(xgr.Grammar.from_ebnf(ebnf)),
                                 terminate_without_stop_token=True)
    return bool(matcher.accept_string(text)) and matcher.is_terminated()


def _check(name: str, row: dict) -> None:
    """The oracle of each kind on a finished row."""
    assert row["finish_reason"] in ("stop", "length"), (name, row)
    text = row["text"]
    if name == "json_schema":
        jsonschema.validate(json.loads(text), tp_child.PERSON)
    elif name == "regex":
        assert re.fullmatch(tp_child.REGEX, text), text
    elif name == "choice":
        assert text in tp_child.CHOICES, text
    elif name == "grammar":
        assert _grammar_accepts(tp_child.GRAMMAR, text), text
    elif name == "tool_call":
        match = TOOL.fullmatch(text)
        assert match, text
        jsonschema.validate(json.loads(match.group(1)), tp_child.WEATHER_ARGS)
    else:
        assert row["token_ids"], row


@pytest.mark.parametrize("mode", ["stock", "tokenrails"])
def test_tp3_equals_tp1_token_for_token(runs, mode):
    out, _, _ = runs
    tp1, tp3 = out[(mode, 1)], out[(mode, 3)]
    side_by_side = {k: (tp1[k]["text"], tp3[k]["text"]) for k in tp1 if not k.startswith("_")}
    for name, _, _, _ in tp_child.REQUESTS:
        assert tp3[name]["token_ids"] == tp1[name]["token_ids"], (mode, name, side_by_side)
        assert tp3[name]["finish_reason"] == tp1[name]["finish_reason"], (mode, name, side_by_side)
        if mode == "stock" and name in ("choice", "grammar"):  # kinds stock LMDeploy does not have
            assert tp1[name]["finish_reason"] == "error" and not tp1[name]["token_ids"], tp1[name]
            continue
        _check(name, tp3[name])
        if name != "unguided":
            assert tp3[name]["finish_reason"] == "stop", (mode, name, tp3[name])


def test_only_the_sampling_rank_does_guided_work_at_tp3(runs):
    _, reports, _ = runs
    by_rank = {r["rank"]: r for r in reports if r["rank"] is not None}
    engine = [r for r in reports if r["rank"] is None]  # the engine's (pipeline's) own process
    assert sorted(by_rank) == [0, 1, 2], reports
    # grammars compile where the scheduler is (engine_grammars.py); the ranks take them with the rows
    assert sum(r["by"].get("_compile", {}).get("calls", 0) for r in engine) >= 4, engine  # 5 guided kinds
    assert by_rank[0]["by"].get("_compile", {}).get("calls", 0) == 0, by_rank[0]
    assert by_rank[0]["by"].get("accept_tokens", {}).get("calls", 0) > 0, by_rank[0]
    for rank in (1, 2):
        assert by_rank[rank]["calls"] == 0 and by_rank[rank]["seconds"] == 0, by_rank[rank]


def test_a_slow_compile_holds_its_row_not_the_batch_at_tp3(runs):
    """The ranks run in worker processes: the scheduler still keeps the row whose grammar is not
    compiled out of the batch, and the ranks take the engine process's compiled grammar."""
    out, _, _ = runs
    waits = out[("tokenrails", 3)]["_row_waits"]
    print(f"TP=3, compile {waits['delay']} s: {waits['during']} tokens of the other request meanwhile, "
          f"max gap {waits['max_gap']:.3f} s until the slow row's first token, after {waits['slow_wait']:.2f} s")
    assert re.fullmatch(tp_child.FAST, waits["fast"][0]) and waits["fast"][1] == "stop", waits
    assert re.fullmatch(tp_child.SLOW, waits["slow"][0]) and waits["slow"][1] == "stop", waits  # joined, valid
    assert waits["slow_wait"] >= waits["delay"] * 0.9, waits  # it did wait for its compile
    assert waits["fast_outlived"], waits  # the other request still streamed when the slow row joined
    assert waits["during"] >= 5, f"the other request got {waits['during']} tokens while the slow row waited"
    assert waits["max_gap"] < waits["delay"] / 2, f"the other request stalled {waits['max_gap']:.2f} s"


def test_the_engine_process_reads_the_tokenizer_once(runs):
    """The engine process's compiles for its TP ranks, and an in-process model agent (TP = 1), use
    the tokenizer LMDeploy's AsyncEngine already loaded there (stock's agent loads it again)."""
    out, _, _ = runs
    startup = {key: run["_startup"] for key, run in out.items()}
    print("start-up:", startup)
    assert startup[("tokenrails", 3)]["tokenizer_loads"] == startup[("stock", 3)]["tokenizer_loads"] == 1, startup
    assert startup[("tokenrails", 1)]["tokenizer_loads"] == 1, startup


def test_tp_pipeline_with_module_level_activate_finishes_patched_once(runs):
    """Every process that ran the module level (the script's and its three ranks) has each patch
    point wrapped once, and the run finished with valid outputs (test_tp3_equals_tp1_token_for_token)."""
    out, _, patched = runs
    assert re.fullmatch(tp_child.REGEX, out[("tokenrails", 3)]["regex"]["text"])
    assert_patched_once(patched, processes=4)


def test_budget_default_closes_under_tp(runs, shortest):
    budget = runs[0][("tokenrails", 3)]["_budget"]
    closed, off, fits = budget["closed"], budget["off"], budget["fits"]
    assert closed["finish_reason"] == "stop" and closed["budget_closed"] is True, closed
    assert closed["tokens"] <= shortest + 2
    jsonschema.validate(json.loads(closed["text"]), SCHEMA)
    assert off["finish_reason"] == "length" and off["budget_closed"] is None, off
    assert fits["finish_reason"] == "stop" and fits["budget_closed"] is False, fits
    jsonschema.validate(json.loads(fits["text"]), tp_child.BUDGET_PERSON)

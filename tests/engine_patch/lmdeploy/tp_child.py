"""One engine run for the TP tests (test_real_engine_tp.py), in its own process:

    python -m tests.engine_patch.lmdeploy.tp_child --tp 3 --mode tokenrails|stock

Builds LMDeploy's pipeline on the CPU path in float32, decodes ``REQUESTS`` greedily in one batch
and prints one JSON line: per request its token ids, text and finish reason, ``_timing`` (wall
seconds and generated tokens of the last of ``--repeat`` batches) and ``_startup`` (the pipeline's
build: wall and this process's CPU seconds, and how many times this process loaded the tokenizer).

``--mode tokenrails`` starts as a user's script does: ``activate()`` at module level (the TP ranks
re-import this module, so they run it too; ``$PATCH_REPORT``: patch_layers.report), then
``activate(budget="close")`` here only (``REQUESTS`` opt out: ``_opt_out``). ``--budget-tight N``:
then ``budget_requests(N)`` as ``_budget``.

``--row-waits``: then, on the same engine, a request whose grammar compiles slowly (``SLOW``, its
compile for the model's vocabulary delayed ``DELAY`` s in every process of the run: the TP ranks
re-import this module as their main module, so the delay reaches them too) starts while another
guided request streams; ``_row_waits`` says how the other request's tokens kept coming meanwhile."""
from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time

PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 10},
                                           "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}
WEATHER_ARGS = {"type": "object", "properties": {"city": {"type": "string"},
                                                 "unit": {"enum": ["celsius", "fahrenheit"]}},
                "required": ["city", "unit"], "additionalProperties": False}
TOOL_BEGIN = '<tool_call>\n{"name": "get_weather", "arguments": '
TOOL_END = "}\n</tool_call>"
GRAMMAR = 'root ::= num " " op " " num\nop ::= "+" | "-" | "*"\nnum ::= [1-9] [0-9]?'
REGEX = r"[0-9]{3}-[a-z]{2}"
CHOICES = ["red", "green", "blue"]

FAST = r"[0-9]{80}"           # the request that must keep decoding, still streaming when SLOW joins
SLOW = r"[a-c]{3}-[0-9]{2}"   # the request whose compile is slow
DELAY = 5.0
ENV_SLOW = "TP_CHILD_SLOW_COMPILE"


def slow_compiles(delay: float = DELAY, set_attr=setattr) -> threading.Event:
    """``SLOW``'s compile for the model's vocabulary takes ``delay`` s longer, wherever it runs
    (engine process or rank); the front check's compile against its probe vocabulary is not
    delayed: it runs before the request reaches the engine, so delaying it only made the other
    request stream ``delay`` s longer. ``set_attr``: how to patch (a test passes
    ``monkeypatch.setattr``, undone after it). The event is set once a delayed compile has returned."""
    from tokenrails.engine_patch.lmdeploy.server.request_parsing import _probe_vocab
    from tokenrails.guided import manager as core

    real = core.compile_guide
    done = threading.Event()

    def compile_guide(spec, vocab, *args, **kwargs):
        if spec.payload != SLOW or vocab is _probe_vocab():
            return real(spec, vocab, *args, **kwargs)
        time.sleep(delay)
        try:
            return real(spec, vocab, *args, **kwargs)
        finally:
            done.set()

    set_attr(core, "compile_guide", compile_guide)
    return done


ENV_ACTIVATE = "TP_CHILD_ACTIVATE"
if os.environ.get(ENV_ACTIVATE):  # this process and every rank that re-imports this module
    from tokenrails.engine_patch.lmdeploy import activate as _activate

    _activate()
    if os.environ.get("PATCH_REPORT"):
        from tests.engine_patch.lmdeploy import patch_layers

        patch_layers.report(os.environ["PATCH_REPORT"])

if os.environ.get(ENV_SLOW) and __name__ != "__main__":  # a spawned rank importing this module
    slow_compiles()


def _stream(pipe, prompt: str, fmt: dict, max_new_tokens: int, stamps: list, out: dict, key: str) -> None:
    from lmdeploy import GenerationConfig

    gen = GenerationConfig(max_new_tokens=max_new_tokens, top_k=1, response_format=fmt)
    text, finish = "", None
    for resp in pipe.stream_infer([prompt], gen_config=[gen]):
        stamps.append(time.monotonic())
        text += resp.text
        finish = resp.finish_reason or finish
    out[key] = (text, finish)


def row_waits(pipe, fast_pattern: str = FAST, fast_tokens: int = 88, delay: float = DELAY) -> dict:
    """A slow compile (``slow_compiles``, ``delay`` s) starts while ``fast_pattern`` streams:
    the timings of both (see the module doc). test_row_waits.py runs it on one engine."""
    from lmdeploy import GenerationConfig

    # (a budget default of the engine, as in the TP run, is not what this measures)
    fast_fmt = {"type": "regex_schema", "regex_schema": fast_pattern, "tokenrails_budget": "off"}
    slow_fmt = {"type": "regex_schema", "regex_schema": SLOW, "tokenrails_budget": "off"}
    pipe(["Hi"], gen_config=GenerationConfig(max_new_tokens=2, top_k=1, response_format=fast_fmt))  # compiled
    fast_stamps: list[float] = []
    slow_stamps: list[float] = []
    out: dict = {}
    fast = threading.Thread(target=_stream, args=(pipe, "Count digits.", fast_fmt, fast_tokens, fast_stamps, out, "fast"))
    fast.start()
    deadline = time.monotonic() + 120
    while len(fast_stamps) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    t_slow = time.monotonic()
    slow = threading.Thread(target=_stream, args=(pipe, "A code.", slow_fmt, 12, slow_stamps, out, "slow"))
    slow.start()
    fast.join(300)
    slow.join(300)
    # LMDeploy prefills new requests every ``prefill_interval`` (16) decode steps: SLOW's compile
    # starts at the first prefill after ``t_slow``, so the window is up to SLOW's first token
    # (and the FAST token that follows it: a step stalled by a compile ends there)
    joined = slow_stamps[0] if slow_stamps else float("inf")
    after = [t for t in fast_stamps if t >= t_slow]
    window = after[:next((i + 1 for i, t in enumerate(after) if t > joined), len(after))]
    gaps = [b - a for a, b in zip([t_slow] + window, window)]
    return {"fast": out.get("fast"), "slow": out.get("slow"), "delay": delay,
            "slow_wait": joined - t_slow, "during": sum(1 for t in after if t < joined),
            "max_gap": max(gaps) if gaps else None, "fast_outlived": bool(after) and after[-1] > joined}


# (name, prompt, response_format, max_new_tokens)
REQUESTS = [
    ("json_schema", "Give me a person as JSON.",
     {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}, 24),
    ("regex", "Write a code.", {"type": "regex_schema", "regex_schema": REGEX}, 8),
    ("choice", "What colour is the sky?", {"type": "choice", "choice": CHOICES}, 4),
    ("grammar", "Write a sum.", {"type": "grammar", "grammar": GRAMMAR}, 8),
    ("tool_call", "What is the weather in Paris? Call get_weather.",
     {"type": "structural_tag", "format": {"type": "tag", "begin": TOOL_BEGIN,
                                           "content": {"type": "json_schema", "json_schema": WEATHER_ARGS},
                                           "end": TOOL_END}}, 64),
    ("unguided", "Hi", None, 6),
]

BUDGET_PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                                  "age": {"type": "integer"}},
                 "required": ["name", "age"], "additionalProperties": False}


def budget_requests(tight: int) -> list[tuple[str, str, dict, int]]:
    """The record closed by the budget default within ``tight`` tokens, opted out, and one that fits."""
    from ..budget_cases import PROMPT, SCHEMA

    record = {"type": "json_schema", "json_schema": {"name": "record", "schema": SCHEMA}}
    return [("closed", PROMPT, record, tight),
            ("off", PROMPT, {**record, "tokenrails_budget": "off"}, tight),
            ("fits", "Give me a person as JSON.",
             {"type": "json_schema", "json_schema": {"name": "p", "schema": BUDGET_PERSON}}, 64)]


def _opt_out(fmt: dict | None, mode: str) -> dict | None:
    """``fmt`` out of the budget default, which refuses non-DFA kinds (stock has no such key)."""
    return {**fmt, "tokenrails_budget": "off"} if fmt and mode == "tokenrails" else fmt


def _count_tokenizer_loads() -> list:
    """Every ``lmdeploy.tokenizer.Tokenizer`` this process builds from now on, as a list of paths."""
    from lmdeploy.tokenizer import Tokenizer

    loads: list = []
    real = Tokenizer.__init__

    def __init__(self, model_path, *args, **kwargs):
        loads.append(str(model_path))
        real(self, model_path, *args, **kwargs)

    Tokenizer.__init__ = __init__
    return loads


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--mode", choices=["stock", "tokenrails"], required=True)
    ap.add_argument("--repeat", type=int, default=1, help="decode the batch this many times; time the last")
    ap.add_argument("--row-waits", action="store_true", help="then time a slow compile beside a stream")
    ap.add_argument("--budget-tight", type=int, default=None, help="then the budget rows (budget_requests)")
    args = ap.parse_args(argv)
    if args.row_waits:
        os.environ[ENV_SLOW] = "1"  # the ranks spawned below delay SLOW's compile too
        slow_compiles()

    import torch
    torch.set_num_threads(1)
    from lmdeploy import GenerationConfig, pipeline

    from tokenrails.engine_patch.lmdeploy.cpu import cpu_engine_config
    from tokenrails.demo_model import resolve_model_dir
    if args.mode == "tokenrails":
        from tokenrails.engine_patch.lmdeploy import activate
        activate(budget="close")  # this process only; the ranks read the exported default
    model_dir, _, _ = resolve_model_dir(quiet=True)
    cfg = cpu_engine_config(tp=args.tp, max_batch_size=len(REQUESTS), session_len=512)
    cfg.dtype = "float32"  # (the config's own check admits only half types; the CPU path runs fp32)
    loads = _count_tokenizer_loads()
    wall, cpu = time.perf_counter(), time.process_time()
    pipe = pipeline(str(model_dir), backend_config=cfg)
    startup = {"seconds": time.perf_counter() - wall, "cpu_seconds": time.process_time() - cpu,
               "tokenizer_loads": len(loads), "load": os.getloadavg()[0]}
    try:
        gens = [GenerationConfig(top_k=1, max_new_tokens=n, response_format=_opt_out(fmt, args.mode))
                for _, _, fmt, n in REQUESTS]
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            outs = pipe([p for _, p, _, _ in REQUESTS], gen_config=gens)
            seconds = time.perf_counter() - t0
        budget = None
        if args.budget_tight is not None:
            reqs = budget_requests(args.budget_tight)
            budget_outs = pipe([p for _, p, _, _ in reqs], gen_config=[
                GenerationConfig(top_k=1, max_new_tokens=n, response_format=f) for _, _, f, n in reqs])
            budget = {name: {"text": o.text, "finish_reason": o.finish_reason, "tokens": len(o.token_ids or []),
                             "budget_closed": getattr(o, "budget_closed", None)}
                      for (name, *_), o in zip(reqs, budget_outs)}
        waits = row_waits(pipe) if args.row_waits else None
    finally:
        pipe.close()
    result = {name: {"token_ids": list(map(int, o.token_ids or [])), "text": o.text,
                     "finish_reason": o.finish_reason} for (name, *_), o in zip(REQUESTS, outs)}
    result["_timing"] = {"seconds": seconds, "tokens": sum(len(r["token_ids"]) for r in result.values())}
    result["_startup"] = startup
    if waits is not None:
        result["_row_waits"] = waits
    if budget is not None:
        result["_budget"] = budget
    sys.stdout.write("TP_RESULT " + json.dumps(result) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()

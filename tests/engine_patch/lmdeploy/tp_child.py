"""One engine run for the TP equivalence test (test_real_engine_tp.py), in its own process:

    python -m tests.engine_patch.lmdeploy.tp_child --tp 3 --mode tokenrails|stock --meter PREFIX

Builds LMDeploy's pipeline on the CPU path in float32, decodes ``REQUESTS`` greedily in one batch
and prints one JSON line: per request its token ids, text and finish reason, and ``_timing`` (wall
seconds and generated tokens of the last of ``--repeat`` batches)."""
from __future__ import annotations

import argparse
import json
import sys
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


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--mode", choices=["stock", "tokenrails"], required=True)
    ap.add_argument("--meter", default=None, help="guided CPU report prefix (guided_meter.py)")
    ap.add_argument("--repeat", type=int, default=1, help="decode the batch this many times; time the last")
    args = ap.parse_args(argv)
    import os

    if args.meter:
        os.environ["TOKENRAILS_GUIDED_CPU_METER"] = args.meter
    import torch
    torch.set_num_threads(1)
    from lmdeploy import GenerationConfig, pipeline

    from tokenrails.engine_patch.lmdeploy.cpu import cpu_engine_config
    from tokenrails.demo_model import resolve_model_dir
    if args.mode == "tokenrails":
        from tokenrails.engine_patch.lmdeploy import activate
        activate()
    model_dir, _, _ = resolve_model_dir(quiet=True)
    cfg = cpu_engine_config(tp=args.tp, max_batch_size=len(REQUESTS), session_len=512)
    cfg.dtype = "float32"  # (the config's own check admits only half types; the CPU path runs fp32)
    pipe = pipeline(str(model_dir), backend_config=cfg)
    try:
        gens = [GenerationConfig(top_k=1, max_new_tokens=n, response_format=fmt) for _, _, fmt, n in REQUESTS]
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            outs = pipe([p for _, p, _, _ in REQUESTS], gen_config=gens)
            seconds = time.perf_counter() - t0
    finally:
        pipe.close()
    result = {name: {"token_ids": list(map(int, o.token_ids or [])), "text": o.text,
                     "finish_reason": o.finish_reason} for (name, *_), o in zip(REQUESTS, outs)}
    result["_timing"] = {"seconds": seconds, "tokens": sum(len(r["token_ids"]) for r in result.values())}
    sys.stdout.write("TP_RESULT " + json.dumps(result) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()

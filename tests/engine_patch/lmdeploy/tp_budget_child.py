"""One TP engine run for the budget test (test_real_engine_tp_budget.py), in its own process:

    python -m tests.engine_patch.lmdeploy.tp_budget_child --tp 3 --tight N

``activate(budget="close")`` in this process only: the TP workers get the engine default through
the exported environment. Prints one JSON line per request: text, finish reason, tokens,
``budget_closed``."""
from __future__ import annotations

import argparse
import json
import sys

from ..budget_cases import PROMPT, SCHEMA

PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}


def requests(tight: int) -> list[tuple[str, str, dict, int]]:
    record = {"type": "json_schema", "json_schema": {"name": "record", "schema": SCHEMA}}
    return [("closed", PROMPT, record, tight),
            ("off", PROMPT, {**record, "tokenrails_budget": "off"}, tight),
            ("fits", "Give me a person as JSON.", {"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}},
             64)]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tp", type=int, default=3)
    ap.add_argument("--tight", type=int, required=True)
    args = ap.parse_args(argv)
    import torch
    torch.set_num_threads(1)
    from lmdeploy import GenerationConfig, pipeline

    from tokenrails.demo_model import resolve_model_dir
    from tokenrails.engine_patch.lmdeploy import activate
    from tokenrails.engine_patch.lmdeploy.cpu import cpu_engine_config
    activate(budget="close")
    reqs = requests(args.tight)
    cfg = cpu_engine_config(tp=args.tp, max_batch_size=len(reqs), session_len=512)
    cfg.dtype = "float32"
    pipe = pipeline(str(resolve_model_dir(quiet=True)[0]), backend_config=cfg)
    try:
        outs = pipe([p for _, p, _, _ in reqs],
                    gen_config=[GenerationConfig(top_k=1, max_new_tokens=n, response_format=f) for _, _, f, n in reqs])
    finally:
        pipe.close()
    result = {name: {"text": o.text, "finish_reason": o.finish_reason, "tokens": len(o.token_ids or []),
                     "budget_closed": getattr(o, "budget_closed", None)} for (name, *_), o in zip(reqs, outs)}
    sys.stdout.write("TP_RESULT " + json.dumps(result) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()

"""Greedy identity of grammar drafts on LMDeploy's real engine on CPU, per verification shape and dtype.

For each dtype, three engines over the same requests (the JSON-extraction and tool-call workloads of
bench/grammar_drafts.py, every request in one batch): plain guided decoding, grammar drafts with ragged
rows (the CPU path's shapes) and grammar drafts with rows padded to one bucketed width (the shapes a
CUDA device gets, ``TOKENRAILS_GRAMMAR_DRAFTS_FIXED=buckets``). Counted: outputs byte-identical to plain
guided, and padded vs ragged. Engines are built in ABBA order across dtypes (no build-order favourite).
Also counted from the target forward's own inputs: verified positions per output token of each engine
(what a padded step costs over a ragged one). Counts only, no timing; the load average is printed per run.

    python bench/draft_identity.py [--dtype bfloat16,float16] [--tokens 32] [--drafts 4] [--schemas 8]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench._common import print_table  # noqa: E402  (also sets one torch thread)
from bench.grammar_drafts import (DATA, PositionCounter, _first_difference, load_schemas, prompt_for,  # noqa: E402
                                  tool_calls)

ENGINES = ("guided", "ragged", "padded")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", default="bfloat16,float16")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--drafts", type=int, default=4)
    ap.add_argument("--schemas", type=int, default=8)
    args = ap.parse_args()

    from lmdeploy import GenerationConfig, pipeline

    from tokenrails import GuideSpec, Vocabulary
    from tokenrails.demo_model import resolve_model_dir
    from tokenrails.engine_patch.lmdeploy import activate, deactivate
    from tokenrails.engine_patch.lmdeploy.speculative import draft_shapes
    from tokenrails.engine_patch.lmdeploy.cpu import cpu_engine_config
    from transformers import AutoTokenizer

    model_dir = str(resolve_model_dir(quiet=True)[0])
    vocab = Vocabulary.from_huggingface(AutoTokenizer.from_pretrained(model_dir))
    schemas = load_schemas(DATA, args.schemas, vocab, False)
    prompts = [prompt_for(n, s) for n, s in schemas]
    specs = [GuideSpec.json_schema(json.dumps(s), any_whitespace=False) for _, s in schemas]
    tool_prompts, tool_specs, _ = tool_calls(False)
    workload = {"json": (prompts, specs), "tools": (tool_prompts, tool_specs)}

    counter = PositionCounter()
    rows, totals = [], {"drafts": [0, 0], "padded_vs_ragged": [0, 0]}
    ppt: dict[tuple[str, str, str], float] = {}
    for n, dtype in enumerate(args.dtype.split(",")):
        order = ENGINES if n % 2 == 0 else tuple(reversed(ENGINES))
        outs: dict[str, dict[str, list]] = {}
        for name in order:
            activate(grammar_drafts=0 if name == "guided" else args.drafts)
            os.environ[draft_shapes.ENV_SHAPE] = "buckets" if name == "padded" else "0"
            try:
                pipe = pipeline(model_dir, backend_config=cpu_engine_config(
                    max_batch_size=8, session_len=2048, num_gpu_blocks=512, dtype=dtype))
            finally:
                os.environ.pop(draft_shapes.ENV_SHAPE, None)
            try:
                outs[name] = {}
                for wl, (ps, ss) in workload.items():
                    gens = [GenerationConfig(max_new_tokens=args.tokens, top_k=1, response_format=s) for s in ss]
                    counter.reset()
                    outs[name][wl] = pipe(ps, gen_config=gens)
                    ppt[dtype, name, wl] = counter.positions / max(1, sum(o.generate_token_len for o in outs[name][wl]))
                    print(f"# {dtype} {name} {wl}: done, load {os.getloadavg()[0]:.1f}", flush=True)
            finally:
                pipe.close()
                deactivate()
        for wl in workload:
            g, r, p = (outs[e][wl] for e in ENGINES)
            diffs = {e: [x for x in (_first_difference(a, b) for a, b in zip(g, outs[e][wl])) if x is not None]
                     for e in ("ragged", "padded")}
            same = {e: len(g) - len(d) for e, d in diffs.items()}
            pr = [_first_difference(a, b) for a, b in zip(r, p)]
            rows.append([dtype, wl, len(g), f"{same['ragged']}/{len(g)}", f"{same['padded']}/{len(g)}",
                         f"{sum(x is None for x in pr)}/{len(g)}", str(diffs["ragged"]), str(diffs["padded"]),
                         *(f"{ppt[dtype, e, wl]:.2f}" for e in ENGINES)])
            totals["drafts"][0] += same["ragged"] + same["padded"]
            totals["drafts"][1] += 2 * len(g)
            totals["padded_vs_ragged"][0] += sum(x is None for x in pr)
            totals["padded_vs_ragged"][1] += len(g)
    print()
    print_table(["dtype", "workload", "requests", "ragged = guided", "padded = guided", "padded = ragged",
                 "first differing token, ragged", "first differing token, padded",
                 *(f"positions/token {e}" for e in ENGINES)], rows)
    print(f"\nbyte-identical to plain guided: {totals['drafts'][0]}/{totals['drafts'][1]}; padded = ragged: "
          f"{totals['padded_vs_ragged'][0]}/{totals['padded_vs_ragged'][1]}")


if __name__ == "__main__":
    main()

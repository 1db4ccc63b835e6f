"""Which schemas a budget request can be served for, and why the others are refused.

Budget requests compile on the fsm backend only (docs/semantics.md §4b), so a schema is served
under a budget iff fsm's JSON lowering enforces it. For a seeded sample of each MaskBench subset
(``../shared/data/jsonschemabench``) and every BFCL (``bfcl-eval``'s data, ``bench/tool_corpus.py``)
and pydantic tool's parameter schema: lowered (``schema_to_regex``, no vocabulary, no DFA), and
each refusal's reasons counted; beside it, what the lowering refused before numeric bounds were
written as digit ranges (the same findings without ``numeric_bounds.rewrite_bounds``).

    .venv/bin/python bench/budget_coverage.py [--per-subset 80] [--seed 0] [--bfcl 400]
"""
from __future__ import annotations

import argparse
import json
import random
import re
import sys
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench._common import print_table  # noqa: E402
from bench.lmdeploy_engine import MASKBENCH  # noqa: E402

import tool_corpus  # noqa: E402

from tokenrails import GuideSpec  # noqa: E402
from tokenrails.guided.errors import GuideError  # noqa: E402
from tokenrails.guided.fsm.schema import outlines_unenforced, schema_to_regex  # noqa: E402
from tokenrails.guided.schema_semantics import policy_payload  # noqa: E402


def corpus(per_subset: int, seed: int, bfcl: int) -> list[tuple[str, object]]:
    rng = random.Random(seed)
    items: list[tuple[str, object]] = []
    for path in sorted(MASKBENCH.glob("maskbench_*.json")):
        doc = json.loads(path.read_text())
        chosen = sorted(rng.sample(range(len(doc["items"])), min(per_subset, len(doc["items"]))))
        items += [(f"MaskBench {doc['subset']}", doc["items"][i]["schema"]) for i in chosen]
    data = tool_corpus.bfcl_data_dir(install=False)
    for ts in tool_corpus.load_bfcl(data, tool_corpus.BFCL_CATEGORIES, bfcl):
        items += [("BFCL tools", t["function"]["parameters"]) for t in ts.tools]
    for ts in tool_corpus.pydantic_toolsets():
        items += [(f"pydantic tools ({ts.source.split(':')[1]})", t["function"]["parameters"]) for t in ts.tools]
    return items


def reasons(message: str) -> list[str]:
    found = re.findall(r"#[^:;]*: ([^;(\[]+)", message)
    return sorted({f.strip().split(" is not")[0].split(" is lowered")[0][:48] for f in found}) or [message[:60]]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--per-subset", type=int, default=80)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--bfcl", type=int, default=400, help="BFCL entries (round-robin over categories)")
    args = ap.parse_args()
    served: dict[str, Counter] = defaultdict(Counter)
    why: Counter = Counter()
    for source, schema in corpus(args.per_subset, args.seed, args.bfcl):
        served[source]["schemas"] += 1
        try:
            spec = GuideSpec.json_schema(schema, any_whitespace=False)
            before = outlines_unenforced(json.loads(policy_payload(spec)))
        except GuideError:
            before = ["invalid"]
        try:
            schema_to_regex(spec)
            served[source]["now"] += 1
        except GuideError as exc:
            why.update(reasons(str(exc)))
        else:
            served[source]["before"] += not before
            continue
        served[source]["before"] += 0
    print_table(["source", "schemas", "served by fsm (budget) before", "now"],
                [[s, c["schemas"], c["before"], c["now"]] for s, c in served.items()])
    print(f"\nrefusal reasons now (schemas naming each; a schema may name several; MaskBench {args.per_subset} per "
          f"subset, seed {args.seed}):")
    for reason, n in why.most_common(20):
        print(f"  {n:4d}  {reason}")


if __name__ == "__main__":
    main()

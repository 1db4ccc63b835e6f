"""The budget rule on LMDeploy's real engine (CPU, SmolLM2), other people's schemas, same run.

Workload: MaskBench schemas (the five subsets in ``../shared/data/jsonschemabench``, ``--per-subset``
each, sampled with ``--seed``, at most 6,000 characters) and BFCL function definitions
(``bench/data/bfcl_v4_simple_python_sample.jsonl``, ``--bfcl`` of them, the call as a
``json_schema`` response_format), each at ``max_tokens`` 16 / 32 / 64 / 128, greedy, through:

* ``stock``: LMDeploy 0.18 without tokenrails (its own xgrammar guided decoding);
* ``plain``: tokenrails, the request as is (the auto route);
* ``plain-fsm``: tokenrails with the fsm backend (what a budget request compiles), no budget:
  the reference for identity, since the auto route's backend may choose other whitespace;
* ``budget``: tokenrails, ``response_format["tokenrails_budget"] = "close"`` (on the plain-fsm engine:
  the same engine instance, so the per-step cost compares like with like).

Per configuration and budget: requests refused (finish_reason "error" with no text: the engine
refuses a request at its first step), and of the others the share whose output parses and
validates (jsonschema). Each budget refusal is judged against the table's shortest output
``D(start)`` computed in-process: correct when ``D(start) > max_tokens`` or the schema is not a
DFA (the refusal's reason, from the fsm compile, is printed). Identity: budget output equal to
plain-fsm's (and to plain's) where that one stopped before the budget. Cost: guided time per
row-step (logits processor call + accept, ``StepTimer``) of budget vs plain-fsm, and the compile
time of the fsm guide with and without the table. ``--clients``: openai ``parse``, instructor and
LangChain against CPU api_servers (stock, upgraded) at max_tokens 48 (harness/budget_clients.py).

    OMP_NUM_THREADS=1 .venv/bin/python bench/budget_engine.py [--per-subset 3] [--bfcl 6] [--limit N]
        [--tokens 16,32,64,128] [--clients]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench._common import print_table  # noqa: E402  (also sets one torch thread)
from bench.lmdeploy_engine import MASKBENCH, Row, StepTimer, bfcl_rows, settle  # noqa: E402

import torch  # noqa: E402

CONFIGS = ("stock", "plain", "plain-fsm", "budget")


def load(msg: str) -> str:
    return f"{msg} [load {' '.join(f'{x:.1f}' for x in os.getloadavg())}]"


def maskbench_sample(per_subset: int, seed: int) -> list[Row]:
    rng = random.Random(seed)
    rows = []
    for path in sorted(MASKBENCH.glob("maskbench_*.json")):
        doc = json.loads(path.read_text())
        items = [(i, it) for i, it in enumerate(doc["items"]) if len(json.dumps(it["schema"])) <= 6000]
        for i, item in rng.sample(items, min(per_subset, len(items))):
            text = json.dumps(item["schema"])
            fmt = {"type": "json_schema", "json_schema": {"name": "s", "schema": item["schema"]}}
            prompt = f"Write a JSON document valid against this JSON schema:\n{text[:300]}\nJSON:"
            rows.append(Row("maskbench", f"{doc['subset']}/{i}", prompt, fmt, schema=item["schema"]))
    return rows


def with_budget(fmt: dict) -> dict:
    return {**fmt, "tokenrails_budget": "close"}


# ---- in-process probe: the fsm compile, with and without the table ----------------------------
def probe(rows: list[Row], vocab: Any) -> dict[str, dict]:
    """Per row: ``shortest`` (D(start)) or ``refused`` (the fsm compile's reason), compile times."""
    from tokenrails.engine_patch.lmdeploy.server.request_parsing import parse_format
    from tokenrails.guided.budget import budget_table
    from tokenrails.guided.errors import GuideError
    from tokenrails.guided.manager import GuidedDecodingManager

    import xgrammar as xgr
    from transformers import AutoTokenizer  # noqa: F401

    from tokenrails.demo_model import load_tokenizer

    tok = load_tokenizer(quiet=True)
    xc = xgr.GrammarCompiler(xgr.TokenizerInfo.from_huggingface(tok, vocab_size=vocab.vocab_size))
    out = {}
    for r in rows:
        info: dict[str, Any] = {}
        try:  # stock LMDeploy compiles with xgrammar inside its engine loop: only what it compiles is sent
            xc.compile_json_schema(json.dumps(r.schema))
            info["stock_ok"] = True
        except Exception:  # noqa: BLE001
            info["stock_ok"] = False
        try:
            bspec = parse_format(with_budget(r.response_format))[0]
            plain = parse_format(r.response_format)[0].with_routing("fsm", fallback=False)
            m1, m2 = GuidedDecodingManager(vocab, compile_workers=1), GuidedDecodingManager(vocab, compile_workers=1)
            try:
                t0 = time.perf_counter()
                m1.get_compiled(plain)
                info["compile_plain"] = time.perf_counter() - t0
                t0 = time.perf_counter()
                guide = m2.get_compiled(bspec)
                table = budget_table(guide)
                info["compile_budget"] = time.perf_counter() - t0
                info["shortest"] = table.start
            finally:
                m1.close()
                m2.close()
        except GuideError as exc:
            info["refused"] = f"{type(exc).__name__}: {str(exc)[:160]}"
        out[r.label] = info
    return out


def reason_class(text: str) -> str:
    """A short class of a refusal's reason (for the table)."""
    for needle, short in (("not enforced", "keyword not enforced"), ("allOf", "allOf"), ("oneOf", "oneOf"),
                          ("additionalProperties", "additionalProperties beside properties"),
                          ("pattern", "pattern"), ("format", "format"), ("recurs", "recursive"),
                          ("max_dfa_states", "DFA too large"), ("limit", "a limit"), ("required names", "required")):
        if needle in text:
            return short
    return text.split(":")[0]


# ---- the engine runs ----------------------------------------------------------------------------
def engines(max_batch: int, max_tokens: int, stock: bool = True, auto: bool = True) -> dict[str, Any]:
    from lmdeploy import pipeline

    import tokenrails.engine_patch.lmdeploy as patch
    from tokenrails.demo_model import resolve_model_dir
    from tokenrails.engine_patch.lmdeploy.cpu import cpu_engine_config

    path = str(resolve_model_dir(quiet=True)[0])
    blocks = (600 + max_tokens + 63) // 64 + 1
    cfg = dict(max_batch_size=max_batch, session_len=1024, block_size=64, num_gpu_blocks=max(64, max_batch * blocks + 8))
    out = {}
    wanted = [("stock", None)] * stock + [("upgraded", "auto")] * auto + [("fsm", "fsm")]
    for name, backend in wanted:
        if backend is None:
            patch.deactivate()
        else:
            patch.activate(backend=backend)
        out[name] = pipeline(path, backend_config=cpu_engine_config(**cfg))
    patch.activate(backend="auto")
    patch.deactivate()
    return out


class _Refused:
    finish_reason, text, token_ids = "error", "", []


REFUSED = _Refused()


def run(pipes: dict, config: str, rows: list[Row], n: int, timer: StepTimer, info: dict) -> tuple[list[Any], dict]:
    from lmdeploy import GenerationConfig

    import tokenrails.engine_patch.lmdeploy as patch

    engine = {"stock": "stock", "stock-sent": "stock", "plain": "upgraded", "budget": "fsm", "plain-fsm": "fsm"}[config]
    if config == "stock":  # rows xgrammar cannot compile are not sent to stock (counted refused)
        sent = [r for r in rows if info[r.label]["stock_ok"]]
        outs, cost = run(pipes, "stock-sent", sent, n, timer, info) if sent else ([], {
            "logits_per_row_step": 0.0, "row_steps": 0, "steps": 0, "wall": 0.0, "cpu": 0.0})
        it = iter(outs)
        return [next(it) if info[r.label]["stock_ok"] else REFUSED for r in rows], cost
    fmts = [with_budget(r.response_format) if config == "budget" else r.response_format for r in rows]
    gens = [GenerationConfig(top_k=1, max_new_tokens=n, response_format=f) for f in fmts]
    if engine != "stock":
        patch.activate(backend="fsm" if engine == "fsm" else "auto")
    timer.reset()
    timer.install()
    cpu, wall = time.process_time(), time.perf_counter()
    try:
        outs = pipes[engine]([r.prompt for r in rows], gen_config=gens)
        if engine != "stock":
            settle(timer)
    finally:
        timer.uninstall()
        patch.deactivate()
    secs, toks, steps, fwd, logits, _, row_steps, _ = timer.decode_steps()
    return outs, {"logits_per_row_step": logits / max(row_steps, 1), "row_steps": row_steps, "steps": steps,
                  "wall": time.perf_counter() - wall, "cpu": time.process_time() - cpu}


def judge(row: Row, out: Any) -> str:
    """"refused" | "valid" | "truncated" (finish length) | "invalid" (parsed, fails the schema) |
    "unparsed" (stopped, not JSON)."""
    import jsonschema

    if out.finish_reason == "error" and not out.text:
        return "refused"
    try:
        value = json.loads(out.text)
    except ValueError:
        return "truncated" if out.finish_reason == "length" else "unparsed"
    cls = jsonschema.validators.validator_for(row.schema)
    try:
        return "valid" if cls(row.schema).is_valid(value) else "invalid"
    except Exception:  # noqa: BLE001 - a schema jsonschema cannot evaluate
        return "invalid"


def clients_section() -> list[list[Any]]:
    """Each client library once per server/configuration: stock, plain (upgraded), budget (upgraded)."""
    from harness import server_attack as atk
    from harness.budget_clients import CLIENTS, MAX_TOKENS
    from tokenrails.demo_model import resolve_model_dir

    model = str(resolve_model_dir(quiet=True)[0])
    logdir = Path("/tmp") / f"budget_engine_servers_{os.getpid()}"
    logdir.mkdir(exist_ok=True)
    rows = []
    servers = {}
    procs = []
    try:
        for name in ("upgraded", "stock"):
            proc, base = atk.start_server(model, logdir / f"{name}.log", stock=name == "stock",
                                          extra_args=("--session-len", "2048"))
            procs.append(proc)
            model_id = atk.wait_ready(proc, base, 300)
            if model_id is None:
                raise SystemExit(f"{name} server did not start: {(logdir / f'{name}.log').read_text()[-2000:]}")
            servers[name] = (f"{base}/v1", model_id)
        for client, call in CLIENTS.items():
            row = [client]
            for config, server, budget in (("stock", "stock", False), ("plain", "upgraded", False),
                                           ("budget", "upgraded", True)):
                t0 = time.perf_counter()
                try:
                    call(*servers[server], budget)
                    row.append(f"parsed ({time.perf_counter() - t0:.1f} s)")
                except Exception as exc:  # noqa: BLE001 - the client's own error is the outcome
                    row.append(type(exc).__name__)
            rows.append(row)
            print(load(f"clients: {client}: {row[1:]}"), file=sys.stderr, flush=True)
    finally:
        for proc in procs:
            atk.stop_server(proc)
    print(f"\nreal clients at max_tokens {MAX_TOKENS} (harness/budget_clients.py: Review with free-text fields), "
          "greedy\n")
    print_table(["client", "stock", "plain guided", "guided + budget"], rows)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--per-subset", type=int, default=3)
    ap.add_argument("--bfcl", type=int, default=6)
    ap.add_argument("--limit", type=int, default=0, help="at most this many rows in all (0: no cap)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tokens", default="16,32,64,128")
    ap.add_argument("--clients", action=argparse.BooleanOptionalAction, default=False)
    ap.add_argument("--engine", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--configs", default=",".join(CONFIGS), help="a subset of " + ",".join(CONFIGS)
                    + " (budget and plain-fsm are always run: identity and cost compare them)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    budgets = [int(x) for x in args.tokens.split(",")]
    if args.engine:
        engine_section(args, budgets)
    if args.clients:
        clients_section()


def engine_section(args: Any, budgets: list[int]) -> None:
    from tokenrails.demo_model import load_tokenizer
    from tokenrails.guided.vocabulary import Vocabulary

    tok = load_tokenizer(quiet=True)
    vocab = Vocabulary.from_huggingface(tok, vocab_size=len(tok))
    bfcl = bfcl_rows()
    rows = maskbench_sample(args.per_subset, args.seed) + random.Random(args.seed).sample(bfcl, min(args.bfcl, len(bfcl)))
    if args.limit:
        rows = rows[: args.limit]
    print(load(f"{len(rows)} rows ({sum(r.kind == 'maskbench' for r in rows)} MaskBench from {MASKBENCH}, "
               f"seed {args.seed}; {sum(r.kind == 'bfcl' for r in rows)} BFCL simple_python)"), flush=True)
    info = probe(rows, vocab)
    print(load("probe (fsm compile + table) done"), flush=True)
    configs = tuple(c for c in CONFIGS if c in args.configs.split(",") or c in ("plain-fsm", "budget"))
    pipes = engines(len(rows), max(budgets), "stock" in configs, "plain" in configs)
    timer = StepTimer(frozenset(vocab.eos_ids))
    results: dict[tuple[str, int], list[Any]] = {}
    costs: dict[tuple[str, int], dict] = {}
    try:
        for k, n in enumerate(budgets):
            order = configs if k % 2 == 0 else tuple(reversed(configs))
            for config in order:
                outs, cost = run(pipes, config, rows, n, timer, info)
                results[(config, n)] = outs
                costs[(config, n)] = cost
                print(load(f"max_tokens {n} {config}: {cost['wall']:.1f} s wall, {cost['cpu']:.1f} s cpu, "
                           f"{Counter(judge(r, o) for r, o in zip(rows, outs))}"), file=sys.stderr, flush=True)
    finally:
        for p in pipes.values():
            p.close()
    report(rows, info, budgets, results, costs, configs)


def report(rows, info, budgets, results, costs, configs=CONFIGS) -> None:
    print("\nLMDeploy 0.18 PyTorch engine on CPU (1 thread), SmolLM2-135M, greedy; valid = parses and validates "
          "(jsonschema) among the requests not refused\n")
    table = []
    for n in budgets:
        line = [n]
        for config in configs:
            verdicts = [judge(r, o) for r, o in zip(rows, results[(config, n)])]
            c = Counter(verdicts)
            served = len(rows) - c["refused"]
            line.append(f"{c['valid']}/{served} ({c['refused']} ref.)")
        table.append(line)
    print_table(["max_tokens"] + [f"{c} valid/served" for c in configs], table)

    print("\nbudget refusals, judged against the in-process table (correct: D(start) > max_tokens, or the "
          "schema has no exact DFA on fsm)\n")
    table, reasons = [], Counter()
    for n in budgets:
        outs = results[("budget", n)]
        too_long = no_dfa = wrong = missed = 0
        for r, o in zip(rows, outs):
            i = info[r.label]
            refused = judge(r, o) == "refused"
            should = "refused" in i or i["shortest"] > n
            if refused and "refused" in i:
                no_dfa += 1
                if n == budgets[0]:
                    reasons[reason_class(i["refused"])] += 1
            elif refused and should:
                too_long += 1
            elif refused:
                wrong += 1
            elif should:
                missed += 1
        table.append([n, too_long, no_dfa, wrong, missed])
    print_table(["max_tokens", "refused: shortest > max_tokens", "refused: no exact DFA", "refused wrongly",
                 "should have been refused, was not"], table)
    print("no-DFA reasons (schemas): " + ", ".join(f"{k} {v}" for k, v in reasons.most_common()))
    shortest = sorted(i["shortest"] for i in info.values() if "shortest" in i)
    if shortest:
        print(f"D(start) over the {len(shortest)} budget-served schemas: min {shortest[0]}, median "
              f"{shortest[len(shortest) // 2]}, max {shortest[-1]} tokens")

    print("\nidentity (greedy): budget output equal to the reference's where the reference stopped before the "
          "budget (finish 'stop', emitted < max_tokens)\n")
    table = []
    for n in budgets:
        line = [n]
        for ref in [c for c in ("plain-fsm", "plain") if c in configs]:
            same = eligible = 0
            for r, a, b in zip(rows, results[(ref, n)], results[("budget", n)]):
                if a.finish_reason == "stop" and len(a.token_ids) < n and judge(r, b) != "refused":
                    eligible += 1
                    same += a.text == b.text
            line.append(f"{same}/{eligible}")
        closed = sum(judge(r, b) == "valid" and a.finish_reason == "length"
                     for r, a, b in zip(rows, results[("plain-fsm", n)], results[("budget", n)]))
        line.append(closed)
        table.append(line)
    print_table(["max_tokens", "budget == plain-fsm"] + (["budget == plain (auto route)"] if "plain" in configs else []) + [
                 "plain-fsm cut at max_tokens, budget closed it valid"], table)
    if "plain" not in configs:
        return _cost(budgets, info, costs)
    n = budgets[-1]
    for r, a, b in zip(rows, results[("plain", n)], results[("plain-fsm", n)]):
        if a.finish_reason == b.finish_reason == "stop" and a.text != b.text:
            print(f"e.g. {r.label} at {n}: plain (auto route) {a.text[:90]!r}\n      plain-fsm {b.text[:90]!r}")
            break

    _cost(budgets, info, costs)


def _cost(budgets, info, costs) -> None:
    print("\nguided cost on the same engine (fsm), same run: logits processor call + accept per row-step\n")
    table = []
    for n in budgets:
        b, p = costs[("budget", n)], costs[("plain-fsm", n)]
        table.append([n, f"{p['logits_per_row_step'] * 1e3:.3f}", f"{b['logits_per_row_step'] * 1e3:.3f}",
                      f"{b['logits_per_row_step'] / max(p['logits_per_row_step'], 1e-12):.2f}",
                      p["row_steps"], b["row_steps"], f"{b['cpu'] / max(p['cpu'], 1e-9):.2f}",
                      f"{b['wall'] / max(p['wall'], 1e-9):.2f}"])
    print_table(["max_tokens", "plain-fsm ms/row-step", "budget ms/row-step", "ratio", "row-steps plain-fsm",
                 "row-steps budget", "call cpu ratio", "call wall ratio"], table)
    pairs = [(i["compile_plain"], i["compile_budget"]) for i in info.values() if "compile_budget" in i]
    if pairs:
        import statistics

        ratios = sorted(b / a for a, b in pairs)
        print(f"\ncompile (fsm, SmolLM2 vocabulary, {len(pairs)} schemas): plain median "
              f"{statistics.median(a for a, _ in pairs) * 1e3:.0f} ms, with the table median "
              f"{statistics.median(b for _, b in pairs) * 1e3:.0f} ms; ratio median {statistics.median(ratios):.2f}, "
              f"max {ratios[-1]:.2f}")
    print(load("\ndone"))


if __name__ == "__main__":
    main()

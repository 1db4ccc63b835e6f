"""Grammar drafts on LMDeploy 0.18's real engine on CPU: plain guided vs guided + drafts (proposer beside the forward or inline).

Workloads (``--workloads``), greedy (top_k=1), ``--tokens`` new tokens at most, one torch thread,
the embedded SmolLM2-135M:

* ``json``: JSON extraction over someone else's schemas: JSONSchemaBench's Glaiveai2K subset
  (function argument schemas written by others, as shipped in MaskBench; ``--data``), the first
  ``--schemas`` that compile and have required properties (``--skip-arrays``: and no arrays, whose
  items SmolLM2 repeats until the token cap, so those outputs never finish); each request fills one schema.
* ``tools``: tool calls over the 8 BFCL ``simple_python`` functions of bench/data/ (built as in
  bench/lmdeploy_engine.py: ``{"name": <const>, "arguments": <the function's parameters>}``).

Both with ``--whitespace`` (compact by default: what a tool-call format fixes).

``--dtype`` (default bfloat16; ``float16,bfloat16`` for both): every configuration runs once per dtype (``PytorchEngineConfig(dtype=)``,
the same for all of them). On this CPU a float16 matmul has no fast kernel and costs about linearly
in the positions verified (compute-bound), while bfloat16 costs nearly the same for 1 to 8
positions (memory-bound): bfloat16 here is the regime of a GPU decode step, float16 is not.

1. **Ceiling first**: plain guided outputs replayed through a fresh matcher; at every emitted token,
   is it the only token the mask allows (``one-token``), or the token the forced-token rule
   (guided/forced.py) would have drafted there (``rule``)? ``rule`` bounds what drafts can save.
2. Engines, all with the upgrade active, ``--instances`` of each built in ABBA order (plain, drafts,
   drafts, plain: an engine built later in a process runs slower), round ``r`` on instance ``r % instances``:
   ``guided`` (plain engine), ``drafts`` (``activate(grammar_drafts=k)``, the proposer beside the
   forward, engine_patch/lmdeploy/draft_ahead.py) and ``inline`` (the same drafts engine with
   ``TOKENRAILS_DRAFTS_AHEAD=0``: the proposer between forwards). Configurations run in ABBA order
   across rounds; the load average is printed with every round.
   * ``--modes fixed``: every row of the workload, in calls of ``batch`` rows; ``stream``: a continuous
     stream (``--rate`` requests/s, Poisson, or all at once), at most ``batch`` running, a finished row
     refilled from the queue at once (the slowest row of a call no longer decides);
   * headline: output tokens per process CPU-second (all threads), drafts / guided, the median of
     per-round ratios; wall-clock tokens/s beside it (wall time on a loaded machine flatters the
     configuration with fewer steps: fewer scheduler wake-ups);
   * the same outputs: greedy outputs of ``guided`` and ``drafts`` compared token for token, every
     finished JSON output judged by ``jsonschema`` (``--tokens`` high enough that they finish);
   * forward passes per output token, verified positions per output token, drafts accepted;
   * the proposer's own time per decode step: on the step's path (inline part + wait for the worker)
     and on the worker beside the forward, against the forward's time, beside and inline.

    python bench/grammar_drafts.py [--batches 1,8] [--schemas 8] [--tokens 192] [--drafts 4] [--rounds 2]
        [--instances 2] [--modes fixed,stream] [--rate 0] [--dtype bfloat16] [--workloads json,tools] [--fixed]
        [--skip-arrays]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench._common import ceiling, median, print_table  # noqa: E402  (also sets one torch thread)

DATA = Path("/work/shared/data/jsonschemabench/maskbench_Glaiveai2K.json")


def _has_array(schema: object) -> bool:
    if isinstance(schema, dict):
        return schema.get("type") == "array" or any(_has_array(v) for v in schema.values())
    if isinstance(schema, list):
        return any(_has_array(v) for v in schema)
    return False


def load_schemas(path: Path, n: int, vocab, any_whitespace: bool, skip_arrays: bool = False) -> list[tuple[str, dict]]:
    """(name, schema) of the first ``n`` schemas with required properties that compile here
    (without arrays when ``skip_arrays``: a small model repeats array items until the token cap,
    so such outputs never finish and cannot be judged)."""
    from tokenrails import GuideSpec, compile_guide
    from tokenrails.guided.errors import GuideError

    items = json.loads(path.read_text())["items"]
    out: list[tuple[str, dict]] = []
    for item in items:
        schema = item.get("schema")
        if not isinstance(schema, dict) or schema.get("type") != "object" or not schema.get("required"):
            continue
        if skip_arrays and _has_array(schema):
            continue
        try:
            compile_guide(GuideSpec.json_schema(json.dumps(schema), any_whitespace=any_whitespace), vocab)
        except GuideError:
            continue
        out.append((item.get("description", "?").split("/")[-1], schema))
        if len(out) == n:
            break
    return out


def prompt_for(name: str, schema: dict) -> str:
    return (f"Fill in realistic values for the function call `{name.rsplit('_', 1)[0]}` and answer with the JSON "
            f"arguments only. Schema: {json.dumps(schema)}")


def tool_calls(any_whitespace: bool) -> tuple[list[str], list, list[dict]]:
    """BFCL simple_python calls as bench/lmdeploy_engine.py builds them: prompts, specs, schemas."""
    from bench.lmdeploy_engine import bfcl_rows
    from tokenrails import GuideSpec

    rows = bfcl_rows()
    specs = [GuideSpec.json_schema(json.dumps(r.schema), any_whitespace=any_whitespace) for r in rows]
    return [r.prompt for r in rows], specs, [r.schema for r in rows]


class PositionCounter:
    """Decode forwards, the positions they ran over and their time, from the target forward's own inputs."""

    def __init__(self) -> None:
        from lmdeploy.pytorch.engine.model_agent import agent as agent_mod

        self.steps = self.positions = 0
        self.forward_s = 0.0
        self.dtypes: set[str] = set()  # what the engines' models actually run in
        original = agent_mod.BaseModelAgent.async_forward
        counter = self

        async def async_forward(agent, inputs, *args, **kwargs):
            counter.dtypes.add(str(getattr(agent.model_config, "dtype", "?")).replace("torch.", ""))
            if not inputs.is_decoding or inputs.is_dummy:
                return await original(agent, inputs, *args, **kwargs)
            t0 = time.perf_counter()
            try:
                return await original(agent, inputs, *args, **kwargs)
            finally:
                counter.forward_s += time.perf_counter() - t0
                counter.steps += 1
                counter.positions += int(inputs.input_ids.numel())

        agent_mod.BaseModelAgent.async_forward = async_forward

    def reset(self) -> None:
        self.steps = self.positions = 0
        self.forward_s = 0.0


def _first_difference(a, b) -> int | None:
    """Index of the first output token where two greedy outputs differ (None: byte-identical)."""
    ta, tb = list(a.token_ids), list(b.token_ids)
    if ta == tb and a.text == b.text:
        return None
    return next((i for i, (x, y) in enumerate(zip(ta, tb)) if x != y), min(len(ta), len(tb)))


# guided: the plain engine; drafts: grammar drafts with the proposer beside the forward;
# inline: the same drafts engine with the proposer between forwards (TOKENRAILS_DRAFTS_AHEAD=0);
# fixed (--fixed): every row padded to k verified positions
CONFIGS = ("guided", "drafts", "inline")
ENGINE_OF = {"guided": "plain", "drafts": "drafts", "inline": "drafts", "fixed": "fixed"}


def judge(outs, schemas: list[dict]) -> tuple[int, int]:
    """(finished outputs valid under jsonschema, finished outputs); capped ones are not judged."""
    import jsonschema

    valid = finished = 0
    for o, schema in zip(outs, schemas):
        if o.finish_reason != "stop":
            continue
        finished += 1
        try:
            jsonschema.validate(json.loads(o.text), schema)
            valid += 1
        except Exception:  # noqa: BLE001 - invalid or unparsable: counted as not valid
            pass
    return valid, finished


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--schemas", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=192, help="max new tokens: enough that JSON outputs finish")
    ap.add_argument("--drafts", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=2, help="rounds; configurations in ABBA order across rounds")
    ap.add_argument("--instances", type=int, default=2, help="engines per configuration, built in ABBA order")
    ap.add_argument("--modes", default="fixed,stream",
                    help="fixed: every row of the workload in calls of `batch` rows; stream: a continuous stream "
                         "of requests, at most `batch` running, refilled as rows finish")
    ap.add_argument("--rate", type=float, default=0.0, help="stream arrivals, requests/s (Poisson; 0: all at once)")
    ap.add_argument("--stream-requests", type=int, default=0, help="requests per stream at batch > 1 (0: 2 * batch; never fewer than the rows)")
    ap.add_argument("--whitespace", choices=("compact", "any"), default="compact")
    ap.add_argument("--dtype", default="bfloat16", help="comma list: float16, bfloat16 (every config alike)")
    ap.add_argument("--workloads", default="json,tools")
    ap.add_argument("--fixed", action="store_true", help="also run every row padded to k verified positions")
    ap.add_argument("--no-inline", action="store_true", help="skip the proposer-inline configuration")
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--skip-arrays", action="store_true",
                    help="json: only schemas without arrays (SmolLM2 repeats array items until the cap: unjudged)")
    args = ap.parse_args()

    import os

    from lmdeploy import GenerationConfig, pipeline

    from bench._common import abba, load_average, round_order, stream_requests
    from tokenrails import GuideSpec, Vocabulary
    from tokenrails.engine_patch.lmdeploy import activate
    from tokenrails.engine_patch.lmdeploy.speculative import draft_ahead, draft_metrics, grammar_drafts
    from tokenrails.engine_patch.lmdeploy.cpu import cpu_engine_config
    from tokenrails.demo_model import resolve_model_dir
    from transformers import AutoTokenizer

    model_dir = str(resolve_model_dir(quiet=True)[0])
    tok = AutoTokenizer.from_pretrained(model_dir)
    vocab = Vocabulary.from_huggingface(tok)
    encode = lambda s: tok.encode(s, add_special_tokens=False)  # noqa: E731
    any_ws = args.whitespace == "any"
    workloads: dict[str, tuple[list[str], list, list[dict]]] = {}
    for name in args.workloads.split(","):
        if name == "json":
            schemas = load_schemas(args.data, args.schemas, vocab, any_ws, args.skip_arrays)
            workloads[name] = ([prompt_for(n, s) for n, s in schemas],
                               [GuideSpec.json_schema(json.dumps(s), any_whitespace=any_ws) for _, s in schemas],
                               [s for _, s in schemas])
        elif name == "tools":
            workloads[name] = tool_calls(any_ws)
        else:
            raise SystemExit(f"unknown workload {name!r} (json, tools)")
    batches = [int(b) for b in args.batches.split(",")]
    modes = args.modes.split(",")
    configs = [c for c in CONFIGS if not (c == "inline" and args.no_inline)] + (["fixed"] if args.fixed else [])
    max_batch = max(batches)
    print(f"# workloads {list(workloads)} ({args.whitespace} whitespace, every row), {args.tokens} tokens max, "
          f"k={args.drafts}, batches {batches}, modes {modes} (stream rate {args.rate or 'all at once'}), dtypes "
          f"{args.dtype}, {args.rounds} rounds, {args.instances} engines per configuration built in ABBA order, "
          f"greedy, 1 thread; configurations {configs}; load average {load_average():.1f} at start", flush=True)
    counter = PositionCounter()
    mismatches = compared = 0

    for dtype in args.dtype.split(","):
        def engine(kind: str):
            activate(grammar_drafts=0 if kind == "plain" else args.drafts)
            if kind == "fixed":
                os.environ[grammar_drafts.ENV_FIXED] = "1"
            try:
                return pipeline(model_dir, backend_config=cpu_engine_config(
                    max_batch_size=max_batch, session_len=2048, num_gpu_blocks=256 + 8 * max_batch, dtype=dtype))
            finally:
                os.environ.pop(grammar_drafts.ENV_FIXED, None)
                activate(grammar_drafts=0)

        kinds = sorted({ENGINE_OF[c] for c in configs}, key=["plain", "drafts", "fixed"].index)
        pipes: dict[str, list] = {k: [] for k in kinds}
        for kind, _ in abba(kinds, args.instances):
            pipes[kind].append(engine(kind))

        for wl, (prompts, specs, schemas) in workloads.items():
            def run(config: str, idx: list[int], batch: int, mode: str, rnd: int) -> dict:
                gens = [GenerationConfig(max_new_tokens=args.tokens, top_k=1, response_format=specs[i]) for i in idx]
                insts = pipes[ENGINE_OF[config]]
                pipe = insts[rnd % len(insts)]
                if config == "inline":
                    os.environ[draft_ahead.ENV_AHEAD] = "0"
                draft_metrics.reset()
                draft_ahead.STATS.reset()
                counter.reset()
                try:
                    if mode == "stream":
                        outs, dt, cpu = stream_requests(pipe, [prompts[i] for i in idx], gens, limit=batch,
                                                        rate=args.rate, seed=rnd)
                    else:
                        outs, dt, cpu = [], 0.0, 0.0
                        for j in range(0, len(idx), batch):
                            t, c = time.perf_counter(), time.process_time()
                            outs += pipe([prompts[i] for i in idx[j:j + batch]], gen_config=gens[j:j + batch])
                            dt += time.perf_counter() - t
                            cpu += time.process_time() - c
                finally:
                    os.environ.pop(draft_ahead.ENV_AHEAD, None)
                stats = list(draft_metrics.all_requests().values())
                ntok = sum(o.generate_token_len for o in outs)
                req_steps = sum(s["grammar_draft_steps"] for s in stats)
                drafted, accepted = sum(s["grammar_drafted"] for s in stats), sum(s["grammar_draft_accepted"] for s in stats)
                ps = draft_ahead.STATS.as_dict()
                steps = max(counter.steps, 1)
                return {"outs": outs, "tok_s": ntok / dt, "cpu_tok_s": ntok / max(cpu, 1e-9), "wall": dt,
                        "fpt": req_steps / ntok if req_steps else 1.0, "acc": accepted / drafted if drafted else 0.0,
                        "ppt": counter.positions / max(ntok, 1), "fwd_ms": 1e3 * counter.forward_s / steps,
                        "prop_ms": 1e3 * ps["critical_s"] / max(ps["steps"], 1),
                        "ahead_ms": 1e3 * ps["ahead_s"] / max(ps["steps"], 1),
                        "guessed": ps["guessed"] / max(ps["guessed"] + ps["inline"], 1),
                        "valid": judge(outs, [schemas[i] for i in idx])}

            every = list(range(len(prompts)))
            for insts in pipes.values():  # warm-up: every grammar compiled in every engine, outside the timing
                for pipe in insts:
                    pipe([prompts[i] for i in every], gen_config=[
                        GenerationConfig(max_new_tokens=2, top_k=1, response_format=specs[i]) for i in every])
            ref = run("guided", every, max_batch, "fixed", 0)["outs"]  # 1. the ceiling, from plain guided outputs
            one, rule, total = ceiling([list(o.token_ids) for o in ref], specs, vocab, encode)
            print(f"\n## {wl} ({len(prompts)} requests), dtype {dtype} (models run in {sorted(counter.dtypes)})\n"
                  f"ceiling over {total} emitted tokens of plain guided outputs: one-token masks {one:.1%}, forced "
                  f"rule (one-token + canonical tokenization of forced strings) {rule:.1%}", flush=True)
            rows, step_rows = [], []
            for b in batches:
                for mode in modes:
                    if b == 1 and mode == "stream" and "fixed" in modes and not args.rate:
                        continue  # one row at a time, all queued at once: the same runs as fixed
                    n = max(len(prompts), (args.stream_requests or 2 * b) if b > 1 else 0)
                    idx = every if mode == "fixed" else [i % len(prompts) for i in range(n)]
                    res: dict[str, list[dict]] = {c: [] for c in configs}
                    loads = []
                    for rnd in range(args.rounds):
                        load = load_average()
                        for config in round_order(configs, rnd):
                            res[config].append(run(config, idx, b, mode, rnd))
                        loads.append(load)
                        g = res["guided"][-1]
                        line = " | ".join(f"{c} {res[c][-1]['tok_s']:.1f} tok/s {res[c][-1]['cpu_tok_s']:.1f} tok/cpu-s"
                                          for c in configs)
                        print(f"  batch {b} {mode} round {rnd} (load {load:.1f}): {line}", flush=True)
                        for c in configs:
                            if c != "guided":
                                diff = [_first_difference(x, y) for x, y in zip(g["outs"], res[c][-1]["outs"])]
                                bad = [x for x in diff if x is not None]
                                mismatches += len(bad)
                                compared += len(diff)
                                if bad:
                                    print(f"    {c} vs plain guided: {len(bad)} of {len(diff)} differ (first differing "
                                          f"token at {bad})", flush=True)

                    def med(c: str, key: str) -> float:
                        return median([r[key] for r in res[c]])

                    def paired(c: str, key: str) -> float:
                        return median([x[key] / y[key] for x, y in zip(res[c], res["guided"])])

                    same = sum(_first_difference(x, y) is None
                               for x, y in zip(res["guided"][0]["outs"], res["drafts"][0]["outs"]))
                    vg, vd = res["guided"][0]["valid"], res["drafts"][0]["valid"]
                    rows.append([b, mode, f"{med('guided', 'tok_s'):.1f}", f"{med('drafts', 'tok_s'):.1f}",
                                 f"{paired('drafts', 'cpu_tok_s'):.2f}x", f"{paired('drafts', 'tok_s'):.2f}x",
                                 f"{paired('inline', 'cpu_tok_s'):.2f}x" if "inline" in configs else "-",
                                 f"{med('drafts', 'fpt'):.2f}",
                                 f"{med('drafts', 'ppt'):.2f}", f"{med('drafts', 'acc'):.0%}", f"{same}/{len(idx)}",
                                 f"{vg[0]}/{vg[1]}/{len(idx)}", f"{vd[0]}/{vd[1]}/{len(idx)}",
                                 f"{min(loads):.1f}-{max(loads):.1f}"])
                    il = "inline" in configs
                    step_rows.append([b, mode, f"{med('drafts', 'fwd_ms'):.1f}", f"{med('drafts', 'prop_ms'):.2f}",
                                      f"{med('drafts', 'ahead_ms'):.2f}", f"{med('drafts', 'guessed'):.0%}",
                                      f"{med('inline', 'fwd_ms'):.1f}" if il else "-",
                                      f"{med('inline', 'prop_ms'):.2f}" if il else "-",
                                      f"{med('drafts', 'prop_ms') / max(med('drafts', 'fwd_ms'), 1e-9):.1%}",
                                      f"{med('inline', 'prop_ms') / max(med('inline', 'fwd_ms'), 1e-9):.1%}"
                                      if il else "-"])
            print()
            print_table(["batch", "mode", "guided tok/s", "drafts tok/s", "drafts/guided CPU", "drafts/guided wall",
                         "inline/guided CPU", "fwd/token", "positions/token", "drafts accepted",
                         "identical outputs", "valid/finished/all guided", "valid/finished/all drafts", "load"], rows)
            print("(ratios: medians of per-round ratios, each round measuring both configurations seconds apart; "
                  "CPU = output tokens per process CPU-second, all threads)\n\nproposer per decode step (ms): on the "
                  "step's path (inline part + wait for the worker) and on the worker beside the forward\n")
            print_table(["batch", "mode", "fwd ms (drafts)", "proposer ms on path", "proposer ms beside fwd",
                         "rows from guesses", "fwd ms (inline)", "proposer ms (inline)", "path/fwd", "path/fwd inline"],
                        step_rows)
        for insts in pipes.values():
            for pipe in insts:
                pipe.close()
        counter.dtypes.clear()
    print(f"\ngreedy plain guided vs drafts (beside the forward and inline), every request: {mismatches} of "
          f"{compared} differ" + (" (byte-identical everywhere)" if mismatches == 0 else "")
          + f"; load average {load_average():.1f} at the end")


if __name__ == "__main__":
    main()

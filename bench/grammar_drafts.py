"""Grammar drafts on LMDeploy 0.18's real engine on CPU: unguided vs plain guided vs guided + drafts.

Workloads (``--workloads``), greedy (top_k=1), ``--tokens`` new tokens at most, one torch thread,
the embedded SmolLM2-135M:

* ``json``: JSON extraction over someone else's schemas: JSONSchemaBench's Glaiveai2K subset
  (function argument schemas written by others, as shipped in MaskBench; ``--data``), the first
  ``--schemas`` that compile and have required properties; each request fills one schema.
* ``tools``: tool calls over the 8 BFCL ``simple_python`` functions of bench/data/ (built as in
  bench/lmdeploy_engine.py: ``{"name": <const>, "arguments": <the function's parameters>}``).

Both with ``--whitespace`` (compact by default: what a tool-call format fixes).

``--dtype float16,bfloat16``: every configuration runs once per dtype (``PytorchEngineConfig(dtype=)``,
the same for all of them). On this CPU a float16 matmul has no fast kernel and costs about linearly
in the positions verified (compute-bound), while bfloat16 costs nearly the same for 1 to 8
positions (memory-bound): bfloat16 here is the regime of a GPU decode step, float16 is not.

1. **Ceiling first**: plain guided outputs replayed through a fresh matcher; at every emitted token,
   is it the only token the mask allows (``one-token``), or the token the forced-token rule
   (guided/forced.py) would have drafted there (``rule``)? ``rule`` bounds what drafts can save.
2. Two engines in one process, both with the upgrade active: ``plain`` (no speculative decoding;
   runs ``unguided`` and ``guided``) and ``drafts`` (``activate(grammar_drafts=k)``: LMDeploy's
   speculative path with the grammar proposer). The three configurations are interleaved over
   ``--rounds`` rounds per batch size; figures are medians over rounds.
   * tokens/s: output tokens of the batch / wall time of the ``pipeline(...)`` call;
   * forward passes per output token (per request: steps it took part in / its tokens; 1.0 without
     drafts), and mean tokens per step (accepted drafts + 1);
   * greedy outputs of ``guided`` and ``drafts`` compared byte for byte on every request.

   * verified positions per output token: positions the target forward ran over in decode steps
     (counted from the engine's inputs), over output tokens; adaptive verification makes a row
     cost ``1 + (its forced run)`` positions, so this is <= 1 + drafted tokens per output token.

    python bench/grammar_drafts.py [--batches 1,8,32] [--schemas 8] [--tokens 64] [--drafts 4] [--rounds 1]
        [--whitespace compact|any] [--dtype float16,bfloat16] [--workloads json,tools]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench._common import median, print_table  # noqa: E402  (also sets one torch thread)

DATA = Path("/work/shared/data/jsonschemabench/maskbench_Glaiveai2K.json")


def load_schemas(path: Path, n: int, vocab, any_whitespace: bool) -> list[tuple[str, dict]]:
    """(name, schema) of the first ``n`` schemas with required properties that compile here."""
    from tokenrails import GuideSpec, compile_guide
    from tokenrails.guided.errors import GuideError

    items = json.loads(path.read_text())["items"]
    out: list[tuple[str, dict]] = []
    for item in items:
        schema = item.get("schema")
        if not isinstance(schema, dict) or schema.get("type") != "object" or not schema.get("required"):
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


def ceiling(outputs: list[list[int]], specs, vocab, encode) -> tuple[float, float, int]:
    """Fractions of emitted tokens that are one-token masks / the forced rule's draft there."""
    from tokenrails import compile_guide
    from tokenrails.guided.forced import forced_tokens

    single = rule = total = 0
    for ids, spec in zip(outputs, specs):
        m = compile_guide(spec, vocab).matcher()
        for t in ids:
            if t in vocab.eos_ids:
                break
            run = forced_tokens(m, 1, encode=encode)
            if run.tokens == (t,):
                rule += 1
                single += run.single
            total += 1
            if not m.accept_token(t):
                break
    return single / max(total, 1), rule / max(total, 1), total


def tool_calls(any_whitespace: bool) -> tuple[list[str], list, list[str]]:
    """BFCL simple_python calls as bench/lmdeploy_engine.py builds them: prompts, specs, labels."""
    from bench.lmdeploy_engine import bfcl_rows
    from tokenrails import GuideSpec

    rows = bfcl_rows()
    specs = [GuideSpec.json_schema(json.dumps(r.schema), any_whitespace=any_whitespace) for r in rows]
    return [r.prompt for r in rows], specs, [r.label for r in rows]


class PositionCounter:
    """Decode forwards and the positions they ran over, from the target forward's own inputs."""

    def __init__(self) -> None:
        from lmdeploy.pytorch.engine.model_agent import agent as agent_mod

        self.steps = self.positions = 0
        self.dtypes: set[str] = set()  # what the engines' models actually run in
        original = agent_mod.BaseModelAgent.async_forward
        counter = self

        async def async_forward(agent, inputs, *args, **kwargs):
            counter.dtypes.add(str(getattr(agent.model_config, "dtype", "?")).replace("torch.", ""))
            if inputs.is_decoding and not inputs.is_dummy:
                counter.steps += 1
                counter.positions += int(inputs.input_ids.numel())
            return await original(agent, inputs, *args, **kwargs)

        agent_mod.BaseModelAgent.async_forward = async_forward

    def reset(self) -> None:
        self.steps = self.positions = 0


def _first_difference(a, b) -> int | None:
    """Index of the first output token where two greedy outputs differ (None: byte-identical)."""
    ta, tb = list(a.token_ids), list(b.token_ids)
    if ta == tb and a.text == b.text:
        return None
    return next((i for i, (x, y) in enumerate(zip(ta, tb)) if x != y), min(len(ta), len(tb)))


CONFIGS = ("unguided", "guided", "fixed", "drafts")  # fixed: k positions per row (before adaptive)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--schemas", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--drafts", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--whitespace", choices=("compact", "any"), default="compact")
    ap.add_argument("--dtype", default="float16,bfloat16", help="comma list: float16, bfloat16 (every config alike)")
    ap.add_argument("--workloads", default="json,tools")
    ap.add_argument("--no-fixed", action="store_true", help="skip the fixed-k configuration (before adaptive)")
    ap.add_argument("--data", type=Path, default=DATA)
    args = ap.parse_args()

    import os

    from lmdeploy import GenerationConfig, pipeline

    from tokenrails import GuideSpec, Vocabulary
    from tokenrails.engine_patch.lmdeploy import activate, grammar_drafts
    from tokenrails.engine_patch.lmdeploy.cpu import cpu_engine_config
    from tokenrails.demo_model import resolve_model_dir
    from transformers import AutoTokenizer

    model_dir = str(resolve_model_dir(quiet=True)[0])
    tok = AutoTokenizer.from_pretrained(model_dir)
    vocab = Vocabulary.from_huggingface(tok)
    encode = lambda s: tok.encode(s, add_special_tokens=False)  # noqa: E731
    any_ws = args.whitespace == "any"
    workloads: dict[str, tuple[list[str], list]] = {}
    for name in args.workloads.split(","):
        if name == "json":
            schemas = load_schemas(args.data, args.schemas, vocab, any_ws)
            workloads[name] = ([prompt_for(n, s) for n, s in schemas],
                               [GuideSpec.json_schema(json.dumps(s), any_whitespace=any_ws) for _, s in schemas])
        elif name == "tools":
            prompts, specs, _ = tool_calls(any_ws)
            workloads[name] = (prompts, specs)
        else:
            raise SystemExit(f"unknown workload {name!r} (json, tools)")
    batches = [int(b) for b in args.batches.split(",")]
    configs = [c for c in CONFIGS if not (c == "fixed" and args.no_fixed)]
    max_batch = max(batches)
    print(f"# workloads {list(workloads)} ({args.whitespace} whitespace), {args.tokens} tokens max, k={args.drafts} "
          f"drafts, batches {batches}, dtypes {args.dtype}, {args.rounds} rounds, greedy, 1 thread; configurations "
          f"{configs} interleaved")
    counter = PositionCounter()
    mismatches = compared = 0

    for dtype in args.dtype.split(","):
        def engine(drafts: int, fixed: bool = False):
            activate(grammar_drafts=drafts)
            if fixed:
                os.environ[grammar_drafts.ENV_FIXED] = "1"
            try:
                return pipeline(model_dir, backend_config=cpu_engine_config(
                    max_batch_size=max_batch, session_len=2048, num_gpu_blocks=256 + 8 * max_batch, dtype=dtype))
            finally:
                os.environ.pop(grammar_drafts.ENV_FIXED, None)
                activate(grammar_drafts=0)

        pipes = {"plain": engine(0), "drafts": engine(args.drafts)}
        if "fixed" in configs:
            pipes["fixed"] = engine(args.drafts, fixed=True)
        engine_of = {"unguided": "plain", "guided": "plain", "fixed": "fixed", "drafts": "drafts"}

        for wl, (prompts, specs) in workloads.items():
            def run(config: str, idx: list[int]):
                guided = config != "unguided"
                gens = [GenerationConfig(max_new_tokens=args.tokens, top_k=1,
                                         response_format=specs[i] if guided else None) for i in idx]
                grammar_drafts.reset_stats()
                counter.reset()
                t = time.perf_counter()
                outs = pipes[engine_of[config]]([prompts[i] for i in idx], gen_config=gens)
                dt = time.perf_counter() - t
                stats = list(grammar_drafts._LEDGER.requests.values())
                return outs, dt, counter.positions, counter.steps, stats

            every = list(range(len(prompts)))
            for name in pipes:  # warm-up: every grammar compiled in every engine, outside the timing
                pipes[name]([prompts[i] for i in every], gen_config=[
                    GenerationConfig(max_new_tokens=2, top_k=1, response_format=specs[i]) for i in every])
            # 1. ceiling first, from plain guided outputs
            ref, *_ = run("guided", every)
            one, rule, total = ceiling([list(o.token_ids) for o in ref], specs, vocab, encode)
            print(f"\n## {wl} ({len(prompts)} requests), dtype {dtype} (models run in {sorted(counter.dtypes)})\nceiling over {total} emitted tokens of plain "
                  f"guided outputs: one-token masks {one:.1%}, forced rule (one-token + canonical tokenization of "
                  f"forced strings) {rule:.1%}")
            rows = []
            guided_alone: dict[int, object] = {}  # plain guided outputs at the first batch size
            control = [0, 0]  # plain guided at batch b vs at the first batch size: differ, compared
            for b in batches:
                idx = [i % len(prompts) for i in range(max(b, min(len(prompts), 4 if b == 1 else b)))]
                chunks = [idx[j:j + b] for j in range(0, len(idx), b)]
                tps: dict[str, list[float]] = {c: [] for c in configs}
                extra: dict[str, dict[str, list[float]]] = {c: {"fpt": [], "ppt": [], "tpstep": [], "acc": []}
                                                            for c in configs}
                for _ in range(args.rounds):
                    outs_of: dict[str, list] = {}
                    for config in configs:
                        ntok = dt = positions = steps = 0.0
                        outs_all, stats_all = [], []
                        for ch in chunks:
                            outs, t, pos, st, stats = run(config, ch)
                            outs_all += outs
                            stats_all += stats
                            dt += t
                            positions += pos
                            steps += st
                            ntok += sum(o.generate_token_len for o in outs)
                        outs_of[config] = outs_all
                        tps[config].append(ntok / dt)
                        ex = extra[config]
                        ex["ppt"].append(positions / max(ntok, 1))
                        req_steps = sum(s.steps for s in stats_all)
                        drafted = sum(s.drafted for s in stats_all)
                        accepted = sum(s.accepted for s in stats_all)
                        ex["fpt"].append(req_steps / ntok if req_steps else 1.0)
                        ex["tpstep"].append(ntok / req_steps if req_steps else 1.0)
                        ex["acc"].append(accepted / drafted if drafted else 0.0)
                    g = outs_of["guided"]
                    for c in configs:
                        if c in ("fixed", "drafts"):
                            diff = [_first_difference(a, d) for a, d in zip(g, outs_of[c])]
                            bad = [x for x in diff if x is not None]
                            mismatches += len(bad)
                            compared += len(g)
                            if bad:
                                print(f"  {c} vs plain guided, batch {b}: {len(bad)} of {len(g)} differ, first "
                                      f"differing output token at {bad}", flush=True)
                    # the control: plain guided itself at batch 1 vs this batch (same requests)
                    for i, o in zip(idx, g):
                        first = guided_alone.setdefault(i, o) if b == batches[0] else guided_alone.get(i)
                        if first is not None and first is not o:
                            control[1] += 1
                            control[0] += _first_difference(first, o) is not None
                m = {c: median(v) for c, v in tps.items()}
                row = [b, f"{m['unguided']:.1f}", f"{m['guided']:.1f}"]
                if "fixed" in configs:
                    row += [f"{m['fixed']:.1f}", f"{m['fixed'] / m['guided']:.2f}x"]
                d = extra["drafts"]
                row += [f"{m['drafts']:.1f}", f"{m['drafts'] / m['guided']:.2f}x", f"{m['drafts'] / m['unguided']:.2f}x",
                        f"{median(d['fpt']):.2f}", f"{median(d['ppt']):.2f}"]
                if "fixed" in configs:
                    row += [f"{median(extra['fixed']['ppt']):.2f}"]
                row += [f"{median(extra['guided']['ppt']):.2f}", f"{median(d['tpstep']):.2f}", f"{median(d['acc']):.0%}"]
                rows.append(row)
                print(f"  (batch {b} done: {' | '.join(str(c) for c in row)})", flush=True)
            headers = ["batch", "unguided tok/s", "guided tok/s"]
            if "fixed" in configs:
                headers += ["fixed-k tok/s", "fixed/guided"]
            headers += ["adaptive tok/s", "adaptive/guided", "adaptive/unguided", "fwd/token", "positions/token"]
            if "fixed" in configs:
                headers += ["positions/token fixed-k"]
            headers += ["positions/token guided", "tokens/step", "drafts accepted"]
            print()
            print_table(headers, rows)
            if control[1]:
                print(f"control: plain guided, the same request at batch {batches[0]} vs at the other batch sizes (or "
                      f"repeated in one batch): {control[0]} of {control[1]} differ (greedy outputs that depend on the "
                      f"forward's shape: floating point)")
        for pipe in pipes.values():
            pipe.close()
        counter.dtypes.clear()
    print(f"\ngreedy plain guided vs guided + drafts (fixed-k and adaptive), every request of every workload, batch "
          f"and dtype: {mismatches} of {compared} differ" + (" (byte-identical everywhere)" if mismatches == 0 else ""))


if __name__ == "__main__":
    main()

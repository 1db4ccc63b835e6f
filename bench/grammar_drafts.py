"""Grammar drafts on LMDeploy 0.18's real engine on CPU: unguided vs plain guided vs guided + drafts.

Workload: JSON extraction over someone else's schemas: JSONSchemaBench's Glaiveai2K subset (function
argument schemas written by others, as shipped in MaskBench; ``--data``), the first ``--schemas``
that compile and have required properties. Each request asks the embedded SmolLM2-135M to fill one
schema; greedy (top_k=1), ``--tokens`` new tokens at most, one torch thread.

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

    python bench/grammar_drafts.py [--batches 1,8] [--schemas 8] [--tokens 96] [--drafts 4] [--rounds 2]
        [--whitespace compact|any]
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--schemas", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--drafts", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--whitespace", choices=("compact", "any"), default="compact")
    ap.add_argument("--data", type=Path, default=DATA)
    args = ap.parse_args()

    from lmdeploy import GenerationConfig, pipeline

    from tokenrails import GuideSpec, Vocabulary
    from tokenrails.engine_patch.lmdeploy import activate, grammar_drafts
    from tokenrails.engine_patch.lmdeploy.cpu import cpu_engine_config
    from tokenrails.models import resolve_model_dir
    from transformers import AutoTokenizer

    model_dir = str(resolve_model_dir(quiet=True)[0])
    tok = AutoTokenizer.from_pretrained(model_dir)
    vocab = Vocabulary.from_huggingface(tok)
    encode = lambda s: tok.encode(s, add_special_tokens=False)  # noqa: E731
    any_ws = args.whitespace == "any"
    schemas = load_schemas(args.data, args.schemas, vocab, any_ws)
    specs = [GuideSpec.json_schema(json.dumps(s), any_whitespace=any_ws) for _, s in schemas]
    prompts = [prompt_for(n, s) for n, s in schemas]
    batches = [int(b) for b in args.batches.split(",")]
    max_batch = max(batches)
    print(f"# {len(schemas)} Glaiveai2K schemas ({args.whitespace} whitespace), {args.tokens} tokens max, "
          f"k={args.drafts} drafts, batches {batches}, {args.rounds} rounds, greedy, 1 thread")

    activate(grammar_drafts=0)
    plain = pipeline(model_dir, backend_config=cpu_engine_config(max_batch_size=max_batch, session_len=2048,
                                                                  num_gpu_blocks=256))
    activate(grammar_drafts=args.drafts)
    drafts = pipeline(model_dir, backend_config=cpu_engine_config(max_batch_size=max_batch, session_len=2048,
                                                                   num_gpu_blocks=256))
    activate(grammar_drafts=0)

    def gens(guided: bool, idx: list[int]):
        return [GenerationConfig(max_new_tokens=args.tokens, top_k=1, response_format=specs[i] if guided else None)
                for i in idx]

    def run(pipe, guided: bool, idx: list[int]):
        grammar_drafts.reset_stats()
        t = time.perf_counter()
        outs = pipe([prompts[i] for i in idx], gen_config=gens(guided, idx))
        dt = time.perf_counter() - t
        ntok = sum(o.generate_token_len for o in outs)
        stats = dict(grammar_drafts._LEDGER.requests)
        steps = sum(s.steps for s in stats.values())
        emitted = sum(s.emitted for s in stats.values())
        drafted = sum(s.drafted for s in stats.values())
        accepted = sum(s.accepted for s in stats.values())
        if not steps:  # no speculative decoding: one forward pass per output token
            return outs, ntok / dt, 1.0, 1.0, 0.0
        # passes per output token: the steps each request took part in over the tokens it returned
        return outs, ntok / dt, steps / ntok, ntok / steps, (accepted / drafted if drafted else 0.0)

    # warm-up: every grammar compiled in both engines, outside the timing
    warm = list(range(len(schemas)))
    for pipe in (plain, drafts):
        pipe([prompts[i] for i in warm], gen_config=[GenerationConfig(max_new_tokens=2, top_k=1,
                                                                       response_format=specs[i]) for i in warm])

    # 1. ceiling from plain guided outputs
    ref, *_ = run(plain, True, warm)
    one, rule, total = ceiling([list(o.token_ids) for o in ref], specs, vocab, encode)
    print(f"\nceiling over {total} emitted tokens of plain guided outputs: one-token masks {one:.1%}, "
          f"forced rule (one-token + canonical tokenization of forced strings) {rule:.1%}")

    rows = []
    mismatches = compared = 0
    for b in batches:
        idx = [i % len(schemas) for i in range(max(b, min(len(schemas), 4 if b == 1 else b)))]
        chunks = [idx[j:j + b] for j in range(0, len(idx), b)]
        res: dict[str, list] = {"unguided": [], "guided": [], "drafts": []}
        extra: dict[str, list] = {"fpt": [], "tps": [], "acc": []}
        for _ in range(args.rounds):
            for name, pipe, guided in (("unguided", plain, False), ("guided", plain, True), ("drafts", drafts, True)):
                total_tok = total_t = 0.0
                outs_all = []
                for ch in chunks:
                    t = time.perf_counter()
                    outs, tps, fpt, tpstep, acc = run(pipe, guided, ch)
                    total_t += time.perf_counter() - t
                    total_tok += sum(o.generate_token_len for o in outs)
                    outs_all += outs
                    if name == "drafts":
                        extra["fpt"].append(fpt)
                        extra["tps"].append(tpstep)
                        extra["acc"].append(acc)
                res[name].append((total_tok / total_t, outs_all))
            g, d = res["guided"][-1][1], res["drafts"][-1][1]
            mismatches += sum(a.text != b_.text or list(a.token_ids) != list(b_.token_ids) for a, b_ in zip(g, d))
            compared += len(g)
        tps = {k: median([r[0] for r in v]) for k, v in res.items()}
        rows.append([b, f"{tps['unguided']:.1f}", f"{tps['guided']:.1f}", f"{tps['drafts']:.1f}",
                     f"{tps['drafts'] / tps['guided']:.2f}x", f"{tps['drafts'] / tps['unguided']:.2f}x",
                     f"{median(extra['fpt']):.2f}", f"{median(extra['tps']):.2f}", f"{median(extra['acc']):.0%}"])
    print()
    print_table(["batch", "unguided tok/s", "guided tok/s", "guided+drafts tok/s", "drafts/guided",
                 "drafts/unguided", "fwd/token (drafts)", "tokens/step", "drafts accepted"], rows)
    print(f"\ngreedy guided vs guided+drafts: {mismatches} of {compared} requests differ"
          + (" (byte-identical everywhere)" if mismatches == 0 else ""))
    plain.close()
    drafts.close()


if __name__ == "__main__":
    main()

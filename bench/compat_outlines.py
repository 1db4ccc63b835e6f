"""Outlines shim vs outlines-core (the engine outlines 1.x runs on), same run, same tokenizer.

Measures, for regex / choice / JSON constraints:
  * compile: shim processor construction vs ``outlines_core.Index`` construction;
  * step: one masking step on a [1, V] logits row while replaying a valid token path, through
    the shim's processor (``RegexLogitsProcessor``/``JSONLogitsProcessor.__call__``) against two
    peers: a bare outlines-core loop (``Guide.advance`` + ``write_mask_into`` + the same bitmask
    apply kernel: the floor, no processor around it) and outlines 1.3.3's own
    ``OutlinesCoreLogitsProcessor`` on that index (what an outlines 1.x user ran; its sdist is
    fetched with pip at run time, as bench/outlines_suites.py does; ``--no-outlines`` skips it).
Prints ratios peer/ours (> 1 means the shim is faster).

    OMP_NUM_THREADS=1 python bench/compat_outlines.py [--tokenizer DIR] [--repeat N] [--no-outlines]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

torch.set_num_threads(1)

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer"},
        "armor": {"enum": ["leather", "chain", "plate"]},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
    },
    "required": ["name", "age", "armor"],
}
CASES = [
    ("regex", r"[0-9]{3}-[a-z]{2,8}-(alpha|beta|gamma)", "123-abcdef-gamma"),
    ("choice", ["Positive", "Negative", "Neutral", "Mixed"], "Neutral"),
    ("json", SCHEMA, '{"name": "Ada Lovelace", "age": 36, "armor": "plate", "tags": ["math", "poet"]}'),
]


def best(fn, repeat: int = 3) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def outlines_core_regex(kind: str, payload) -> str:
    import re

    from outlines_core.json_schema import build_regex_from_schema

    if kind == "regex":
        return payload
    if kind == "choice":
        return "(" + "|".join(re.escape(c) for c in payload) + ")"
    return build_regex_from_schema(json.dumps(payload))


def outlines_1x_processor_class():
    """outlines 1.3.3's ``OutlinesCoreLogitsProcessor``, imported from its fetched sdist (None,
    with a note, when it cannot be fetched or imported here)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    try:
        from outlines_suites import package_root

        sys.path.insert(0, str(package_root("1.3.3")))
        from outlines.backends.outlines_core import OutlinesCoreLogitsProcessor
    except Exception as exc:  # noqa: BLE001 - a missing peer is reported, not fatal
        print(f"(outlines 1.3.3 processor peer unavailable: {exc!r})")
        return None
    return OutlinesCoreLogitsProcessor


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer", default=str(ROOT / "tests/fixtures/smollm2"))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-outlines", action="store_true", help="skip the outlines 1.3.3 processor peer")
    args = ap.parse_args()
    real_processor = None if args.no_outlines else outlines_1x_processor_class()

    import outlines_core as oc
    from transformers import AutoTokenizer

    from tokenrails import apply_token_bitmask_inplace
    from tokenrails.compat import outlines
    from tokenrails.compat.outlines._vocabulary import vocabulary_for
    from tokenrails.guided.spec import GuideSpec

    tok = AutoTokenizer.from_pretrained(args.tokenizer)
    vocab = vocabulary_for(tok)
    V = vocab.vocab_size
    eos = vocab.eos_ids[0]
    token_map: dict[bytes, list[int]] = {}
    for i, b in enumerate(vocab.grammar_token_bytes()):
        if b and i not in vocab.special_ids:
            token_map.setdefault(b, []).append(i)
    t0 = time.perf_counter()
    core_vocab = oc.Vocabulary(eos, token_map)
    print(f"tokenizer {Path(args.tokenizer).name}: V={V}, outlines-core Vocabulary {time.perf_counter() - t0:.2f}s")
    # warm the shim's per-vocabulary tables once (outlines-core's Vocabulary above is the peer's)
    outlines.processors.RegexLogitsProcessor("a", tok)

    print(f"{'case':8} {'compile ours':>13} {'compile peer':>13} {'ratio':>6} | "
          f"{'step ours':>10} {'core loop':>10} {'ratio':>6} | {'outlines 1.3.3':>14} {'ratio':>6}")
    for kind, payload, example in CASES:
        regex = outlines_core_regex(kind, payload)
        path = tok.encode(example, add_special_tokens=False)

        def ours_compile():
            if kind == "json":
                return outlines.processors.JSONLogitsProcessor(payload, tok)
            if kind == "choice":
                from tokenrails.compat.outlines.processors.structured import processor_for_spec

                return processor_for_spec(GuideSpec.choice(payload), tok)
            return outlines.processors.RegexLogitsProcessor(payload, tok)

        # compile (the shim's compile cache is per guide, so every call compiles)
        c_ours = best(ours_compile, args.repeat)
        c_peer = best(lambda: oc.Index(regex, core_vocab), args.repeat)

        proc = ours_compile()
        index = oc.Index(regex, core_vocab)
        logits = torch.randn(1, V)
        prompt = torch.tensor([[1, 2, 3]])

        def ours_walk():
            p = proc.copy()
            ids = prompt
            for t in [*path, None]:
                p(ids, logits.clone())
                if t is not None:
                    ids = torch.cat([ids, torch.tensor([[t]])], dim=1)

        mask = torch.zeros(1, (V + 31) // 32, dtype=torch.int32)

        def peer_walk():
            guide = oc.Guide(index)
            for t in [*path, None]:
                guide.write_mask_into(mask.data_ptr(), mask.numel(), mask.element_size())
                apply_token_bitmask_inplace(logits.clone(), mask)
                if t is not None:
                    guide.advance(t)

        def real_walk():
            p.reset()
            ids = prompt
            for t in [*path, None]:
                p(ids, logits.clone())
                if t is not None:
                    ids = torch.cat([ids, torch.tensor([[t]])], dim=1)

        steps = len(path) + 1
        s_ours = best(ours_walk, args.repeat) / steps
        s_peer = best(peer_walk, args.repeat) / steps
        real = "n/a"
        if real_processor is not None:
            p = real_processor(index, "torch")
            s_real = best(real_walk, args.repeat) / steps
            real = f"{s_real * 1e6:12.0f}us {s_real / s_ours:6.2f}"
        print(f"{kind:8} {c_ours * 1e3:11.1f}ms {c_peer * 1e3:11.1f}ms {c_peer / c_ours:6.2f} | "
              f"{s_ours * 1e6:8.0f}us {s_peer * 1e6:8.0f}us {s_peer / s_ours:6.2f} | {real}")
    print(f"(steps include cloning a [1, {V}] float32 row in both; peer = outlines-core {oc.__version__ if hasattr(oc, '__version__') else ''})")
    if real_processor is not None:
        xgrammar_processor_rows(tok, V, args.repeat)


def xgrammar_processor_rows(tok, width: int, repeat: int) -> None:
    """A processor per request from an ``xgrammar.CompiledGrammar`` (outlines 1.x's
    ``XGrammarLogitsProcessor(compiled_grammar, "torch")``): construction plus the first masking
    step, the shim's against outlines 1.3.3's own, for a grammar seen before and for a freshly
    compiled one on the same tokenizer (compilation itself excluded from both)."""
    import xgrammar as xgr
    from outlines.backends.xgrammar import XGrammarLogitsProcessor as TheirXGrammarProcessor

    from tokenrails.compat.outlines.backends.xgrammar import XGrammarLogitsProcessor as OurXGrammarProcessor

    compiler = xgr.GrammarCompiler(xgr.TokenizerInfo.from_huggingface(tok, vocab_size=width))
    ids, logits = torch.tensor([[1, 2, 3]]), torch.randn(1, width)

    def first_step(cls, grammar) -> float:
        t0 = time.perf_counter()
        cls(grammar, "torch")(ids, logits.clone())
        return time.perf_counter() - t0

    seen = compiler.compile_regex(r"[0-9]{3}-[a-z]{2,8}")
    first_step(OurXGrammarProcessor, seen)  # this grammar's first processor: the "new grammar" row
    fresh = [compiler.compile_regex(f"[0-9]{{{n}}}-[a-z]+") for n in range(1, 2 * repeat + 1)]
    rows = {
        "same grammar": ([seen] * repeat, [seen] * repeat),
        "new grammar": (fresh[:repeat], fresh[repeat:]),  # each grammar's first processor, on each side
    }
    print("processor per request from a compiled xgrammar grammar (construction + first step):")
    for label, (ours_grammars, their_grammars) in rows.items():
        ours = min(first_step(OurXGrammarProcessor, g) for g in ours_grammars)
        theirs = min(first_step(TheirXGrammarProcessor, g) for g in their_grammars)
        print(f"  {label:13} ours {ours * 1e3:8.2f}ms  outlines 1.3.3 {theirs * 1e3:8.2f}ms  ratio {theirs / ours:6.2f}")

if __name__ == "__main__":
    main()

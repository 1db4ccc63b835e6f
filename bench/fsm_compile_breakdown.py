"""Where the fsm backend's compile time goes, per workload of ``fsm_vs_peers`` (qwen2 by default).

Pieces: parse (regex → AST), automaton (AST/choices → minimal byte DFA: UTF-8 split, NFA,
subset construction, minimization), index (TokenIndex construction + first row: the token-index
side). Each piece is the median of ``--repeat`` runs after one warm-up compile, so per-process
caches (Unicode tables, charset fragments, the vocabulary trie) are warm, as in a server; "min ms"
is the fastest total (a less noisy number on a shared machine).
The automaton step is timed both ways in the same run, interleaved: "dfa ms" with the C builder
(tokenrails._dfa_native, when built) and "py dfa ms" with the pure-Python path (only the DFA
step is switched; the index always uses whatever is built); "py/C" is their ratio.
A second table times the whole regex → DFA step as ``compile_regex`` does it: "regex us" (the one
parser, Python, then the C builder from the flattened AST) and "pure us" all in Python
(``TOKENRAILS_NATIVE=0``, timed after the other); medians, with "pure/regex".
With ``--variants`` (or ``--regex-only``) the second table also times ``VARIANTS``: anchored forms
of typical user patterns (``^...$``, ``\\A...\\Z``) and non-ASCII character sets (Unicode ``\\w``,
``[^"\\\\]``, ``.``, ``[é-ü]``).
``--baseline-so PATH`` (another build of ``_dfa_native``, e.g. the previous commit's) adds "base us",
interleaved with "regex us" in the same run, and "base/regex": with a build that still has the C
regex parser (``compile_regex``, removed in issue 23) the baseline is that parser's one-call
parse-and-build, so the column is the before/after of moving to one (Python) parser; with any other
build it is ``compile_regex`` with that module's builder swapped in.
``--profile NAME`` prints a cProfile of the automaton step of one workload.
Run: OMP_NUM_THREADS=1 python bench/fsm_compile_breakdown.py [--vocab qwen2] [--repeat 21] [--variants]
     [--regex-only] [--baseline-so PATH] [--stat min]
"""
from __future__ import annotations

import argparse
import cProfile
import importlib.util
import os
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import load_tokenizer  # noqa: E402
from bench.fsm_vs_peers import workloads  # noqa: E402
from tokenrails import Vocabulary, native  # noqa: E402
from tokenrails.guided.fsm.compiler import compile_ast, compile_choices, compile_regex  # noqa: E402
from tokenrails.guided.fsm.dfa import START  # noqa: E402
from tokenrails.guided.fsm.native_builder import NATIVE_MAX_BYTES, native_dfa, native_module  # noqa: E402
from tokenrails.guided.fsm.thompson import charset_fragment  # noqa: E402
from tokenrails.guided.fsm.matcher import grammar_bytes  # noqa: E402
from tokenrails.guided.fsm.deadline import Deadline  # noqa: E402
from tokenrails.guided.fsm.regex_parser import parse_regex  # noqa: E402
from tokenrails.guided.fsm.token_index import TokenIndex  # noqa: E402
from tokenrails.guided.fsm.token_trie import token_trie  # noqa: E402
from tokenrails.guided.limits import GuideLimits  # noqa: E402


# (name, regex) timed by regex_table besides the fsm_vs_peers workloads with --variants/--regex-only
VARIANTS = [
    ("^phone$", r"^\d{3}-\d{4}$"),
    ("^upper$", r"^[A-Z]+$"),
    ("^email$", r"^[a-z0-9._%+-]+@[a-z0-9.-]+\.[a-z]{2,}$"),
    ("\\Adate\\Z", r"\A[0-9]{4}-[0-9]{2}-[0-9]{2}\Z"),
    ("^a|b$", r"^(yes|no)$|^maybe$"),
    ("\\w+", r"\w+"),
    ("[^\"\\]*", r'[^"\\]*'),
    (".{1,5}", r".{1,5}"),
    ("[é-ü]+", r"[é-ü]+"),
    ("\\d{3}", r"\d{3}"),
    ("^\\w+$", r"^\w+@\w+\.com$"),
    ("a{b", r"a{b}c"),
]


def automaton(regex, choices, limits, python: bool):
    """(seconds of the AST/choices → DFA step, DFA), with the DFA step forced to Python or not."""
    old = os.environ.get("TOKENRAILS_NATIVE")
    if python:
        os.environ["TOKENRAILS_NATIVE"] = "0"
    try:
        ast = None if choices else parse_regex(regex, limits.max_repeat)
        t0 = time.perf_counter()
        dfa = compile_choices(choices, limits) if choices else compile_ast(ast, limits)
        return time.perf_counter() - t0, dfa
    finally:
        if old is None:
            os.environ.pop("TOKENRAILS_NATIVE", None)
        else:
            os.environ["TOKENRAILS_NATIVE"] = old


def _old_fast_path(mod, regex, limits):
    """A build with the removed C regex parser: its parse-and-build call, as compile_regex made it."""
    from tokenrails.guided.fsm.unicode_classes import unicode_digit, unicode_space, unicode_word

    deadline = Deadline(limits.compile_timeout_s)
    max_nfa = max(2 * limits.max_dfa_states, 1024)
    for _ in range(4):  # it asked for the \\d \\w \\s tables on first use
        result = mod.compile_regex(regex, limits.max_repeat, max_nfa, limits.max_dfa_states,
                                   max(deadline.remaining(), 0.0), NATIVE_MAX_BYTES, charset_fragment)
        if type(result) is not int:
            break
        for bit, index, table in ((1, 0, unicode_digit), (2, 1, unicode_word), (4, 2, unicode_space)):
            if result & bit:
                mod.set_class_ranges(index, table())
    if result is None or type(result) is int:  # declined: the Python parser, then that build's builder
        return _with_module(mod, lambda: compile_regex(regex, limits))()
    return native_dfa(result, limits.max_dfa_states, deadline, NATIVE_MAX_BYTES, max_nfa)


def _median_us(fn, n: int) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return sorted(times)[n // 2] * 1e6


def load_baseline(path: str):
    """Another build of ``_dfa_native`` loaded beside the current one (its own class tables/caches)."""
    spec = importlib.util.spec_from_file_location("baseline._dfa_native", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _with_module(mod, fn):
    """``fn`` run with ``mod`` as the loaded ``_dfa_native`` (what compile_regex calls)."""
    def run():
        current = native._LOADED.get("dfa")
        native._LOADED["dfa"] = mod
        try:
            return fn()
        finally:
            native._LOADED["dfa"] = current
    return run


def regex_table(limits, repeat: int, variants: bool = False, baseline=None, stat: str = "median") -> None:
    """regex → DFA: this tree [vs the baseline build], interleaved; pure Python after them (its
    allocations would evict the caches the others run in, so it is not interleaved)."""
    print()
    print(f"{'regex->DFA':12s} {'regex us':>9s} {'pure us':>9s} {'pure/regex':>10s}"
          + (f" {'base us':>9s} {'base/regex':>10s}" if baseline else ""))
    n = max(repeat, 21) * 10
    old = os.environ.get("TOKENRAILS_NATIVE")
    try:
        cases = [(name, regex) for name, regex, _text, choices in workloads() if not choices]
        for name, regex in cases + (VARIANTS if variants else []):
            os.environ["TOKENRAILS_NATIVE"] = "1"
            current = lambda: compile_regex(regex, limits)  # noqa: E731
            runners = [("regex", current)]
            if baseline is not None:
                if hasattr(baseline, "compile_regex"):
                    runners.append(("base", lambda: _old_fast_path(baseline, regex, limits)))
                else:
                    runners.append(("base", _with_module(baseline, current)))
            for _key, fn in runners:  # warm caches
                fn()
            times: dict[str, list[float]] = {key: [] for key, _fn in runners}
            for i in range(n):  # interleaved, rotating which goes first
                k = i % len(runners)
                for key, fn in runners[k:] + runners[:k]:
                    t0 = time.perf_counter()
                    fn()
                    times[key].append(time.perf_counter() - t0)
            at = n // 2 if stat == "median" else 0
            med = {k: sorted(v)[at] * 1e6 for k, v in times.items()}
            os.environ["TOKENRAILS_NATIVE"] = "0"
            current()
            pure = _median_us(current, max(repeat, 21))
            base = f" {med['base']:9.1f} {med['base'] / med['regex']:10.2f}" if baseline is not None else ""
            print(f"{name:12s} {med['regex']:9.1f} {pure:9.1f} {pure / med['regex']:10.1f}" + base)
    finally:
        if old is None:
            os.environ.pop("TOKENRAILS_NATIVE", None)
        else:
            os.environ["TOKENRAILS_NATIVE"] = old


def pieces(regex, choices, limits, vocab, trie):
    t0 = time.perf_counter()
    if choices:
        ast = None
        t1 = time.perf_counter()
        dfa = compile_choices(choices, limits)
    else:
        ast = parse_regex(regex, limits.max_repeat)
        t1 = time.perf_counter()
        dfa = compile_ast(ast, limits)
    t2 = time.perf_counter()
    index = TokenIndex(dfa, vocab, trie)
    index.row(START)
    t3 = time.perf_counter()
    return (t1 - t0, t2 - t1, t3 - t2), dfa


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--vocab", default="qwen2")
    ap.add_argument("--repeat", type=int, default=21)
    ap.add_argument("--profile", default="")
    ap.add_argument("--regex-only", action="store_true", help="only the regex -> DFA table (no vocabulary)")
    ap.add_argument("--variants", action="store_true", help="also time VARIANTS (anchored, Unicode sets)")
    ap.add_argument("--baseline-so", default="", help="another _dfa_native build to time beside this one")
    ap.add_argument("--stat", choices=("median", "min"), default="median",
                    help="regex table: median or fastest of the interleaved runs (min: less noise on a shared machine)")
    args = ap.parse_args()
    baseline = load_baseline(args.baseline_so) if args.baseline_so else None
    if args.regex_only:
        regex_table(GuideLimits(), args.repeat, variants=True, baseline=baseline, stat=args.stat)
        return
    vocab = Vocabulary.from_huggingface(load_tokenizer(args.vocab))
    trie = token_trie(vocab)
    grammar_bytes(vocab)
    limits = GuideLimits()
    print(f"native DFA builder: {'on' if native_module() is not None else 'off (Python path)'}")
    print(f"{'workload':12s} {'parse ms':>9s} {'dfa ms':>9s} {'index ms':>9s} {'total ms':>9s} {'states':>7s} "
          f"{'classes':>7s} {'min ms':>8s} {'py dfa ms':>9s} {'py/C':>6s}")
    for name, regex, _text, choices in workloads():
        pieces(regex, choices, limits, vocab, trie)  # warm-up
        automaton(regex, choices, limits, python=True)
        runs, py = [], []
        for _ in range(args.repeat):
            t, dfa = pieces(regex, choices, limits, vocab, trie)
            runs.append(t)
            py.append(automaton(regex, choices, limits, python=True)[0])
        med = [sorted(r[i] for r in runs)[len(runs) // 2] for i in range(3)]
        py_med = sorted(py)[len(py) // 2]
        print(f"{name:12s} {med[0]*1e3:9.3f} {med[1]*1e3:9.3f} {med[2]*1e3:9.3f} {sum(med)*1e3:9.3f} "
              f"{dfa.num_states:7d} {dfa.num_classes:7d} {min(map(sum, runs))*1e3:8.3f} {py_med*1e3:9.3f} "
              f"{py_med / med[1]:6.1f}")
        if args.profile == name:
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(args.repeat):
                if choices:
                    compile_choices(choices, limits)
                else:
                    compile_ast(parse_regex(regex, limits.max_repeat), limits)
            prof.disable()
            pstats.Stats(prof).sort_stats("tottime").print_stats(25)
    regex_table(limits, args.repeat, args.variants, baseline, args.stat)


if __name__ == "__main__":
    main()

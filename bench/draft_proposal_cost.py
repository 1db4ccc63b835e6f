"""What one row's grammar-draft proposal costs, part by part, without an engine (CPU time, one thread).

The proposer (engine_patch/lmdeploy/speculative/grammar_drafts.py) asks ``guided.forced.forced_tokens``
for each guided row every step. This replays that on real states: the bench's two workloads (BFCL tool
calls and JSONSchemaBench Glaiveai2K schemas, compact whitespace, the backends ``auto`` picks), each
matcher walked a few steps along forced runs and allowed tokens, then per row:

* ``forced run``: the whole ``forced_tokens`` call (k = 4), with the forced-string tokenizations
  memoised as the proposer does, and without the memo (a tokenizer call per forced string);
* its parts, each timed alone at the same states, with how often one run calls it: the mask fill,
  the one-token check on the filled mask, the forced-string query (``jump_forward_probe`` or
  ``find_jump_forward_string``), the tokenizer, accept + rollback;
* the whole run under the rule of ``--base`` (see below), for comparison.

Per step the proposer pays ``rows x forced run`` plus a fixed part (row handles, the thread hop), which
``bench/grammar_drafts.py`` prints as the proposer's time on the step's path.

Then the grammar's whole host work of a drafts step at ``--batches`` rows (rows walked like the states
above, through a ``GuidedDecodingManager``): the proposal of every row (``forced_tokens(propose=True)``),
then the verification's masks as the engine asks for them (``fill_and_apply_spec`` on a
``[batch x (K + 1), V]`` bfloat16 block, a row's positions past its run carrying its last token as
filler, reusing what the proposal saw), and for this checkout the same masks filled ahead (``fill_spec``,
as ``TOKENRAILS_SPEC_PREFILL`` does beside the forward) and then checked and applied (what stays on the
step's path). Two arms alternate ABBA, CPU time per step: this checkout's
rule, and the rule of ``--base`` (``guided/forced.py`` as that git revision has it, loaded beside this
one; the rest of the code is this checkout's).

    python bench/draft_proposal_cost.py [--states 64] [--repeat 5] [--batches 1,8,32] [--steps 40] [--base REV]
"""
from __future__ import annotations

import argparse
import functools
import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench._common import load_average, print_table  # noqa: E402  (also sets one torch thread)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--states", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--drafts", type=int, default=4)
    ap.add_argument("--batches", default="1,8,32", help="rows per step for the step table ('' to skip it)")
    ap.add_argument("--steps", type=int, default=40, help="steps per arm and batch for the step table")
    ap.add_argument("--base", default="4497acc", help="git revision whose forced.py is the other arm ('' for none)")
    ap.add_argument("--no-lookup", action="store_true", help="this arm without lookup drafts (forced runs only)")
    args = ap.parse_args()

    from transformers import AutoTokenizer

    from bench.grammar_drafts import DATA, load_schemas, tool_calls
    from tokenrails import GuideSpec, Vocabulary, allocate_token_bitmask, compile_guide
    from tokenrails.demo_model import resolve_model_dir
    from tokenrails.guided import forced

    tok = AutoTokenizer.from_pretrained(str(resolve_model_dir(quiet=True)[0]))
    vocab = Vocabulary.from_huggingface(tok)
    plain = lambda text: tok.encode(text, add_special_tokens=False)  # noqa: E731
    memo = functools.lru_cache(4096)(lambda text: tuple(plain(text)))
    specs = tool_calls(False)[1] + [GuideSpec.json_schema(json.dumps(s), any_whitespace=False)
                                    for _, s in load_schemas(DATA, 8, vocab, False)]
    guides = [compile_guide(s, vocab) for s in specs]
    bm = allocate_token_bitmask(1, vocab.vocab_size)
    row = bm[0].numpy()
    rnd = random.Random(0)
    k = args.drafts

    states = []
    for i in range(args.states):  # matchers walked to varied points of their outputs
        m = guides[i % len(guides)].matcher()
        for _ in range(rnd.randint(0, 6)):
            for t in forced.forced_tokens(m, k, encode=memo, bitmask=bm).tokens:
                m.accept_token(t)
            if m.is_terminated() or not m.fill_next_token_bitmask(bm, 0):
                break
            ids = [w * 32 + b for w in range(len(row)) if row[w] for b in range(32)
                   if (int(row[w]) >> b) & 1 and w * 32 + b not in vocab.eos_ids]
            if ids:
                m.accept_token(rnd.choice(ids[:50]))
        if not m.is_terminated():
            states.append(m)

    def per_row(fn, prep=None) -> float:
        """CPU microseconds per state of ``fn(matcher)``, after an untimed ``prep(matcher)``
        (median of ``--repeat`` passes)."""
        passes = []
        for _ in range(args.repeat):
            spent = 0.0
            for m in states:
                if prep is not None:
                    prep(m)
                t0 = time.process_time()
                fn(m)
                spent += time.process_time() - t0
            passes.append(spent / len(states) * 1e6)
        return sorted(passes)[len(passes) // 2]

    # how often one forced run calls each part
    counts = {"fill": 0, "jump": 0, "encode": 0, "accept": 0}
    runs = []
    for m in states:
        cls = type(m)
        fill, jump, acc = cls.fill_next_token_bitmask, cls.find_jump_forward_string, cls.accept_token
        probe = cls.jump_forward_probe

        def cfill(self, *a, _f=fill):
            counts["fill"] += 1
            return _f(self, *a)

        def cjump(self, _f=jump):
            counts["jump"] += 1
            return _f(self)

        def cacc(self, t, _f=acc):
            counts["accept"] += 1
            return _f(self, t)

        def cprobe(self, _f=probe):
            counts["jump"] += 1
            return _f(self)

        cls.fill_next_token_bitmask, cls.find_jump_forward_string, cls.accept_token = cfill, cjump, cacc
        cls.jump_forward_probe = cprobe
        try:
            runs.append(len(forced.forced_tokens(m, k, encode=lambda s: (counts.__setitem__("encode", counts["encode"] + 1), memo(s))[1], bitmask=bm)))
        finally:
            cls.fill_next_token_bitmask, cls.find_jump_forward_string, cls.accept_token = fill, jump, acc
            cls.jump_forward_probe = probe
    n = len(states)

    allowed: dict[int, int | None] = {}

    def first_allowed(m):
        m.fill_next_token_bitmask(bm, 0)
        t = next((w * 32 + (int(row[w]) & -int(row[w])).bit_length() - 1 for w in range(len(row)) if row[w]), None)
        allowed[id(m)] = None if t in vocab.eos_ids else t

    def accept_rollback(m):
        t = allowed[id(m)]
        if t is not None and m.accept_token(t):
            m.rollback(1)

    texts = [m.find_jump_forward_string() or "}" for m in states]
    it = iter(range(10 ** 9))
    base = base_rule(args.base)
    whole_memo = per_row(lambda m: forced.forced_tokens(m, k, encode=memo, bitmask=bm))
    whole_base = per_row(lambda m: base.forced_tokens(m, k, encode=memo, bitmask=bm)) if base else None
    whole_plain = per_row(lambda m: forced.forced_tokens(m, k, encode=plain, bitmask=bm))
    fill_us = per_row(lambda m: m.fill_next_token_bitmask(bm, 0))
    check_us = per_row(lambda m: forced.single_allowed_token(row, vocab.vocab_size),
                       prep=lambda m: m.fill_next_token_bitmask(bm, 0))
    jump_us = per_row(lambda m: m.jump_forward_probe())
    enc_us = per_row(lambda m: plain(texts[next(it) % n]))
    acc_us = per_row(accept_rollback, prep=first_allowed)
    print(f"# {n} states over {len(guides)} grammars ({sorted({type(g).__name__ for g in guides})}), k={k}, "
          f"mean run {sum(runs) / n:.2f} tokens, runs filling k: {sum(r == k for r in runs) / n:.0%}; "
          f"load average {load_average():.1f}; CPU time, one thread\n")
    rows = [["forced run, tokenizations memoised (the proposer)", f"{whole_memo:.0f}", "1", f"{whole_memo:.0f}"],
            ["forced run, a tokenizer call per forced string", f"{whole_plain:.0f}", "1", f"{whole_plain:.0f}"],
            *([[f"forced run, {args.base}'s rule, memoised", f"{whole_base:.0f}", "1", f"{whole_base:.0f}"]]
              if base else []),
            ["  mask fill", f"{fill_us:.1f}", f"{counts['fill'] / n:.2f}", f"{fill_us * counts['fill'] / n:.0f}"],
            ["  one-token check on the mask", f"{check_us:.1f}", f"{counts['fill'] / n:.2f}",
             f"{check_us * counts['fill'] / n:.0f}"],
            ["  forced-string query (the probe)", f"{jump_us:.1f}", f"{counts['jump'] / n:.2f}", f"{jump_us * counts['jump'] / n:.0f}"],
            ["  tokenizer call (without the memo)", f"{enc_us:.1f}", f"{counts['encode'] / n:.2f}",
             f"{enc_us * counts['encode'] / n:.0f}"],
            ["  accept + rollback of one token", f"{acc_us:.1f}", f"{counts['accept'] / n:.2f}",
             f"{acc_us * counts['accept'] / n:.0f}"]]
    print_table(["part", "us per call", "calls per row", "us per row"], rows)
    if args.batches:
        step_table(args, vocab, specs, memo, rnd, base)


def base_rule(rev: str):
    """``tokenrails/guided/forced.py`` at git revision ``rev``, loaded as a module beside this one
    (None when ``rev`` is '' or git cannot show it)."""
    import importlib.util
    import subprocess
    import tempfile

    import tokenrails.guided  # noqa: F401  (the package its relative imports resolve in)

    if not rev:
        return None
    root = Path(__file__).resolve().parent.parent
    try:
        source = subprocess.run(["git", "-C", str(root), "show", f"{rev}:tokenrails/guided/forced.py"],
                                check=True, capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        print(f"# no base arm: git cannot show {rev}'s forced.py ({exc})")
        return None
    path = Path(tempfile.mkdtemp()) / "forced_base.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("tokenrails.guided._forced_base", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def step_table(args, vocab, specs, memo, rnd, base) -> None:
    """Proposal + verification masks per step (masks reused), this rule vs ``base``'s (ABBA)."""
    import torch

    from tokenrails.guided import manager as manager_mod
    from tokenrails.guided.manager import GuidedDecodingManager, GuidedRow

    k = args.drafts
    batches = [int(b) for b in args.batches.split(",")]
    mgr = GuidedDecodingManager(vocab)
    words = (vocab.vocab_size + 31) // 32
    bm = torch.empty((1, words), dtype=torch.int32)
    rows: list = []
    for i in range(max(batches) * 2):
        row = GuidedRow(("step-cost", i), 0, specs[i % len(specs)])
        probe = torch.zeros((1, vocab.vocab_size))
        mgr.fill_and_apply(probe, [row])  # begins the row's state
        for _ in range(rnd.randint(0, 6)):
            run = mgr.forced_tokens(row, k, encode=memo, bitmask=bm)
            if run.tokens:
                mgr.accept_tokens_spec([list(run.tokens)], [row])
            probe.zero_()
            mgr.fill_and_apply(probe, [row])
            ids = [t for t in torch.isfinite(probe[0]).nonzero().reshape(-1).tolist()[:50] if t not in vocab.eos_ids]
            if not ids or mgr.accept_tokens([rnd.choice(ids)], [row])[0].failed:
                break
        st = mgr.sequence(row.session_id, 0)
        if st is not None and st.error is None and not st.resolve().is_terminated() and st.history:
            rows.append(row)
    arms = {"this": manager_mod.forced_tokens}
    if base is not None:
        arms[args.base] = base.forced_tokens
    names = list(arms)
    lookup = not args.no_lookup
    print(f"\n# a drafts step's grammar work: {len(rows)} rows walked, k={k}, bfloat16 logits, lookup drafts "
          f"{'on (this arm)' if lookup else 'off'}; CPU time per step, "
          f"median of {args.steps} steps per arm (arms {' / '.join(names)} alternate ABBA); "
          f"load average {load_average():.1f}\n")

    # each row's prompt: its grammar's source text (as an extraction prompt quoting the schema would),
    # indexed by this checkout's lookup drafts at the row's first proposal
    prompts = {id(row): tuple(memo(str(row.spec.payload)[:2000])) for row in rows}

    def propose_row(row, arm: str):
        if arm == "this" and lookup:  # as grammar_drafts.plan_drafts proposes
            return mgr.forced_tokens(row, k, encode=memo, bitmask=bm, propose=True, lookup=lambda: prompts[id(row)])
        return mgr.forced_tokens(row, k, encode=memo, bitmask=bm, propose=True)

    def step(batch_rows: list, arm: str) -> tuple[float, float, float, float]:
        manager_mod.forced_tokens = arms[arm]  # the manager's proposal calls this name
        t0 = time.process_time()
        runs = [propose_row(r, arm) for r in batch_rows]
        propose = time.process_time() - t0
        width = max(len(r.tokens) for r in runs)
        drafts = []
        for r, run in zip(batch_rows, runs):  # the engine's block: fillers (the row's last token) past a run
            last = mgr.sequence(r.session_id, 0).history[-1]
            drafts.append(list(run.tokens) + [last] * (width - len(run.tokens)))
        logits = torch.zeros((len(batch_rows) * (width + 1), vocab.vocab_size), dtype=torch.bfloat16)
        t1 = time.process_time()
        mgr.fill_and_apply_spec(logits, batch_rows, drafts)
        verify = time.process_time() - t1
        if arm != "this":
            return propose, verify, 0.0, 0.0
        # the same masks filled beside the forward (TOKENRAILS_SPEC_PREFILL): the fill off the path,
        # then what the verification still does on it (check that they fit, apply)
        for r in batch_rows:
            propose_row(r, arm)  # noted again: the verification above took the notes
        t2 = time.process_time()
        filled = mgr.fill_spec(batch_rows, [list(run.tokens) for run in runs])
        t3 = time.process_time()
        if mgr.apply_filled_spec(logits, filled, batch_rows, drafts) is None:
            raise RuntimeError("masks filled ahead did not fit the verification they were filled for")
        return propose, verify, t3 - t2, time.process_time() - t3

    table = []
    try:
        for b in batches:
            spent: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
            load = load_average()
            for n in range(args.steps):
                batch_rows = [rows[(n + i) % len(rows)] for i in range(b)]
                for arm in (names if n % 2 == 0 else names[::-1]):
                    spent[arm].append(step(batch_rows, arm))

            def ms(arm: str, part: int | None) -> float:
                vals = sorted((p[0] + p[1]) if part is None else p[part] for p in spent[arm])
                return 1e3 * vals[len(vals) // 2]

            cells = [f"{ms(arm, part):.3f}" for arm in names for part in (0, 1, None)]
            cells += [f"{ms('this', 2):.3f}", f"{ms('this', 3):.3f}"]
            ratio = [f"{ms(names[1], None) / max(ms(names[0], None), 1e-9):.2f}x"] if len(names) > 1 else []
            table.append([b, *cells, *ratio, f"{load:.1f} / {load_average():.1f}"])
    finally:
        manager_mod.forced_tokens = arms["this"]
    heads = [f"{arm}: {part}" for arm in names for part in ("propose ms", "verify masks ms", "total ms")]
    heads += ["this: masks filled ahead ms (beside)", "this: fit check + apply ms (on path; CPU kernel)"]
    print_table(["batch", *heads, *([f"{names[1]} / this (total)"] if len(names) > 1 else []), "load before / after"],
                table)


if __name__ == "__main__":
    main()

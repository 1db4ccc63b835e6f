"""Inputs a hostile client sends (issue 16's reproducers), each checked against an oracle or a
measured bound: typed errors only, one spec one language on every request, no all -inf row, masks
that stay each thread's own, caches that keep messages rather than payloads.

Every test here failed on the code before this file existed (the escapes raised KeyError/TypeError,
``auto`` accepted "ab" for ``a^b``, a grammar with an empty language compiled, four threads got each
other's masks, the negative cache kept tracebacks).
"""
from __future__ import annotations

import gc
import json
import re
import sys
import threading
import time
import tracemalloc

import jsonschema
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tokenrails as tr
from tokenrails.guided.sequence import GuidedRow, StepStatus
from tokenrails.guided.errors import GuideError, InvalidGuideError
from tokenrails.guided.manager import GuidedDecodingManager
from tokenrails.guided.reasoning import ReasoningConfig, tracker_for
from tokenrails.guided.backends.xgrammar_coverage import _pattern_may_find
from tokenrails.guided.regex_hazards import regex_hazards
from tokenrails.kernels.reference import unpack_bitmask

BACKENDS = ["auto", "xgrammar", "llguidance", "fsm"]


# ---- 8. escapes: only GuideError, whatever the request's shape ---------------------------------
ESCAPING_REQUESTS = [
    {"type": "structural_tag", "structures": [{"schema": {}}], "triggers": ["<a"]},  # KeyError 'begin'
    {"type": "structural_tag", "structures": [{"begin": "<a>", "schema": {}}], "triggers": ["<a"]},  # 'end'
    {"type": "structural_tag", "structures": "x", "triggers": ["<a"]},
    {"type": "structural_tag", "structures": [{"begin": 1, "end": "</a>"}], "triggers": ["<a"]},
    {"type": "structural_tag", "structures": [{"begin": "<a>", "end": "</a>"}], "triggers": "<a"},
    {"type": "structural_tag", "format": [1, 2]},
    {"type": "json_schema", "json_schema": {"schema": {"type": "string", "format": ["date"]}}},  # TypeError
    {"type": "json_schema", "json_schema": {"schema": {"type": "string", "format": {"a": 1}}}},
    {"type": "json_schema", "json_schema": {"schema": {"type": "integer", "minimum": "x"}}},
    {"type": "json_schema", "json_schema": {"schema": {"type": ["string", 5]}}},
]


def compile_request(request, vocab, backend):
    return tr.compile_guide(tr.spec_from_request(request), vocab, backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("request_body", ESCAPING_REQUESTS, ids=lambda r: json.dumps(r)[:60])
def test_malformed_requests_raise_only_guide_errors(vocab, backend, request_body):
    try:
        compile_request(request_body, vocab, backend)
    except GuideError:
        pass


_scalars = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.text(max_size=6))
_values = st.recursive(_scalars, lambda c: st.one_of(st.lists(c, max_size=3),
                                                    st.dictionaries(st.sampled_from(
                                                        ["begin", "end", "schema", "type", "format", "value",
                                                         "structures", "triggers", "elements", "tags"]), c,
                                                        max_size=3)), max_leaves=8)
_tag_requests = st.fixed_dictionaries(
    {"type": st.just("structural_tag")},
    optional={"structures": _values, "triggers": _values, "format": _values},
)
_schema_requests = st.builds(
    lambda schema: {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}},
    st.dictionaries(st.sampled_from(["type", "format", "pattern", "enum", "const", "minimum", "multipleOf",
                                     "properties", "items", "required", "anyOf"]), _values, max_size=4),
)


@settings(max_examples=250, deadline=None, suppress_health_check=list(HealthCheck))
@given(request_body=st.one_of(_tag_requests, _schema_requests), backend=st.sampled_from(BACKENDS))
def test_fuzzed_requests_raise_only_guide_errors(vocab, request_body, backend):
    try:
        guide = compile_request(request_body, vocab, backend)
    except GuideError:
        return
    assert isinstance(guide.matcher().is_accepting(), bool)


# ---- 4. one spec, one language: never a wrong accept, on the first request or a repeated one ----
def accepts(guide, tokenizer, vocab, text: str) -> bool:
    matcher = guide.matcher()
    return all(matcher.accept_token(t) for t in tokenizer.encode(text, add_special_tokens=False)) and \
        matcher.accept_token(vocab.eos_ids[0])


REGEX_CASES = [("a^b", "ab"), ("a$b", "ab"), ("a*+a", "aa"), ("a++a", "aa"), ("a?+a", "a"), ("(?=x)ab", "ab")]


@pytest.mark.parametrize("backend", BACKENDS)
def test_lone_surrogate_patterns_never_emit_invalid_utf8(vocab, backend):
    """A lone surrogate has no UTF-8 encoding: a backend must refuse it, never emit the bytes."""
    for pattern in (r"a\ud800", "[\ud800-\udfff]", r"x[\uDC00-\uDCFF]"):
        try:
            guide = tr.compile_guide(tr.GuideSpec.regex(pattern), vocab, backend)
        except GuideError:
            continue
        text = walk_text(guide, vocab)
        assert text is None or text.encode("utf-8", "strict")
SCHEMA_CASES = [
    ({"type": "integer", "multipleOf": 1000000007}, "5"),
    ({"type": "integer", "multipleOf": 2000}, "5"),
    ({"type": "string", "pattern": "^(?!x).*$"}, '"xy"'),
    ({"type": "string", "pattern": "^a++a$"}, '"aa"'),
    ({"type": "string", "pattern": "a^b"}, '"ab"'),
    ({"type": "object", "properties": {"a": {"type": "string", "pattern": "^(?!x).*$"}}, "required": ["a"]},
     '{"a": "xy"}'),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("pattern,text", REGEX_CASES)
def test_regex_never_accepts_what_python_re_refuses(smollm2_tokenizer, vocab, backend, pattern, text):
    assert re.fullmatch(pattern, text) is None  # the oracle (Python 3.11 reads possessives)
    for _ in range(3):  # routing remembers specs: the second and third request must agree
        try:
            guide = tr.compile_guide(tr.GuideSpec.regex(pattern), vocab, backend)
        except GuideError:
            continue
        assert not accepts(guide, smollm2_tokenizer, vocab, text)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("schema,text", SCHEMA_CASES, ids=lambda v: json.dumps(v)[:40])
def test_schema_never_accepts_what_jsonschema_refuses(smollm2_tokenizer, vocab, backend, schema, text):
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(json.loads(text), schema)
    for _ in range(3):
        try:
            guide = tr.compile_guide(tr.GuideSpec.json_schema(schema), vocab, backend)
        except GuideError:
            continue
        assert not accepts(guide, smollm2_tokenizer, vocab, text)


def test_multiple_of_within_xgrammars_range_still_compiles_there(smollm2_tokenizer, vocab):
    guide = tr.compile_guide(tr.GuideSpec.json_schema({"type": "integer", "multipleOf": 1024}), vocab, "xgrammar")
    assert accepts(guide, smollm2_tokenizer, vocab, "2048") and not accepts(guide, smollm2_tokenizer, vocab, "5")


@pytest.mark.parametrize("pattern,expected", [
    ("a^b", {"interior anchor"}), ("^ab$", set()), ("[a^$]", set()), (r"\^a\$", set()), ("a*+a", {"possessive quantifier"}),
    ("a+?b", set()), ("a{2}+", {"possessive quantifier"}), (r"\++", set()), ("(?<!a)b", {"lookaround"}),
    (r"(a)\1", {"backreference"}), ("(?>a)", {"atomic group"}), ("(?:a)+(?P<n>b)", set()), ("[]a]+b", set()),
    (r"a\ud800", {"lone surrogate"}), ("[\ud800]", {"lone surrogate"}), (r"\x{DC00}", {"lone surrogate"}),
    (r"\u00e9", set()),
])
def test_regex_hazard_scan(pattern, expected):
    assert regex_hazards(pattern) == expected


def walk_text(guide, vocab):
    import random

    from tokenrails.testing import walk

    from tests.conftest import FIXTURES  # noqa: F401  (the tokenizer the vocab came from)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(FIXTURES / "smollm2"))
    raw = []

    def decode(ids):
        raw.append(b"".join(vocab.token_bytes[i] for i in ids))
        return tok.decode(ids)

    text = walk(guide, vocab, decode, random.Random(0), adversarial=True)
    if raw:
        raw[-1].decode("utf-8")  # strict: invalid UTF-8 raises here
    return text


# ---- 2. no backtracking engine on a client's pattern ----------------------------------------------
def test_property_pattern_analysis_is_linear_time():
    """``^(a+)+$`` against 40 a's and a '!': 2^40 steps for a backtracking engine. The bound is the
    behaviour under test (a generous one: the DFA answers in milliseconds)."""
    start = time.perf_counter()
    assert _pattern_may_find("^(a+)+$", "a" * 40 + "!") is False
    assert time.perf_counter() - start < 5.0
    assert _pattern_may_find("b", "abc") is True and _pattern_may_find("^b", "abc") is False
    assert _pattern_may_find("(", "x") is True  # unreadable: counted as "may find" (the refusing side)


# ---- 5. empty languages: refused at compile; a dead-end row ends alone ---------------------------
@pytest.mark.parametrize("spec", [
    tr.GuideSpec.grammar("root ::= a\na ::= a"),
    tr.GuideSpec.regex("[^\\x00-\\U0010FFFF]"),
], ids=["grammar", "regex"])
@pytest.mark.parametrize("backend", ["auto", "xgrammar", "llguidance"])
def test_empty_language_is_refused_at_compile(vocab, spec, backend):
    with pytest.raises(InvalidGuideError, match="empty"):
        tr.compile_guide(spec, vocab, backend)


class _DeadEnd:
    """A matcher that has run into a state no token leaves (its row is all zeros)."""

    def fill_next_token_bitmask(self, bitmask, index=0):
        bitmask[index].zero_()
        return True


def test_a_row_that_allows_nothing_ends_alone(vocab):
    manager = GuidedDecodingManager(vocab, compile_workers=1)
    spec = tr.GuideSpec.regex("[ab]+")
    rows = [GuidedRow("s", 0, spec), None, GuidedRow("s", 1, spec)]
    manager.begin_sequence("s", 0, spec).matcher = _DeadEnd()
    logits = torch.zeros(3, vocab.vocab_size)
    statuses = manager.fill_and_apply(logits, rows)
    assert statuses[0].state is StepStatus.ERROR and "allows no token" in str(statuses[0].error)
    assert statuses[2].state is StepStatus.OK and statuses[1] is None
    finite = torch.isfinite(logits)
    assert finite[0].nonzero().flatten().tolist() == list(vocab.eos_ids)  # EOS only, never all -inf
    assert finite[1].all() and 0 < finite[2].sum() < vocab.vocab_size
    torch.multinomial(torch.softmax(logits, dim=-1), 1)  # the batch can still be sampled
    manager.close()


# ---- 7. threads: one manager, disjoint sessions, every mask its own ------------------------------
def test_four_threads_get_their_own_masks(vocab):
    manager = GuidedDecodingManager(vocab, compile_workers=2)
    patterns = ["[0-9]{40}", "[a-f]{40}", "(xy){20}", "[A-Z]{40}"]
    wrong, rejected, errors = [], [], []
    old_interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # switch threads as often as the interpreter allows

    def drive(n: int) -> None:
        try:
            spec = tr.GuideSpec.regex(patterns[n])
            reference = tr.compile_guide(spec, vocab, "fsm").matcher()
            rng = np.random.default_rng(n)
            row = [GuidedRow(f"session-{n}", 0, spec)]
            expected = tr.allocate_token_bitmask(1, vocab.vocab_size)
            for _ in range(40):
                logits = torch.from_numpy(rng.standard_normal((1, vocab.vocab_size)).astype(np.float32))
                manager.fill_and_apply(logits, row)
                expected.fill_(-1)
                reference.fill_next_token_bitmask(expected, 0)
                allowed = torch.isfinite(logits[0])
                want = unpack_bitmask(expected, vocab.vocab_size, vocab.vocab_size)[0]
                if not torch.equal(allowed, want):
                    wrong.append(n)
                token = int(torch.argmax(logits[0]))
                status = manager.accept_tokens([token], row)[0]
                if status.state is StepStatus.TERMINATED:
                    return
                if status.state is not StepStatus.OK:
                    rejected.append((n, status))
                    return
                reference.accept_token(token)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=drive, args=(n,)) for n in range(4)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(old_interval)
        manager.close()
    assert not errors and not rejected and not wrong


# ---- 6. memory: caches keep messages, never payloads or tracebacks --------------------------------
def test_negative_cache_keeps_no_payload(vocab):
    limits = tr.GuideLimits(max_enum_values=50)
    manager = GuidedDecodingManager(vocab, limits=limits, compile_workers=1)

    def over_limit(i: int) -> tr.GuideSpec:
        return tr.GuideSpec.json_schema({"enum": [f"{i}-{j}-" + "x" * 900 for j in range(60)]})

    for i in range(5):  # warm-up: imports, first tables
        with pytest.raises(GuideError):
            manager.get_compiled(over_limit(i))
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for i in range(5, 205):  # 200 distinct ~54 KB payloads: ~11 MB if the cache kept them
        with pytest.raises(GuideError):
            manager.get_compiled(over_limit(i))
    gc.collect()
    grown = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    manager.close()
    assert grown < 2_000_000, f"negative cache grew {grown} bytes for 200 refused specs"
    stored = manager._cache.get(over_limit(100).key)
    assert isinstance(stored, GuideError)
    assert stored.__traceback__ is None and stored.__cause__ is None and stored.__context__ is None


_PINNING_CHILD = r"""
import ctypes, gc, sys
from transformers import AutoTokenizer
import tokenrails as tr
from tokenrails.guided.errors import GuideError
from tokenrails.guided.manager import GuidedDecodingManager

vocab = tr.Vocabulary.from_huggingface(AutoTokenizer.from_pretrained(sys.argv[1]))
manager = GuidedDecodingManager(vocab, backend="xgrammar", compile_workers=2)

def rss():
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20

def refuse(n0, n):
    for i in range(n0, n0 + n):
        try:
            manager.get_compiled(tr.GuideSpec.json_schema({"enum": list(range(20_000 + i))}))
        except GuideError:
            pass

refuse(0, 50)
before = rss()
refuse(1_000, 400)
print(rss() - before)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RSS from /proc, malloc_trim from glibc")
def test_distinct_refused_payloads_do_not_pin_memory(smollm2_tokenizer, tmp_path):
    """400 distinct refused 20k-value enums in a fresh process: the resident set stays flat.
    Before: each one's compile-thread error (and the cache entry made from it) was allocated while
    the frames that parsed the payload were alive, pinning its pymalloc arenas: +0.3 MB per refused
    spec, unbounded (773 MB after 1,550). tracemalloc cannot see this (live bytes did not grow),
    hence the child's own RSS."""
    import subprocess

    tok_dir = tmp_path / "tok"
    smollm2_tokenizer.save_pretrained(tok_dir)
    out = subprocess.run([sys.executable, "-c", _PINNING_CHILD, str(tok_dir)], capture_output=True, text=True,
                         timeout=300, env={**__import__("os").environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr[-2000:]
    grown = float(out.stdout.strip().splitlines()[-1])
    assert grown < 16, f"RSS grew {grown:.1f} MB over 400 distinct refused specs (was 225 MB)"


def test_per_request_reasoning_configs_are_a_bounded_memo(vocab):
    for n in range(100):
        tracker_for(vocab, ReasoningConfig(end_text=f"</think{n}>"))
    assert len(vocab.backend_cache["reasoning:trackers"]) <= 32


def test_an_object_with_too_many_properties_is_refused_before_any_compile(vocab):
    """28,000 properties: llguidance refused it, ``auto`` then gave it to xgrammar, whose compile
    ran > 300 s (a core burnt long after the request's deadline abandoned it)."""
    props = {f"p{i}": {"type": "integer"} for i in range(28_000)}
    spec = tr.GuideSpec.json_schema({"type": "object", "properties": props})
    for backend in ("auto", "xgrammar"):
        with pytest.raises(tr.GuideLimitError) as info:
            tr.compile_guide(spec, vocab, backend)
        assert info.value.limit == "max_object_properties"
    ok = tr.GuideSpec.json_schema({"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(50)}})
    tr.compile_guide(ok, vocab, "auto")


# ---- ambiguous repeats on xgrammar (found by bench/differential_fuzz.py's 100k run) -----------
SLOW_ON_XGRAMMAR = ["((([^a])?)*)+", "(((a)*|([^a])?|(?:b)))*", "((([-x]|[^a])){1,}){3,}", "((([-x])*)+){2,4}",
                    r"(((\-)*)*)*", "(((?:[^a])){2,5}){2,}"]


@pytest.mark.parametrize("pattern", SLOW_ON_XGRAMMAR)
def test_ambiguous_repeats_are_refused_on_xgrammar_and_served_by_auto(vocab, pattern):
    """Before: xgrammar's mask time grew with every token on these (0.13 s -> 3.7 s after 48
    tokens; ~0.9 s per step for a whole output on the last one, under the 2 s step deadline)."""
    from tokenrails.guided.errors import UnsupportedGuideError
    from tokenrails.guided.registry import compile_guide

    with pytest.raises(UnsupportedGuideError) as info:
        compile_guide(tr.GuideSpec.regex(pattern), vocab, "xgrammar")
    assert info.value.feature == "nested quantifier"
    guide = compile_guide(tr.GuideSpec.regex(pattern), vocab, "auto")
    bitmask = torch.zeros((1, (vocab.vocab_size + 31) // 32), dtype=torch.int32)
    t0 = time.perf_counter()
    guide.matcher().fill_next_token_bitmask(bitmask, 0)
    assert time.perf_counter() - t0 < 1.0  # auto's DFA: microseconds; xgrammar's first mask was 0.13 s
    schema = {"type": "string", "pattern": pattern}  # as a schema pattern xgrammar is fast: still served
    compile_guide(tr.GuideSpec.json_schema(schema), vocab, "xgrammar")


@pytest.mark.parametrize("pattern", [r"[a-z]+(-[a-z]+)*", r"(?:\.[a-z0-9]+)*@x", r"(ab)*", r"(a{3})*",
                                     r"\d{3}-\d{4}", r"(?:a|b)+", r"(a*)\d+"])
def test_separated_repeats_still_compile_on_xgrammar(vocab, pattern):
    from tokenrails.guided.registry import compile_guide

    compile_guide(tr.GuideSpec.regex(pattern), vocab, "xgrammar")

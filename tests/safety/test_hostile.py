"""Hostile-input corpus: every request fails with its typed error, fast and without growing memory,
and the next ordinary request still works (the process stays healthy)."""
from __future__ import annotations

import resource
import threading
import time

import pytest

from tokenrails import GuideSpec, compile_guide
from tokenrails.requests import normalize_request
from tokenrails.guided.errors import GuideError, GuideLimitError, InvalidGuideError, UnsupportedGuideError
from tokenrails.guided.limits import GuideLimits
from tokenrails.guided.registry import available_backends, get_backend

BACKENDS = ["auto"] + [b for b in ("xgrammar", "llguidance", "fsm") if b in available_backends()]
TIME_BUDGET_S = 5.0
MEMORY_BUDGET_MB = 200


def _nested(depth: int) -> dict:
    schema: dict = {"type": "integer"}
    for _ in range(depth):
        schema = {"type": "array", "items": schema}
    return schema


def _ref_chain(n: int) -> dict:
    defs = {f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(n)}
    defs[f"d{n}"] = {"type": "integer"}
    return {"$ref": "#/$defs/d0", "$defs": defs}


# name -> (spec factory, expected error class, limit name or None)
HOSTILE = {
    "nested-schema-100": (lambda: GuideSpec.json_schema(_nested(100)), GuideLimitError, "max_json_depth"),
    "nested-schema-text-100k": (lambda: GuideSpec.json_schema('{"a":' * 100_000 + "1" + "}" * 100_000),
                                InvalidGuideError, None),
    "enum-100k": (lambda: GuideSpec.json_schema({"enum": list(range(100_000))}), GuideLimitError, "max_enum_values"),
    "choice-100k": (lambda: GuideSpec.choice([f"o{i}" for i in range(100_000)]), GuideLimitError, "max_enum_values"),
    "anyof-5000": (lambda: GuideSpec.json_schema({"anyOf": [{"const": i} for i in range(5000)]}),
                   GuideLimitError, "max_any_of"),
    "ref-self-loop": (lambda: GuideSpec.json_schema({"$ref": "#"}), GuideLimitError, "max_ref_depth"),
    "ref-mutual-loop": (lambda: GuideSpec.json_schema(
        {"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"anyOf": [{"$ref": "#/$defs/a"}]}}}),
        GuideLimitError, "max_ref_depth"),
    "ref-chain-100": (lambda: GuideSpec.json_schema(_ref_chain(100)), GuideLimitError, "max_ref_depth"),
    "regex-repeat-100k": (lambda: GuideSpec.regex("a{1,100000}"), GuideLimitError, "max_repeat"),
    "regex-nested-repeat": (lambda: GuideSpec.regex("(a{1000}){1000}"), GuideLimitError,
                            ("max_repeat", "max_dfa_states")),  # fsm: its automaton budget
    "schema-pattern-repeat": (lambda: GuideSpec.json_schema({"type": "string", "pattern": "^x{5,90000}$"}),
                              GuideLimitError, "max_repeat"),
    "grammar-repeat": (lambda: GuideSpec.grammar('root ::= "a"{1,100000}'), GuideLimitError, "max_repeat"),
    "regex-huge": (lambda: GuideSpec.regex("a" * 20_000), GuideLimitError, "max_regex_length"),
    "grammar-huge-literal": (lambda: GuideSpec.grammar('root ::= "' + "x" * 100_000 + '"'),
                             GuideLimitError, "max_literal_bytes"),
    "const-huge-literal": (lambda: GuideSpec.json_schema({"const": "y" * 100_000}), GuideLimitError,
                           "max_literal_bytes"),
    "spec-over-1MB": (lambda: GuideSpec.json_schema({"description": "z" * (2 << 20)}), GuideLimitError,
                      "max_spec_bytes"),
    "invalid-utf8-schema-bytes": (lambda: GuideSpec.json_schema(b'{"type": "\xff\xfe"}'), InvalidGuideError, None),
    "lone-surrogate-regex": (lambda: GuideSpec.regex("a\ud800"), InvalidGuideError, None),
    "lone-surrogate-const": (lambda: GuideSpec.json_schema({"const": "\udfff"}), InvalidGuideError, None),
    "invalid-regex": (lambda: GuideSpec.regex("(a|b"), InvalidGuideError, None),
    "remote-ref": (lambda: GuideSpec.json_schema({"$ref": "http://169.254.169.254/latest/meta-data"}),
                   GuideError, None),
}


class _PeakGrowth:
    """Peak resident-set growth of this process during a block, sampled every 2 ms from
    /proc/self/statm. (``ru_maxrss`` is the lifetime peak: once an earlier test had loaded a model
    it hid every later allocation below it, so the old check was nearly vacuous.)"""

    def __enter__(self) -> "_PeakGrowth":
        self.base = self.peak = _rss_now_mb()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.002):
            self.peak = max(self.peak, _rss_now_mb())

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss_now_mb())

    @property
    def grown_mb(self) -> float:
        return self.peak - self.base


def _rss_now_mb() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * resource.getpagesize() / 2**20


@pytest.fixture(scope="module")
def warm_backends(vocab):
    """Build every backend's per-vocabulary tables once (llguidance's take seconds): the time
    budget below is about the hostile request, not about the first request this process sees."""
    for name in BACKENDS[1:]:
        get_backend(name, vocab)


@pytest.mark.parametrize("name", sorted(HOSTILE))
@pytest.mark.parametrize("backend", BACKENDS)
def test_hostile_request_fails_typed_fast_and_process_stays_healthy(vocab, warm_backends, name, backend):
    make, error, limit = HOSTILE[name]
    t0 = time.perf_counter()
    with _PeakGrowth() as memory, pytest.raises(GuideError) as info:
        compile_guide(make(), vocab, backend)
    elapsed = time.perf_counter() - t0
    exc = info.value
    # auto may report the union of every backend's refusal, and a backend may not support the
    # kind at all (fsm has no grammars): both are UnsupportedGuideError. Otherwise: the exact type.
    assert isinstance(exc, (error, UnsupportedGuideError)), (type(exc), exc)
    if limit is not None and isinstance(exc, GuideLimitError):
        names = limit if isinstance(limit, tuple) else (limit,)
        assert exc.limit in names and exc.limit in str(exc)
    assert elapsed < TIME_BUDGET_S, f"{name} took {elapsed:.1f}s on {backend}"
    assert memory.grown_mb < MEMORY_BUDGET_MB, f"{name} grew {memory.grown_mb:.0f} MB on {backend}"
    ok = compile_guide(GuideSpec.json_schema({"type": "integer"}), vocab, backend)
    m = ok.matcher()
    assert all(m.accept_token(t) for t in _ids(vocab, "42"))


@pytest.mark.parametrize("name", sorted(n for n, v in HOSTILE.items() if v[2]))
def test_single_backend_names_the_limit(vocab, name):
    """On the xgrammar backend (whose C++ compile cannot be interrupted) every pre-check fires."""
    make, error, limit = HOSTILE[name]
    with pytest.raises(error) as info:
        compile_guide(make(), vocab, "xgrammar")
    assert info.value.limit == (limit[0] if isinstance(limit, tuple) else limit)


def test_limits_are_configurable_in_one_place(vocab):
    big = GuideSpec.choice(["q" * 20_000, "r"])
    with pytest.raises(GuideLimitError):
        compile_guide(big, vocab, "xgrammar")
    compile_guide(big, vocab, "llguidance", limits=GuideLimits(max_literal_bytes=1 << 20))
    tight = GuideLimits(max_enum_values=3)
    with pytest.raises(GuideLimitError) as info:
        compile_guide(GuideSpec.choice(["a", "b", "c", "d"]), vocab, "xgrammar", limits=tight)
    assert info.value.limit == "max_enum_values" and info.value.value == 4
    with pytest.raises(GuideError, match="max_enum_values"):
        compile_guide(GuideSpec.choice(["a", "b", "c", "d"]), vocab, "auto", limits=tight)


def test_lazy_backends_handle_dfa_blowup_regex(vocab):
    """``(a|b)*a(a|b){30}`` has 2^30 DFA states: fsm refuses it typed, auto still serves it."""
    spec = GuideSpec.regex("(a|b)*a(a|b){30}")
    t0 = time.perf_counter()
    guide = compile_guide(spec, vocab, "auto")
    assert time.perf_counter() - t0 < 10
    m = guide.matcher()
    text = "ab" * 5 + "a" + "b" * 30
    assert all(m.accept_token(t) for t in _ids(vocab, text))
    assert m.is_accepting()
    m2 = guide.matcher()
    assert all(m2.accept_token(t) for t in _ids(vocab, "a" + "b" * 29))
    assert not m2.is_accepting()


def test_invalid_utf8_in_request_bodies(vocab):
    for body in ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": b"\xc3\x28"}}},
                 {"guided_regex": b"\xff"}, {"guided_json": b"\x80abc"}):
        with pytest.raises(GuideError):
            spec = normalize_request(body)
            compile_guide(spec, vocab, "auto")


def _ids(vocab, text: str) -> list[int]:
    by_bytes = {b: i for i, b in enumerate(vocab.token_bytes) if i not in vocab.special_ids}
    return [by_bytes[bytes([c])] for c in text.encode()]

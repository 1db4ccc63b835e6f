"""Backend registry and ``compile_guide``: the one entry point from a spec to a compiled guide."""
from __future__ import annotations

import importlib
import time

from .backend import CompiledGuide, GuideBackend
from .errors import GuideError, GuideLimitError, InvalidGuideError, UnsupportedGuideError, client_input_boundary
from .limits import DEFAULT_LIMITS, GuideLimits
from .spec import GuideSpec
from .vocabulary import Vocabulary

# name -> "module:Class", imported lazily so optional dependencies stay optional.
_BACKENDS: dict[str, str] = {
    "xgrammar": "tokenrails.guided.backends.xgrammar_backend:XGrammarBackend",
    "fsm": "tokenrails.guided.backends.fsm_backend:FSMBackend",
    "llguidance": "tokenrails.guided.backends.llguidance_backend:LLGuidanceBackend",
}


def register_backend(name: str, target: str | type[GuideBackend]) -> None:
    """Register a backend class (or a lazy "module:Class" path) under ``name``."""
    _BACKENDS[name] = target if isinstance(target, str) else f"{target.__module__}:{target.__qualname__}"


def unregister_backend(name: str) -> None:
    """Remove a backend registered with ``register_backend`` (tests, plugins being unloaded)."""
    _BACKENDS.pop(name, None)


def available_backends() -> list[str]:
    return [n for n in _BACKENDS if _load_class(n) is not None]


def _load_class(name: str) -> type[GuideBackend] | None:
    target = _BACKENDS.get(name)
    if target is None:
        return None
    module, _, attr = target.partition(":")
    try:
        return getattr(importlib.import_module(module), attr)
    except ImportError:
        return None


def get_backend(name: str, vocab: Vocabulary, limits: GuideLimits = DEFAULT_LIMITS) -> GuideBackend:
    """The backend instance for this vocabulary and limits (built once, then reused): for code that
    hands a backend library's own objects to it (the outlines shim: llguidance's ``LLTokenizer`` and
    grammar form, xgrammar's ``GrammarCompiler``); constraints compile through ``compile_guide``."""
    if name not in _BACKENDS:
        raise InvalidGuideError(f"unknown backend {name!r}; known: {sorted(_BACKENDS)} or 'auto'")
    cls = _load_class(name)
    if cls is None:
        raise UnsupportedGuideError(
            f"backend {name!r} is not installed (pip install tokenrails[{name}])", backend=name
        )
    return vocab.cached(f"backend:{name}:{hash(limits)}", lambda: cls(vocab, limits))


@client_input_boundary("checking the constraint failed")
def check_guide(spec: GuideSpec, vocab: Vocabulary, backend: str = "auto", *,
                limits: GuideLimits | None = None) -> None:
    """Raise what ``compile_guide`` would raise before compiling: its size, walk and backend
    ``check()`` refusals (the bounded part). A caller about to hand a compile to a worker process
    answers these at once instead of after the worker's round trip (or its boot)."""
    _run_ladder(spec, vocab, backend, limits, compile=False)


@client_input_boundary("compiling the constraint failed")
def compile_guide(
    spec: GuideSpec,
    vocab: Vocabulary,
    backend: str = "auto",
    *,
    limits: GuideLimits | None = None,
) -> CompiledGuide:
    """Compile ``spec`` for ``vocab`` with the first backend, in the order of the one routing rule
    (``routing.backends_for``: the pinned ``backend``, or under ``auto`` the request's routing
    options then the ladder), whose check passes."""
    return _run_ladder(spec, vocab, backend, limits, compile=True)


def _run_ladder(spec: GuideSpec, vocab: Vocabulary, backend: str, limits: GuideLimits | None, *,
                compile: bool) -> CompiledGuide | None:
    """``compile_guide``'s ladder; with ``compile=False`` only each backend's ``check()`` (the
    first backend whose check passes ends it)."""
    from .routing import backends_for

    if not isinstance(spec, GuideSpec):
        raise InvalidGuideError(f"expected a GuideSpec, got {type(spec).__name__}")
    limits = limits or DEFAULT_LIMITS
    limits.check("max_spec_bytes", len(spec.payload.encode()))
    names = backends_for(spec, vocab, limits, backend)
    if len(names) == 1:
        backend = names[0]  # one backend: its own error is the answer, as for a pinned backend
    reasons: list[str] = []
    last: GuideError | None = None
    over_limit: GuideLimitError | None = None
    for i, name in enumerate(names):
        try:
            impl = get_backend(name, vocab, _ladder_limits(limits, backend == "auto" and i < len(names) - 1))
            impl.check(spec)
            if not compile:
                return None
            start = time.perf_counter()
            compiled = impl.compile(spec)
            _refuse_empty_language(compiled, vocab)
            compiled.compile_s = time.perf_counter() - start
            return compiled
        except (UnsupportedGuideError, GuideLimitError) as exc:
            if backend != "auto":
                raise
            reasons.append(f"{name}: {exc}")
            last = exc
            if over_limit is None and isinstance(exc, GuideLimitError):
                over_limit = exc
    if last is not None and len(reasons) == 1:
        raise last
    if over_limit is not None:
        # Some backend could enforce it but the request is over a limit: that is the real answer.
        over_limit.args = (f"{over_limit} (tried: {'; '.join(reasons)})",)
        raise over_limit
    raise UnsupportedGuideError(
        "no backend can enforce this constraint exactly: " + "; ".join(reasons), feature=spec.kind
    )


LADDER_SHARE = 4  # a backend with fallbacks after it gets 1/4 of the compile deadline


def _ladder_limits(limits: GuideLimits, has_fallback: bool) -> GuideLimits:
    """A backend that bounds its own compile by ``compile_timeout_s`` (fsm) and has fallbacks after
    it in the ``auto`` ladder gets a share of the deadline, so the ladder as a whole fits in one
    deadline and a spec the fallback compiles at once is not held up by fsm's whole deadline.
    One fixed share: backends are cached per limits value."""
    if not has_fallback:
        return limits
    return limits.replace(compile_timeout_s=limits.compile_timeout_s / LADDER_SHARE)


def _refuse_empty_language(compiled: CompiledGuide, vocab: Vocabulary) -> None:
    """A constraint whose first mask allows nothing, not even EOS (``root ::= a`` with
    ``a ::= a``, an empty class), is this request's error now, at compile time, instead of an
    all -inf logits row later. One fill of the start state: most backends cache it anyway."""
    from ..kernels import allocate_token_bitmask

    row = allocate_token_bitmask(1, vocab.vocab_size)
    matcher = compiled.matcher()
    matcher.fill_next_token_bitmask(row, 0)
    words = row.numpy()[0]
    for eos in vocab.eos_ids:  # EOS offered where the empty output is not accepted: llguidance's
        words[eos // 32] &= ~(1 << (eos % 32))  # way of saying "nothing" (its accept then refuses EOS)
    if not words.any() and not matcher.is_accepting():
        raise InvalidGuideError(
            f"the {compiled.spec.kind} constraint allows no output at all (its language is empty)"
        )

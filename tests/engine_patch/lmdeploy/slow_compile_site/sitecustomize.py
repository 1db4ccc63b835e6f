"""Test-only start-up file for a test server (test_engine_fairness_server.py, test_request_deadlines_server.py): every process started
with this directory on ``PYTHONPATH`` and ``TOKENRAILS_TEST_SLOW_MARKER`` set makes the compile of a
pattern containing the marker ``TOKENRAILS_TEST_SLOW_DELAY`` seconds slower - against a real
tokenizer's vocabulary only, so the api_server's front check (a 257-token probe vocabulary) is not
slowed, the engine's compile is; a pattern holding ``TOKENRAILS_TEST_SLOW_FRONT_MARKER`` also makes
the front check's compile ``TOKENRAILS_TEST_SLOW_FRONT_DELAY`` seconds slower. A sleep: an expensive compile that costs the shared machine no CPU.
Chains to the next ``sitecustomize`` on ``sys.path`` (the upgrade's fallback hook, if any).
"""
import importlib.machinery as _m
import importlib.util as _u
import os as _os
import sys as _sys

_here = _os.path.dirname(_os.path.abspath(__file__))
_GUARD = "_tokenrails_test_slow_site"  # the upgrade's fallback hook chains back here: run once
_first = _GUARD not in _sys.modules
_sys.modules.setdefault(_GUARD, _sys.modules[__name__])
_marker = _os.environ.get("TOKENRAILS_TEST_SLOW_MARKER") if _first else None
if _marker:
    import time as _time

    from tokenrails.guided import manager as _core

    _real = _core.compile_guide
    _delay = float(_os.environ.get("TOKENRAILS_TEST_SLOW_DELAY", "5"))

    _front_marker = _os.environ.get("TOKENRAILS_TEST_SLOW_FRONT_MARKER") or None
    _front_delay = float(_os.environ.get("TOKENRAILS_TEST_SLOW_FRONT_DELAY", "0"))

    def _slow_compile_guide(spec, vocab, *args, **kwargs):
        if _marker in spec.payload and vocab.vocab_size > 1000:
            _time.sleep(_delay)
        if _front_marker and _front_marker in spec.payload and vocab.vocab_size <= 1000:
            _time.sleep(_front_delay)  # the front check's probe compile, when asked for
        return _real(spec, vocab, *args, **kwargs)

    _core.compile_guide = _slow_compile_guide
_next = _m.PathFinder.find_spec("sitecustomize", [p for p in _sys.path if _os.path.abspath(p or ".") != _here])
if _first and _next is not None and _next.loader is not None:
    _chained = _u.module_from_spec(_next)
    _next.loader.exec_module(_chained)

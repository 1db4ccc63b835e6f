"""Cheap reads of environment switches that hot paths consult on every call."""
from __future__ import annotations

import os


def env_lookup(name: str):
    """A function returning ``os.environ.get(name)`` for a fixed ``name``, minus its cost.

    ``os.environ.get`` of an unset variable raises and catches a ``KeyError`` inside
    ``os._Environ``, a visible share of a batch-1 apply. The returned function looks the encoded key
    up in the dict behind ``os.environ`` (kept in sync by every ``os.environ`` write, e.g. pytest's
    ``monkeypatch.setenv``) and decodes only when set.
    """
    data = getattr(os.environ, "_data", None)
    encodekey = getattr(os.environ, "encodekey", None)
    if not isinstance(data, dict) or encodekey is None:  # not CPython's os._Environ
        return lambda: os.environ.get(name)
    key = encodekey(name)

    def lookup():
        return None if key not in data else os.environ.get(name)

    return lookup


#: Every environment variable tokenrails reads, in one place: a process that starts another where
#: the environment is not inherited (LMDeploy's Ray workers) hands all of them on
#: (``engine_patch/lmdeploy/boot/inherit.child_env``). ``tests/test_env_settings.py`` scans the source so
#: that a new setting cannot be left out.
SETTINGS: tuple[str, ...] = (
    "TOKENRAILS_BUDGET",                 # boot/settings: activate(budget=) / --budget
    "TOKENRAILS_CACHE",                  # demo_model: where the embedded model's cache lives
    "TOKENRAILS_COMPILE_CACHE_DIR",      # boot/settings: compiled guides kept across restarts
    "TOKENRAILS_COMPILE_PROCESSES",      # boot/settings: worker processes for large compiles
    "TOKENRAILS_COMPILE_NICE",           # guided/compile_procs: compile workers' CPU priority below the engine
    "TOKENRAILS_COMPILE_PER_CLIENT",     # boot/settings: compiles one named client may run at once
    "TOKENRAILS_DRAFTS_AHEAD",           # speculative/draft_ahead: next drafts guessed beside the forward (0: inline)
    "TOKENRAILS_EXIT_WAIT_S",            # guided/native_threads: exit's bound on running compiles
    "TOKENRAILS_FSM_PRECOMPUTE",         # guided/fsm/token_index: warm-up of the token index
    "TOKENRAILS_GRAMMAR_DRAFTS",         # boot/settings: activate(grammar_drafts=), k forced drafts per step
    "TOKENRAILS_GRAMMAR_DRAFTS_FIXED",   # speculative/draft_shapes: verification shapes (0/1/buckets)
    "TOKENRAILS_GRAMMAR_EAGLE",          # speculative/grammar_eagle: grammar-aware draft models
    "TOKENRAILS_GUIDED_CPU_METER",       # step/guided_meter: per-process CPU time of guided calls
    "TOKENRAILS_HANDLES_PER_CLIENT",     # server/handle_pool: handles one client's new-spec requests may hold
    "TOKENRAILS_KERNEL",                 # kernels/dispatch: the mask kernel forced
    "TOKENRAILS_LMDEPLOY",               # lmdeploy/startup: children come up upgraded
    "TOKENRAILS_LMDEPLOY_BACKEND",       # boot/settings: activate(backend=)
    "TOKENRAILS_LMDEPLOY_CPU",           # lmdeploy/startup: the CPU device path
    "TOKENRAILS_LMDEPLOY_FILL_THREADS",  # boot/settings: activate(fill_threads=)
    "TOKENRAILS_LMDEPLOY_LIMITS",        # boot/settings: activate(limits=)
    "TOKENRAILS_LOOKUP_DRAFTS",          # boot/settings: activate(lookup_drafts=), prompt-lookup after forced runs
    "TOKENRAILS_MAX_BODY_BYTES",         # server/body_limits: the api_server's request bounds
    "TOKENRAILS_MAX_MESSAGES",
    "TOKENRAILS_MAX_MESSAGE_BYTES",
    "TOKENRAILS_MAX_STOP_BYTES",
    "TOKENRAILS_MAX_STOP_WORDS",
    "TOKENRAILS_MAX_TOOLS",
    "TOKENRAILS_MAX_TOOL_BYTES",
    "TOKENRAILS_NATIVE",                 # native: 0 forces the numpy paths
    "TOKENRAILS_OUTLINES_API",           # compat/outlines: the outlines API version served
    "TOKENRAILS_OVERLAP",                # step/overlap: mask fill during the forward
    "TOKENRAILS_REASONING",              # boot/settings, reasoning_settings: activate(reasoning=)
    "TOKENRAILS_SPEC_PREFILL",           # speculative/draft_ahead: verification masks filled beside the forward (default: CUDA)
    "TOKENRAILS_TOOL_CALLS",             # boot/settings: activate(tool_calls=), constrained tool calls
)

_OFF = ("0", "false", "off", "no")


def env_switch(name: str, default: bool) -> bool:
    """An on/off setting read from the environment: unset or empty gives ``default``; ``0``,
    ``false``, ``off``, ``no`` (any case) turn it off, anything else on."""
    raw = (os.environ.get(name) or "").strip().lower()
    return default if not raw else raw not in _OFF

"""The public API, listed once and pinned: a change to it is a decision, not an accident.

What users import is ``tokenrails.__all__`` and the adapters' ``__all__``. The pins below name each
public callable's parameters. A parameter may be added (keyword-only or at the end); a pinned one
may not vanish, be renamed, be reordered or lose its keyword; a public name may not vanish. A name
that must go first becomes a deprecated alias for one release (``tokenrails/_deprecated.py``) and
goes into CHANGELOG.md, and this file is updated in the same change.
"""
from __future__ import annotations

import importlib
import inspect
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import tokenrails

ROOT = Path(__file__).resolve().parent.parent

# name -> the parameters its call takes, in order (None: not pinned by signature: exceptions, ABCs, enums)
TOP = {
    'CompiledGuide': None,
    'Finalization': ('finish_reason', 'complete', 'error', 'thinking'),
    'GuideError': None,
    'GuideLimitError': None,
    'GuideLimits': ('max_spec_bytes', 'max_json_depth', 'max_ref_depth', 'max_schema_visits', 'max_enum_values', 'max_any_of', 'max_object_properties', 'max_regex_length', 'max_repeat', 'max_repeat_total', 'max_dfa_states', 'max_grammar_bytes', 'max_literal_bytes', 'max_grammar_literal_bytes', 'compile_timeout_s', 'max_fill_seconds', 'max_lowered_regex_bytes', 'lowering_memory_bytes', 'max_abandoned_compiles', 'cache_max_entries', 'cache_max_bytes'),
    'GuidePolicy': ('allowed_kinds', 'allow_special_token_refs'),
    'GuidePolicyError': None,
    'GuideSpec': ('kind', 'payload', 'options'),
    'GuideTimeoutError': None,
    'GuidedDecodingManager': ('vocab', 'backend', 'limits', 'policy', 'compile_workers', 'fill_threads', 'parallel_fill_threshold', 'device'),
    'GuidedRow': ('session_id', 'seq_id', 'spec', 'reasoning'),
    'InvalidGuideError': None,
    'JumpForward': ('text', 'token_ids', 'rollback_tokens'),
    'Matcher': None,
    'ReasoningConfig': ('end_ids', 'end_text', 'start_ids', 'start_text', 'max_thinking_tokens', 'match', 'optional', 'whitespace_after_end'),
    'RowStatus': ('state', 'error', 'valid_drafts', 'accepted'),
    'StepStatus': None,
    'TokenRejectedError': None,
    'UnsupportedGuideError': None,
    'Vocabulary': ('token_bytes', 'eos_ids', 'special_ids', 'vocab_size', 'name', 'backend_cache', '_lock'),
    'allocate_token_bitmask': ('rows', 'vocab_size', 'device'),
    'apply_token_bitmask_inplace': ('logits', 'bitmask', 'indices', 'vocab_size'),
    'compile_guide': ('spec', 'vocab', 'backend', 'limits'),
    'get_backend': ('name', 'vocab', 'limits'),
    'outlines_unenforced': ('schema',),
    'parse_request': ('obj',),
    'shared_vocabulary': ('tokenizer', 'key', 'build'),
    'spec_from_request': ('obj',),
    'spell_shorthands': ('pattern', 'classes', 'who', 'negated', 'complement_outside'),
    'start_native_thread': ('target', 'name'),
}

ADAPTERS = {
    "tokenrails.engine_patch.transformers": {
        'GenerationReport': ('results', 'wall_s', 'prefill_s', 'forward_passes', 'new_tokens', 'extra'),
        'GuidedLogitsProcessor': ('specs', 'tokenizer', 'vocab', 'vocab_size', 'manager', 'backend', 'limits', 'num_return_sequences', 'reasoning'),
        'GuidedResult': ('text', 'token_ids', 'finish_reason', 'valid', 'validation', 'error', 'error_type', 'spec_kind', 'grammar_init_s', 'compile_s', 'grammar_per_token_s', 'jump_forward_s', 'forward_passes', 'forced_tokens', 'answer_text', 'reasoning_text', 'answer_start'),
        'RowReport': ('status', 'error', 'error_type', 'valid', 'validation', 'answer_start', 'grammar_init_s', 'grammar_per_token_s', 'tokens'),
        'SamplingParams': ('do_sample', 'temperature', 'top_k', 'top_p', 'seed'),
        'Verdict': ('valid', 'method', 'reason'),
        'encode_prompts': ('tokenizer', 'prompts', 'chat'),
        'generate_guided': ('model', 'tokenizer', 'prompts', 'specs', 'max_new_tokens', 'do_sample', 'temperature', 'top_k', 'top_p', 'seed', 'jump_forward', 'chat', 'backend', 'limits', 'manager', 'reasoning'),
        'logits_width': ('model',),
        'manager_for': ('vocab', 'backend', 'limits'),
        'validate_output': ('spec', 'text', 'matcher_complete'),
        'vocabulary_for': ('tokenizer', 'vocab_size'),
    },
    "tokenrails.compat.xgrammar": {
        'allocate_token_bitmask': ('batch_size', 'vocab_size'),
        'apply_token_bitmask_inplace': ('logits', 'bitmask', 'vocab_size', 'indices', 'backend'),
        'apply_token_bitmask_inplace_cpu': ('logits', 'bitmask', 'vocab_size', 'indices'),
        'apply_token_bitmask_inplace_triton': ('logits', 'bitmask', 'vocab_size', 'indices'),
        'bitmask_dtype': None,
        'get_bitmask_shape': ('batch_size', 'vocab_size'),
        'reset_token_bitmask': ('bitmask',),
    },
    "tokenrails.engine_patch.lmdeploy": {
        'ENV_FLAG': None,
        'UnsupportedLMDeployError': None,
        'activate': ('backend', 'limits', 'fill_threads', 'reasoning', 'tool_calls', 'grammar_drafts'),
        'deactivate': (),
        'is_active': (),
    },
    "tokenrails.engine_patch.lmdeploy.cpu": {
        'cpu_engine_config': (),
        'enable': (),
    },
    "tokenrails.requests": {
        'NormalizedRequest': ('spec', 'backend', 'engine', 'source', 'fallback', 'reasoning'),
        'disable_additional_properties': ('schema',),
        'normalize_request': ('obj',),
        'parse_request': ('obj',),
        'spec_from_request': ('obj',),
    },
}

DEPRECATED_MODULES = {"tokenrails.models": "tokenrails.demo_model", "tokenrails.compat.requests": "tokenrails.requests"}
# the reasoning phase's members the Matcher contract had, and what a grammar matcher answered
MATCHER_PHASE_MEMBERS = {"answering": True, "thinking": False, "preamble": False, "in_gap": False,
                         "rollback_limit()": None, "forced_prefix()": None, "refusal()": "by the grammar"}


def _params(obj) -> list[inspect.Parameter]:
    sig = inspect.signature(obj)
    return [p for p in sig.parameters.values() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


def _assert_compatible(qualname: str, obj, pinned: tuple[str, ...]) -> None:
    """Every pinned parameter still there, same name and order; none became positional-only."""
    now = _params(obj)
    names = [p.name for p in now]
    missing = [n for n in pinned if n not in names]
    assert not missing, f"{qualname}: parameters removed or renamed: {missing} (now {names})"
    order = [n for n in names if n in pinned]
    assert order == list(pinned), f"{qualname}: pinned parameters reordered: {order} != {list(pinned)}"
    kinds = {p.name: p.kind for p in now}
    positional_only = [n for n in pinned if kinds[n] is inspect.Parameter.POSITIONAL_ONLY]
    assert not positional_only, f"{qualname}: parameters became positional-only: {positional_only}"
    added = [p for p in now if p.name not in pinned]
    required_added = [p.name for p in added if p.default is inspect.Parameter.empty]
    assert not required_added, f"{qualname}: new required parameters break callers: {required_added}"


def test_top_level_names_are_exactly_the_pinned_ones():
    """A new public name is added here on purpose; a vanished one is a break."""
    assert sorted(tokenrails.__all__) == sorted(TOP)


@pytest.mark.parametrize("name", sorted(TOP))
def test_top_level_name_resolves_and_keeps_its_signature(name):
    obj = getattr(tokenrails, name)
    if TOP[name] is not None:
        _assert_compatible(f"tokenrails.{name}", obj, TOP[name])


@pytest.mark.parametrize("module", sorted(ADAPTERS))
def test_adapter_names_stay_and_keep_their_signatures(module):
    pytest.importorskip("lmdeploy") if "lmdeploy" in module else None
    mod = importlib.import_module(module)
    gone = sorted(set(ADAPTERS[module]) - set(mod.__all__))
    assert not gone, f"{module}: public names removed: {gone}"
    for name, pinned in ADAPTERS[module].items():
        obj = getattr(mod, name)
        if pinned is not None:
            _assert_compatible(f"{module}.{name}", obj, pinned)


def test_readme_documents_every_top_level_name():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    undocumented = [n for n in TOP if not re.search(rf"`{re.escape(n)}\b", readme)]
    assert not undocumented, f"public names missing from the README's API section: {undocumented}"


def test_guide_spec_from_request_is_a_working_deprecated_alias():
    with pytest.warns(DeprecationWarning, match=r"GuideSpec.from_request .* removed in tokenrails 0\.3\.0; use tokenrails.spec_from_request"):
        spec = tokenrails.GuideSpec.from_request({"type": "json_schema", "json_schema": {"schema": {"type": "integer"}}})
    assert spec == tokenrails.spec_from_request({"type": "json_schema", "json_schema": {"schema": {"type": "integer"}}})
    assert spec.kind == "json_schema"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        assert tokenrails.GuideSpec.from_request({"type": "text"}) is None


@pytest.mark.parametrize("member", [*MATCHER_PHASE_MEMBERS, "grammar_matcher()"])
def test_matcher_phase_members_are_working_deprecated_aliases(member):
    """A matcher written against the old contract (reading or subclassing these) still works."""
    m = tokenrails.compile_guide(tokenrails.GuideSpec.regex("a"), _tiny_vocab()).matcher()
    name = member.rstrip("()")
    with pytest.warns(DeprecationWarning, match=rf"Matcher.{name} .* removed in tokenrails 0\.3\.0; use "):
        got = getattr(m, name)() if member.endswith("()") else getattr(m, name)
    assert got is m if name == "grammar_matcher" else got == MATCHER_PHASE_MEMBERS[member]


def _tiny_vocab() -> tokenrails.Vocabulary:
    return tokenrails.Vocabulary([b"a", b"b", b""], eos_ids=[2], special_ids=[2])


@pytest.mark.parametrize("old,new", sorted(DEPRECATED_MODULES.items()))
def test_moved_module_imports_warns_at_the_users_line_and_matches_the_new_one(old, new):
    """Run in a fresh interpreter: the warning fires once, at import, and Python's default filter
    shows it because it points at the importing script (``__main__``)."""
    code = (f"import {old} as o, {new} as n\n"
            "shared = [k for k in dir(o) if not k.startswith('_') and k in dir(n)]\n"
            "assert shared and all(getattr(o, k) is getattr(n, k) for k in shared), shared\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=str(ROOT))
    assert proc.returncode == 0, proc.stderr
    assert f"{old} is deprecated and will be removed in tokenrails" in proc.stderr
    assert "<string>:1: DeprecationWarning" in proc.stderr, proc.stderr  # the user's line, not ours


def test_changelog_names_every_deprecated_alias():
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    matcher = [f"Matcher.{m}" for m in [*MATCHER_PHASE_MEMBERS, "grammar_matcher()"]]
    for old in [*DEPRECATED_MODULES, "GuideSpec.from_request", *matcher]:
        assert old in changelog, f"CHANGELOG.md does not mention the deprecated {old}"

"""xgrammar backend: every spec kind, one ``GrammarCompiler`` per vocabulary, byte-bounded cache."""
from __future__ import annotations

import json
import re

import torch
import xgrammar as xgr

from ..bitmask import eos_only_row
from ..backend import CompiledGuide, GuideBackend, Matcher
from ..errors import GuideError, GuideLimitError, InvalidGuideError, UnsupportedGuideError
from ..limits import GuideLimits
from ..native_pools import NativePools
from ..limit_checks import check_spec_limits, check_structural_tag
from ..regex_hazards import refuse_regex_hazards
from ..schema_semantics import is_strict, policy_payload, policy_schema
from ..spec import GuideSpec
from ..vocabulary import Vocabulary, whole_utf8_prefix
from . import xgrammar_markers as markers_mod
from ..pattern_lengths import fold_tag_lengths
from .xgrammar_coverage import XGRAMMAR_REGEX_KIND_HAZARDS, refuse_unenforced_tag_schema, xgrammar_unenforced
from .xgrammar_lengths import exact_string_lengths, has_length_bounds
from .xgrammar_markers import ebnf_string_literal


def choice_ebnf(options: list[str]) -> str:
    if any(o == "" for o in options):
        alts = [ebnf_string_literal(o) for o in options if o != ""]
        body = " | ".join(alts) if alts else '""'
        return f'root ::= ({body})?' if alts else 'root ::= ""'
    return "root ::= " + " | ".join(ebnf_string_literal(o) for o in options)


class XGrammarMatcher(Matcher):
    __slots__ = ("_m", "vocab", "_eos_words", "_names_tokens")

    def __init__(self, compiled: xgr.CompiledGrammar, vocab: Vocabulary, names_tokens: bool = True):
        self.vocab = vocab
        self._m = xgr.GrammarMatcher(compiled, override_stop_tokens=list(vocab.eos_ids))
        self._names_tokens = names_tokens  # token-level elements: one token may be forced with no text

    def fill_next_token_bitmask(self, bitmask: torch.Tensor, index: int = 0) -> bool:
        if self._m.is_terminated():
            eos_only_row(bitmask[index], self.vocab.eos_ids)
            return True
        return bool(self._m.fill_next_token_bitmask(bitmask, index))

    @classmethod
    def batch_fill(cls, matchers, bitmask: torch.Tensor, rows, threads: int = 1) -> None:
        """xgrammar's C++ batch fill: its own threads (``threads``), no GIL; terminated rows
        filled here."""
        live, live_rows = [], []
        for m, r in zip(matchers, rows):
            if m._m.is_terminated():
                m.fill_next_token_bitmask(bitmask, r)
            else:
                live.append(m._m)
                live_rows.append(int(r))
        if live:
            with _BATCH.lock:
                _BATCH.get(threads).batch_fill_next_token_bitmask(live, bitmask, live_rows)

    def accept_token(self, token_id: int) -> bool:
        if self._m.is_terminated():
            return False
        if not 0 <= token_id < self.vocab.num_tokens:
            return False  # padding ids are never grammar tokens
        if token_id in self.vocab.special_ids and token_id not in self.vocab.eos_ids:
            return False  # answered here: xgrammar would also log a warning per rejected special
        return bool(self._m.accept_token(int(token_id)))

    def rollback(self, num_tokens: int) -> None:
        if num_tokens:
            self._m.rollback(int(num_tokens))

    def is_terminated(self) -> bool:
        return bool(self._m.is_terminated())

    def reset(self) -> None:
        self._m.reset()

    def find_jump_forward_string(self) -> str:
        return self._jump_forward()[0]

    def jump_forward_probe(self) -> str | None:
        text, forced = self._jump_forward()
        return text if text or not (forced or self._names_tokens) else None

    def _jump_forward(self) -> tuple[str, bool]:
        """(the forced whole characters, whether any byte is forced). xgrammar hands its forced
        bytes over as text and raises when they end, or start, inside a character."""
        if self._m.is_terminated():
            return "", False
        try:
            text = self._m.find_jump_forward_string()
        except UnicodeDecodeError as exc:
            return whole_utf8_prefix(exc.object), True
        return text, bool(text)

    def is_accepting(self) -> bool:
        return self._m.is_terminated() or bool(self._m.is_completed())


class MarkerXGrammarMatcher(XGrammarMatcher):
    """A matcher over the marker view: marker tokens allowed where the grammar spells them
    (``Token(id)``), and in dispatch free text only when they start a trigger, fed as text."""

    __slots__ = ("_markers", "_triggers")

    def __init__(self, compiled: xgr.CompiledGrammar, vocab: Vocabulary,
                 markers: markers_mod.MarkerSet, triggers: dict[int, list[str]]):
        # its Token(id) elements always stand beside their text: never the one choice
        super().__init__(compiled, vocab, names_tokens=False)
        self._markers = markers
        self._triggers = triggers

    def fill_next_token_bitmask(self, bitmask: torch.Tensor, index: int = 0) -> bool:
        super().fill_next_token_bitmask(bitmask, index)
        if not self._m.is_terminated():
            markers_mod.add_trigger_markers(self._m, bitmask[index], self._triggers)
        return True

    @classmethod
    def batch_fill(cls, matchers, bitmask: torch.Tensor, rows, threads: int = 1) -> None:
        XGrammarMatcher.batch_fill(matchers, bitmask, rows, threads)
        for m, r in zip(matchers, rows):
            if not m._m.is_terminated():
                markers_mod.add_trigger_markers(m._m, bitmask[int(r)], m._triggers)

    def accept_token(self, token_id: int) -> bool:
        text = self._markers.texts.get(token_id)
        if text is None or self._m.is_terminated():
            return super().accept_token(token_id)
        if self._m.accept_token(int(token_id)):
            return True  # a literal spelled by the marker (Token(id) alternative)
        # dispatch free text: the dispatcher must see the trigger's text, not a sentinel
        texts = self._triggers.get(token_id)
        return (texts is not None and markers_mod.in_byte_free_text(self._m)
                and markers_mod.starts_trigger(self._m, texts)
                and bool(self._m.accept_string(text.encode())))


# One BatchGrammarMatcher per thread count for the process (native_pools.py). On 2 cores its
# threads do not pay, hence the manager's defaults (``fill_threads``: 1 below 4 CPUs).
_BATCH = NativePools(lambda threads: xgr.BatchGrammarMatcher(max_threads=threads))


_TOKEN_NAMING_KINDS = frozenset({"grammar", "structural_tag"})


class XGrammarGuide(CompiledGuide):
    backend = "xgrammar"

    def __init__(self, spec: GuideSpec, vocab: Vocabulary, grammar: xgr.CompiledGrammar,
                 markers: markers_mod.MarkerSet | None = None, triggers: dict[int, list[str]] | None = None):
        super().__init__(spec, vocab)
        self.grammar = grammar
        self.markers = markers  # set when the grammar admits marker tokens (marker view)
        self.triggers = triggers or {}
        self._names_tokens: bool | None = None

    def matcher(self) -> XGrammarMatcher:
        if self.markers is not None:
            return MarkerXGrammarMatcher(self.grammar, self.vocab, self.markers, self.triggers)
        if self._names_tokens is None:  # printed once per guide (ms for a large one): only a client's
            # grammar or a structural tag can name token ids; xgrammar writes schemas, regexes and
            # choices as text alone
            self._names_tokens = self.spec.kind in _TOKEN_NAMING_KINDS and markers_mod.names_token_ids(
                markers_mod.scan_ebnf(str(self.grammar.grammar)))
        return XGrammarMatcher(self.grammar, self.vocab, self._names_tokens)

    @property
    def memory_bytes(self) -> int:
        return int(self.grammar.memory_size_bytes)


class XGrammarBackend(GuideBackend):
    name = "xgrammar"
    kinds = frozenset({"json_schema", "json_object", "regex", "choice", "grammar", "structural_tag"})

    def __init__(self, vocab: Vocabulary, limits: GuideLimits):
        super().__init__(vocab, limits)
        self.tokenizer_info = xgr.TokenizerInfo(
            vocab.grammar_token_bytes(),
            xgr.VocabType.RAW,
            vocab_size=vocab.vocab_size,
            stop_token_ids=list(vocab.eos_ids),
        )
        # xgrammar's own cache is a second level under the manager's LRU; bound it in bytes.
        self.compiler = xgr.GrammarCompiler(
            self.tokenizer_info, max_threads=1, cache_enabled=True,
            cache_limit_bytes=min(limits.cache_max_bytes, 1 << 30),
        )

    def check(self, spec: GuideSpec) -> None:
        """The shared checks, with xgrammar's own (tighter) repeat bounds: its compile cannot be
        interrupted, and a bound other backends compile in milliseconds takes it seconds."""
        tight = self.limits.replace(max_repeat=min(self.limits.max_repeat, self.limits.xgrammar_max_repeat))
        configured = self.limits
        try:
            self._check(spec, tight)
        except GuideLimitError as exc:
            if exc.limit == "max_repeat" and (not isinstance(exc.value, int) or exc.value > configured.max_repeat):
                raise GuideLimitError(f"limit max_repeat={configured.max_repeat} exceeded: got {exc.value}",
                                      limit="max_repeat", value=exc.value) from exc
            if exc.limit == "max_repeat" and tight.max_repeat < configured.max_repeat:
                raise GuideLimitError(
                    f"limit xgrammar_max_repeat={tight.max_repeat} exceeded: got {exc.value} (xgrammar compiles "
                    "large bounded repeats in seconds and cannot be interrupted; llguidance and fsm serve them)",
                    limit="xgrammar_max_repeat", value=exc.value) from exc
            raise

    def _check(self, spec: GuideSpec, limits: GuideLimits) -> None:
        super().check(spec)
        check_spec_limits(spec, limits)
        if spec.kind == "json_schema":
            findings = xgrammar_unenforced(policy_schema(spec), is_strict(spec))  # what _compile compiles
            if findings:
                raise UnsupportedGuideError(
                    "xgrammar cannot enforce: " + "; ".join(findings[:5]),
                    feature=findings[0], backend=self.name,
                )
            if spec.option("whitespace_pattern") is not None:
                raise UnsupportedGuideError(
                    "xgrammar does not support a custom whitespace_pattern",
                    feature="whitespace_pattern", backend=self.name,
                )
        elif spec.kind == "regex":
            refuse_regex_hazards(spec.pattern, XGRAMMAR_REGEX_KIND_HAZARDS, self.name)
        elif spec.kind == "grammar" and spec.option("dialect") == "lark":
            raise UnsupportedGuideError("xgrammar takes EBNF; Lark grammars compile on llguidance",
                                        feature="lark", backend=self.name)
        elif spec.kind == "structural_tag":
            check_structural_tag(fold_tag_lengths(spec.tag), limits, refuse_unenforced_tag_schema)  # what compile() compiles

    def compile(self, spec: GuideSpec) -> XGrammarGuide:
        try:
            marked = self._compile_with_markers(spec)
            if marked is not None:
                return marked
            grammar = self._compile(spec)
        except GuideError:
            raise
        except (RuntimeError, ValueError, TypeError, xgr.InvalidJSONError,
                xgr.InvalidStructuralTagError) as exc:
            raise InvalidGuideError(f"xgrammar rejected the {spec.kind} constraint: {_first_line(exc)}") from exc
        return XGrammarGuide(spec, self.vocab, grammar)

    def guide_of(self, compiled: xgr.CompiledGrammar) -> XGrammarGuide:
        """A guide over a grammar the caller compiled with xgrammar itself, for code that holds
        xgrammar's own objects (outlines' ``XGrammarLogitsProcessor(compiled_grammar)``)."""
        return XGrammarGuide(GuideSpec.grammar('root ::= ""  # compiled by the caller with xgrammar'),
                             self.vocab, compiled)

    def _compile_with_markers(self, spec: GuideSpec) -> XGrammarGuide | None:
        """Tags and grammars whose structural literals spell marker tokens compile on the marker
        view (xgrammar_markers.py); everything else, the common case, returns None here."""
        if spec.kind not in ("structural_tag", "grammar"):
            return None
        markers = markers_mod.marker_set(self.vocab)
        if markers.finder is None:
            return None
        if spec.kind == "grammar":
            found = markers_mod.ebnf_grammar(spec.ebnf, markers)
        else:
            found = markers_mod.structural_tag_grammar(fold_tag_lengths(spec.tag), markers)
        if found is None:
            return None
        ebnf, triggers = found
        dispatch = markers_mod.has_dispatch(list(markers_mod.scan_ebnf(ebnf)))
        compiled = self._marker_compiler(markers, dispatch).compile_grammar(ebnf)
        guide = XGrammarGuide(spec, self.vocab, compiled, markers, triggers)
        guide.marker_dispatch = dispatch
        return guide

    def warm(self) -> None:
        """The marker views' compilers, built now when the vocabulary has marker tokens (each a
        tokenizer info over the whole vocabulary: tool-call formats compile on them)."""
        markers = markers_mod.marker_set(self.vocab)
        if markers.finder is not None:
            for dispatch in (False, True):
                self._marker_compiler(markers, dispatch)

    def _marker_info(self, markers: markers_mod.MarkerSet, dispatch: bool) -> xgr.TokenizerInfo:
        def build() -> xgr.TokenizerInfo:
            return xgr.TokenizerInfo(
                markers_mod.marker_view_tokens(self.vocab, markers, dispatch), xgr.VocabType.RAW,
                vocab_size=self.vocab.vocab_size, stop_token_ids=list(self.vocab.eos_ids),
            )
        return self.vocab.cached(f"xgrammar_marker_info_{'dispatch' if dispatch else 'plain'}", build)

    def _marker_compiler(self, markers: markers_mod.MarkerSet, dispatch: bool) -> xgr.GrammarCompiler:
        def build() -> xgr.GrammarCompiler:
            return xgr.GrammarCompiler(
                self._marker_info(markers, dispatch), max_threads=1, cache_enabled=True,
                cache_limit_bytes=min(self.limits.cache_max_bytes, 1 << 30),
            )
        return self.vocab.cached(f"xgrammar_marker_compiler_{'dispatch' if dispatch else 'plain'}", build)

    # ---- a compile done in another process (compile_procs.py) ----------------------------
    @staticmethod
    def export(guide: XGrammarGuide) -> dict:
        """What rebuilds ``guide`` in another process: xgrammar's own serialization."""
        return {"json": guide.grammar.serialize_json(), "dispatch": getattr(guide, "marker_dispatch", None),
                "triggers": guide.triggers}

    def restore(self, spec: GuideSpec, state: dict) -> XGrammarGuide:
        dispatch = state["dispatch"]
        if dispatch is None:
            return XGrammarGuide(spec, self.vocab, xgr.CompiledGrammar.deserialize_json(state["json"], self.tokenizer_info))
        markers = markers_mod.marker_set(self.vocab)
        info = self._marker_info(markers, dispatch)
        guide = XGrammarGuide(spec, self.vocab, xgr.CompiledGrammar.deserialize_json(state["json"], info),
                              markers, state["triggers"])
        guide.marker_dispatch = dispatch
        return guide

    def _compile(self, spec: GuideSpec) -> xgr.CompiledGrammar:
        c = self.compiler
        if spec.kind == "json_schema":
            # One policy across backends (schema_semantics.py): keyword-implied types made explicit;
            # strict_mode is the closed-object rule, off only for strict=False specs.
            return c.compile_json_schema(
                policy_payload(spec), any_whitespace=bool(spec.option("any_whitespace", True)),
                strict_mode=is_strict(spec),
            )
        if spec.kind == "json_object":
            return c.compile_builtin_json_grammar()
        if spec.kind == "regex":
            return c.compile_regex(spec.pattern)
        if spec.kind == "choice":
            return c.compile_grammar(choice_ebnf(spec.choices))
        if spec.kind == "grammar":
            return c.compile_grammar(spec.ebnf)
        tag = fold_tag_lengths(spec.tag)  # pattern + lengths as one pattern xgrammar enforces
        if has_length_bounds(tag):  # xgrammar's own grammar, its length-bounded strings made exact
            return c.compile_grammar(exact_string_lengths(str(markers_mod.tag_grammar(tag))))
        if "structures" in tag:  # legacy OpenAI/LMDeploy shape: structures + triggers
            items = [
                xgr.StructuralTagItem(begin=s["begin"], schema=json.dumps(s.get("schema", {})), end=s["end"])
                for s in tag["structures"]
            ]
            return c.compile_structural_tag(items, list(tag.get("triggers", [])))
        return c.compile_structural_tag(json.dumps(tag))


_CPP_PREFIX = re.compile(r"^\[\d{2}:\d{2}:\d{2}\] \S+:\d+: (Check failed: \(.*?\) is false: )?")


def _first_line(exc: BaseException) -> str:
    """xgrammar's message without its C++ timestamp and source location: what a client needs."""
    text = str(exc).strip().splitlines()
    msg = text[-1] if text else type(exc).__name__
    return _CPP_PREFIX.sub("", msg)[:500]

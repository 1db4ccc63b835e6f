"""``FSMBackend``: regex, choice and JSON schema (lowered like outlines) as a byte DFA + token index.

The adapter of ``tokenrails.guided.fsm`` (our regex → minimal DFA → token index package) to the
backend contract, beside the other backends. Per-step cost is a row copy: every DFA state's token mask is computed once per compiled guide
(on first visit) and shared by all matchers of that guide.
"""
from __future__ import annotations

from ..backend import CompiledGuide, GuideBackend
from ..budget import budget_table
from ..errors import UnsupportedGuideError
from ..fsm.compiler import compile_choices, compile_regex
from ..fsm.dfa import DFA, START
from ..fsm.matcher import FSMMatcher, grammar_bytes
from ..fsm.schema import schema_to_regex
from ..fsm.token_index import TokenIndex
from ..limit_checks import check_spec_limits
from ..spec import GuideSpec
from ..vocabulary import Vocabulary


class FSMGuide(CompiledGuide):
    backend = "fsm"

    def __init__(self, spec: GuideSpec, vocab: Vocabulary, dfa: DFA, index: TokenIndex, regex: str | None):
        super().__init__(spec, vocab)
        self.dfa = dfa
        self.index = index
        self.regex = regex  # the regex compiled (None for choices)

    def matcher(self) -> FSMMatcher:
        return FSMMatcher(self.index)

    def precompute(self) -> None:
        """Compute every state's mask now (e.g. in a background thread after compile)."""
        self.index.precompute()

    @property
    def memory_bytes(self) -> int:
        table = self.__dict__.get("_budget_table")  # budget specs: the distance table and its rows
        extra = table.memory_bytes if table is not None else 0
        return self.dfa.memory_bytes + self.index.memory_bytes + 1024 + extra


class FSMBackend(GuideBackend):
    # Per-vocabulary tables (token trie, grammar bytes) are built on first compile, not in the
    # constructor: it runs under the vocabulary's memo lock, which is not re-entrant.
    name = "fsm"
    kinds = frozenset({"regex", "choice", "json_schema"})

    def check(self, spec: GuideSpec) -> None:
        if spec.option("budget") == "close" and spec.kind not in self.kinds:
            raise UnsupportedGuideError(
                f"budget closing (budget='close') needs a constraint the fsm backend compiles to a DFA "
                f"(regex, choice or a JSON schema its lowering enforces); a {spec.kind} constraint is not one",
                feature="budget", backend=self.name,
            )
        if spec.kind in ("json_object", "grammar", "structural_tag"):
            raise UnsupportedGuideError(
                f"the fsm backend only enforces regular languages (regex, choice, json_schema); "
                f"{spec.kind} constraints need a grammar backend",
                feature=spec.kind, backend=self.name,
            )
        super().check(spec)
        check_spec_limits(spec, self.limits)

    def compile(self, spec: GuideSpec) -> FSMGuide:
        if spec.option("budget") == "close":
            return self._compile_budget(spec)
        return self._compile(spec)

    def _compile_budget(self, spec: GuideSpec) -> FSMGuide:
        """A budget spec: the guide with its distance table built now, in the compile pool
        (tokenrails/guided/budget.py), so no decoding step waits for it."""
        try:
            guide = self._compile(spec)
        except UnsupportedGuideError as exc:
            raise UnsupportedGuideError(
                f"budget closing (budget='close') needs a constraint the fsm backend compiles to a DFA: {exc}",
                feature="budget", backend=self.name,
            ) from None
        budget_table(guide, self.limits)
        return guide

    def _compile(self, spec: GuideSpec) -> FSMGuide:
        self.check(spec)
        regex: str | None = None
        if spec.kind == "regex":
            regex = spec.pattern
            dfa = compile_regex(regex, self.limits)
        elif spec.kind == "choice":
            dfa = compile_choices(spec.choices, self.limits)
        else:
            regex = schema_to_regex(spec, self.limits)
            # the lowered regex can be long for a large schema; it is bounded by the schema limits
            dfa = compile_regex(regex, self.limits, check_length=False)
        return self._guide(spec, dfa, regex)

    def _guide(self, spec: GuideSpec, dfa: DFA, regex: str | None) -> FSMGuide:
        index = TokenIndex(dfa, self.vocab)
        if not index.native:
            grammar_bytes(self.vocab)  # the Python step's table, built here rather than in decoding
        index.ensure(START)  # the first mask is needed immediately
        if spec.kind != "choice":  # a choice output visits a handful of its states
            index.prime()  # the cheap rows of the next states, within a few tens of microseconds
        index.warm_in_background()  # the rest of a small DFA's rows, off the decoding thread
        return FSMGuide(spec, self.vocab, dfa, index, regex)

    # ---- a compile done in another process (compile_procs.py) ----------------------------
    @staticmethod
    def export(guide: FSMGuide) -> dict:
        """The minimal DFA's arrays (our own format); the token index is rebuilt lazily here."""
        d = guide.dfa
        return {"trans": d.trans, "classmap": d.classmap, "accepting": d.accepting, "regex": guide.regex}

    def restore(self, spec: GuideSpec, state: dict) -> FSMGuide:
        dfa = DFA(state["trans"], state["classmap"], state["accepting"])
        guide = self._guide(spec, dfa, state["regex"])
        if spec.option("budget") == "close":
            budget_table(guide, self.limits)
        return guide

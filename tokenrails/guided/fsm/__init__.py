"""tokenrails' own regex FSM: regex / choice / JSON-schema (lowered like outlines) → byte DFA.

Pipeline: ``regex_parser`` (Python ``re`` syntax → AST of code-point sets; the only parser) →
``thompson`` (character sets as cached minimal fragments, via ``utf8`` byte-range sequences; the AST
flattened for the C builder) → ``native_builder`` (the C extension: Thompson NFA, subset
construction over byte classes, pruning, Hopcroft minimization) or ``dfa_fallback`` (the same in
Python: no-compiler fallback and test oracle, over ``nfa``) → ``dfa`` (the ``DFA`` type) →
``token_index`` (per-state packed token masks from a per-vocabulary token trie) → ``matcher``.
The backend adapter is ``tokenrails.guided.backends.fsm_backend``.
"""

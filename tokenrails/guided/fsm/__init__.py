"""tokenrails' own regex-FSM backend: regex / choice / JSON-schema (lowered like outlines) → byte DFA.

Pipeline: ``regex_parser`` (Python ``re`` syntax → AST of code-point sets) → ``utf8`` (code-point
ranges → UTF-8 byte-range sequences) → ``nfa`` (Thompson NFA over bytes) → ``dfa`` (subset
construction over byte equivalence classes + Hopcroft minimization) → ``token_index`` (per-state
packed token masks from a per-vocabulary token trie) → ``matcher`` / ``backend``.
"""

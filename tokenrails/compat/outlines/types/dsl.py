"""outlines 1.x ``outlines.types.dsl``: output-type terms (``Regex``, ``String``, ``JsonSchema``,
``Choice``, ``CFG``, combinators) and ``python_types_to_terms``.

Only the leaf terms people construct directly; each one maps to exactly one ``GuideSpec``
(``types.convert.spec_for_output_type``). The classes live in ``terms.py`` and the Python-type
conversion in ``python_terms.py``; this module is the public name that gathers them.
"""
from __future__ import annotations

from .python_terms import (  # noqa: F401  (outlines names)
    _ensure_json_quoted, _handle_dict, _handle_list, _handle_literal, _handle_tuple, _handle_union,
    python_types_to_terms,
)
from .terms import (  # noqa: F401  (outlines names)
    Term,
    _as_term,
    String,
    Regex,
    CFG,
    Choice,
    JsonSchema,
    _non_negative,
    Sequence,
    Alternatives,
    _Unary,
    Optional,
    KleeneStar,
    KleenePlus,
    QuantifyExact,
    QuantifyMinimum,
    QuantifyMaximum,
    QuantifyBetween,
    either,
    optional,
    exactly,
    at_least,
    at_most,
    between,
    one_or_more,
    zero_or_more,
    to_regex,
    regex,
    json_schema,
    cfg,
)

# outlines defines these functions in ``outlines.types.dsl`` (the term classes are named so by
# ``_identity.HOMES``, and still pickle without the shim installed: ``Term.__reduce_ex__``).
for _public in (either, optional, exactly, at_least, at_most, between, one_or_more, zero_or_more, to_regex, regex,
                json_schema, cfg, python_types_to_terms):
    _public.__module__ = "outlines.types.dsl"
del _public

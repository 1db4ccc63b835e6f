"""Annotations constrain nothing, so they must cost nothing.

``default``, ``examples``, ``$comment`` and the other keywords below only describe a schema; no
backend reads them. A client may still send one 900 levels deep or megabytes long (pydantic
copies a model's defaults into ``default``), and the canonical encoding, the depth limit and every
compiler would then pay for it, or refuse the schema. :func:`drop_container_annotations` removes
the container-valued ones (objects, lists) from a schema before anything else sees it. Scalar
annotations (a ``description`` string, a numeric ``default``) stay: they cost their bytes only,
and clients use them to tell otherwise equal specs apart.
"""
from __future__ import annotations

from typing import Any

from .schema_walk import FREE_ANNOTATIONS, LIST_KEYS, MAP_KEYS, ONE_KEYS


def drop_container_annotations(schema: Any) -> Any:
    """A copy of ``schema`` without object- or list-valued annotations, at every schema position
    (not inside ``enum``/``const`` values, not property *names*). Iterative: a deep schema never
    hits Python's recursion limit here; only its schema positions are copied."""
    if not isinstance(schema, dict):
        return schema
    root = dict(schema)
    stack = [root]
    while stack:
        node = stack.pop()
        for key, value in list(node.items()):
            if key in FREE_ANNOTATIONS:
                if isinstance(value, (dict, list)):
                    del node[key]
            elif (key in MAP_KEYS or key == "dependencies") and isinstance(value, dict):
                node[key] = {name: _fresh(sub, stack) for name, sub in value.items()}
            elif key in ONE_KEYS or key in LIST_KEYS:
                if isinstance(value, dict):
                    node[key] = _fresh(value, stack)
                elif isinstance(value, list):
                    node[key] = [_fresh(sub, stack) for sub in value]
    return root


def _fresh(sub: Any, stack: list[dict]) -> Any:
    if isinstance(sub, dict):
        sub = dict(sub)
        stack.append(sub)
    return sub


_TAG_SCHEMA_KEYS = ("schema", "json_schema")


def drop_tag_annotations(tag: Any) -> Any:
    """A structural tag whose JSON schemas (tool parameters) went through
    :func:`drop_container_annotations`; the tag's own structure is copied, schemas are not walked
    twice."""
    if not isinstance(tag, dict):
        return tag
    root = dict(tag)
    stack: list[Any] = [root]
    while stack:
        node = stack.pop()
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for key, value in list(items):
            if isinstance(node, dict) and key in _TAG_SCHEMA_KEYS and isinstance(value, dict):
                node[key] = drop_container_annotations(value)
            elif isinstance(value, dict):
                node[key] = dict(value)
                stack.append(node[key])
            elif isinstance(value, list):
                node[key] = list(value)
                stack.append(node[key])
    return root

"""outlines prompt templates: ``Template`` (1.x ``outlines.templates``) and, through prompts.py,
the 0.x ``@outlines.prompt`` decorator. Jinja2 templates written in docstrings or files, with
outlines' conventions (implemented here from its documented behaviour and test cases):

* the text is dedented like a docstring (``inspect.cleandoc``); a template ending in a blank
  line keeps one trailing newline;
* a run of spaces after a word collapses to one space (so ``\\``-continued lines join cleanly)
  while indentation at line starts is kept;
* Jinja runs with ``trim_blocks`` and ``lstrip_blocks`` (block tags take no lines of their own);
* filters describe Python objects to a model: ``name``, ``description``, ``source``,
  ``signature``/``args``, ``schema``.
"""
from __future__ import annotations

import inspect
import json
import os
import re
import textwrap
import typing
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Callable, Dict, Optional


def _clean(content: str) -> str:
    text = inspect.cleandoc(content)
    if content.replace(" ", "").endswith("\n\n"):
        text += "\n"
    return re.sub(r"(?<=\S)[ \t]+", " ", text)


def _environment(loader: Any = None, filters: Optional[Dict[str, Callable]] = None):
    import jinja2

    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True,
                             undefined=jinja2.StrictUndefined, loader=loader)
    env.filters.update(name=get_fn_name, description=get_fn_description, source=get_fn_source,
                       signature=get_fn_signature, args=get_fn_args, schema=get_schema)
    env.filters.update(filters or {})
    return env


def build_template_from_string(content: str, filters: Optional[Dict[str, Callable]] = None):
    """A Jinja template from text written inline (a docstring, a string literal)."""
    return _environment(filters=filters).from_string(_clean(content))


def build_template_from_file(path: str, filters: Optional[Dict[str, Callable]] = None):
    """A Jinja template from a file; ``extends``/``include`` resolve next to it."""
    import jinja2

    directory, name = os.path.split(os.path.abspath(path))
    return _environment(jinja2.FileSystemLoader(directory), filters).get_template(name)


@dataclass
class Template:
    """A prompt template: call it with the template's variables to get the prompt text."""

    template: Any
    signature: Optional[inspect.Signature] = None
    filters: Dict[str, Callable] = field(default_factory=dict)

    def __call__(self, *args: Any, **kwargs: Any) -> str:
        if self.signature is not None:
            bound = self.signature.bind(*args, **kwargs)
            bound.apply_defaults()
            return self.template.render(**bound.arguments)
        return self.template.render(**kwargs)

    @classmethod
    def from_string(cls, content: str, filters: Optional[Dict[str, Callable]] = None) -> "Template":
        return cls(build_template_from_string(content, filters), None, dict(filters or {}))

    @classmethod
    def from_file(cls, path: Any, filters: Optional[Dict[str, Callable]] = None) -> "Template":
        return cls(build_template_from_file(str(path), filters), None, dict(filters or {}))


# ---- filters ---------------------------------------------------------------------------------
def get_fn_name(fn: Any) -> str:
    if not callable(fn):
        raise TypeError("The `name` filter only applies to callables.")
    return getattr(fn, "__name__", type(fn).__name__)


def get_fn_description(fn: Any) -> str:
    """The first paragraph of the docstring, on one line."""
    if not callable(fn):
        raise TypeError("The `description` filter only applies to callables.")
    doc = inspect.getdoc(fn)
    if not doc:
        return ""
    return " ".join(doc.split("\n\n")[0].split())


def get_fn_source(fn: Any) -> str:
    if not callable(fn):
        raise TypeError("The `source` filter only applies to callables.")
    source = textwrap.dedent(inspect.getsource(fn))
    match = re.search(r"(\bdef\b.*)", source, re.DOTALL)
    return match.group(1) if match else source


def get_fn_signature(fn: Any) -> str:
    if not callable(fn):
        raise TypeError("The `source` filter only applies to callables.")
    return ", ".join(str(p) for p in inspect.signature(fn).parameters.values())


get_fn_args = get_fn_signature


def get_schema(model: Any) -> str:
    """A JSON sketch of a dict or pydantic model for a prompt: field descriptions, or
    ``<name>`` placeholders, enums as ``<a | b>``, nested models expanded."""
    if isinstance(model, dict):
        return json.dumps(model, indent=2)
    if isinstance(model, type) and hasattr(model, "model_fields"):
        return json.dumps(_sketch(model), indent=2)
    raise NotImplementedError(f"No schema rendering function defined for type {type(model)}.")


def _sketch(model: Any) -> dict:
    out = {}
    for name, info in model.model_fields.items():
        out[name] = _field_sketch(name, info.annotation, info.description)
    return out


def _field_sketch(name: str, annotation: Any, description: Optional[str]) -> Any:
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        if len(args) != 1:
            return f"<{name}>"
        annotation = args[0]
    if isinstance(annotation, type) and hasattr(annotation, "model_fields"):
        return _sketch(annotation)
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        return "<" + " | ".join(str(m.value) for m in annotation) + ">"
    return description if description else f"<{name}>"

"""outlines 0.x prompts: ``@outlines.prompt`` turns a function's docstring into a template whose
arguments are the function's (``Prompt``); see templates.py for the template conventions."""
from __future__ import annotations

import inspect
from typing import Any, Callable, Dict, Optional

from .templates import Template, build_template_from_file, build_template_from_string


class Prompt(Template):
    """A template bound to a signature (from a decorated function) or to none (from a file or
    string: keyword arguments only). ``template`` is the template's text when it came from a
    docstring (outlines 0.0.x exposed that), ``parameters`` the argument names."""

    def __call__(self, *args: Any, **kwargs: Any) -> str:
        jinja = self._jinja if hasattr(self, "_jinja") else self.template
        if self.signature is not None:
            bound = self.signature.bind(*args, **kwargs)
            bound.apply_defaults()
            return jinja.render(**bound.arguments)
        return jinja.render(**kwargs)

    @property
    def parameters(self) -> list:
        return list(self.signature.parameters) if self.signature is not None else []

    @classmethod
    def from_str(cls, content: str, filters: Optional[Dict[str, Callable]] = None) -> "Prompt":
        return cls(build_template_from_string(content, filters), None, dict(filters or {}))

    @staticmethod
    def _template_from_str(content: str, filters: Optional[Dict[str, Callable]] = None):
        return build_template_from_string(content, filters)

    @staticmethod
    def _template_from_file(path: str, filters: Optional[Dict[str, Callable]] = None):
        return build_template_from_file(path, filters)


def prompt(fn: Optional[Callable] = None, filters: Optional[Dict[str, Callable]] = None) -> Any:
    """Decorator: the docstring is the template, the signature its variables."""

    def wrap(f: Callable) -> Prompt:
        doc = f.__doc__
        if doc is None:
            raise TypeError("Could not find a template in the function's docstring.")
        p = Prompt(inspect.cleandoc(doc), inspect.signature(f), dict(filters or {}))
        p._jinja = build_template_from_string(doc, filters)
        return p

    return wrap(fn) if fn is not None else wrap


def render(content: str, **kwargs: Any) -> str:
    """Render template text with outlines' conventions (0.0.x ``outlines.prompts.render``)."""
    return build_template_from_string(content).render(**kwargs)

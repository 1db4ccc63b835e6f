"""``outlines.applications`` (1.x): a prompt template and an output type, bound to a model per call."""
from __future__ import annotations

from typing import Any, Callable, Optional, Union

from .templates import Template


class Application:
    """``Application(template, output_type)(model, template_vars, **inference_kwargs)``.

    The generator is built on first use and kept while the same model is passed, so the output
    type is compiled once per model."""

    def __init__(self, template: Union[Template, Callable[..., str]], output_type: Optional[Any] = None):
        self.template = template
        self.output_type = output_type
        self.model: Optional[Any] = None
        self.generator: Optional[Any] = None

    def __call__(self, model: Any, template_vars: dict, **inference_kwargs: Any) -> Any:
        if model is None:
            raise ValueError("Application needs a model to run")
        if self.generator is None or model is not self.model:
            from .generator import Generator

            self.model = model
            self.generator = Generator(model, self.output_type)
        prompt = self.template(**template_vars)
        return self.generator(prompt, **inference_kwargs)


__all__ = ["Application"]

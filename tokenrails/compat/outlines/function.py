"""``outlines.function`` (0.x): ``Function`` — a prompt template, an output schema and a model name
bundled into one callable, optionally loaded from a GitHub file (``Function.from_github``).

``from_github`` executes the downloaded Python file, exactly as outlines did: only load programs
you trust."""
from __future__ import annotations

import importlib.util
from typing import Any, Callable, Optional


class Function:
    """``Function(prompt_template, schema, model_name)(*args)`` → the parsed output of
    ``generate.json(models.transformers(model_name), schema)`` on the rendered prompt. The model is
    loaded on the first call."""

    def __init__(self, prompt_template: Callable[..., str], schema: Any, model_name: str):
        self.prompt_template = prompt_template
        self.schema = schema
        self.model_name = model_name
        self.generator: Optional[Any] = None

    @classmethod
    def from_github(cls, program_path: str, function_name: str = "fn") -> "Function":
        """The ``Function`` named ``function_name`` in ``{user}/{repo}/{path}`` (no ``.py``)."""
        return extract_function_from_file(download_from_github(program_path), function_name)

    def init_generator(self) -> None:
        from . import generate, models

        self.generator = generate.json(models.transformers(self.model_name), self.schema)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.generator is None:
            self.init_generator()
        return self.generator(self.prompt_template(*args, **kwargs))


def download_from_github(short_path: str) -> str:
    """The text of ``https://raw.githubusercontent.com/{user}/{repo}/main/{path}.py``."""
    parts = short_path.split("/", 2)
    if len(parts) < 3:
        raise ValueError("Please provide a valid path in the form {USERNAME}/{REPO_NAME}/{PATH_TO_FILE}.")
    if short_path.endswith(".py"):
        raise ValueError("Do not append the `.py` extension to the program name.")
    username, repo, path = parts
    url = f"https://raw.githubusercontent.com/{username}/{repo}/main/{path}.py"
    import requests

    response = requests.get(url, timeout=30)
    if response.status_code == 200:
        return response.text
    if response.status_code == 404:
        raise ValueError(f"Program could not be found at {url}")
    response.raise_for_status()
    raise ValueError(f"unexpected HTTP status {response.status_code} for {url}")


def extract_function_from_file(content: str, function_name: str) -> Any:
    """Run ``content`` as a module and return its ``function_name`` attribute."""
    spec = importlib.util.spec_from_loader("outlines_function", loader=None)
    module = importlib.util.module_from_spec(spec)
    exec(content, module.__dict__)  # noqa: S102 - outlines' documented behaviour (trusted programs)
    try:
        return getattr(module, function_name)
    except AttributeError:
        raise AttributeError(f"Could not find an `outlines.Function` instance named {function_name} "
                             "in the remote file. Make sure that the path you specified is correct.") from None


__all__ = ["Function", "download_from_github", "extract_function_from_file"]

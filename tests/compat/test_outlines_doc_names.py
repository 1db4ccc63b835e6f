"""Every public name outlines' documentation imports or calls, per version, resolves in the shim
(issue 28). The names are read at test time from the sdists of outlines 0.0.46, 0.1.14 and 1.3.3
(fetched from the package registry; nothing of outlines is in this repository): Python code
blocks of ``docs/**/*.md`` and ``README.md`` and the ``examples/`` scripts, parsed with ``ast``:
``from outlines.x import Y``, ``import outlines.x`` and ``outlines.a.b`` attribute chains. A name
whose last part appears nowhere in that version's own package (a typo in its docs, such as
1.3.3's ``outlines.Generaor``) is not demanded.

What the names do is tested too: 0.0.46's integrations constrain (transformers'
``prefix_allowed_tokens_fn``, vLLM's logits processors), ``TensorType`` annotates a custom
processor, and the other providers' constructors raise ``UnsupportedProviderError`` (a
``GuideError`` and a ``NotImplementedError``), never a model that would generate unconstrained.
On main 51 of the 126 names (27 + 38 + 61) were missing (7 of 0.0.46's, 11 of 0.1.14's, 33 of
1.3.3's: ``TensorType``, ``outlines.integrations.transformers`` / ``.vllm`` / ``.llamacpp``,
``outlines.exceptions``, the ``from_*`` constructors, ``outlines.models.llamacpp``...).
"""
from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest
import torch

from outlines_peer import _suites

VERSIONS = ["0.0.46", "0.1.14", "1.3.3"]
_BLOCK = re.compile(r"```\s*(?:python|py)\b[^\n]*\n(.*?)```", re.S)


def _sources(root: Path):
    for md in sorted((root / "docs").rglob("*.md")) + [root / "README.md"]:
        for block in _BLOCK.finditer(md.read_text(errors="replace")):
            yield md.name, block.group(1)
    for script in sorted((root / "examples").rglob("*.py")):
        yield script.name, script.read_text(errors="replace")


def _names_in(code: str) -> set[str]:
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return set()
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "outlines":
            names.update(f"{node.module}:{a.name}" for a in node.names if a.name != "*")
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names if a.name.split(".")[0] == "outlines")
        elif isinstance(node, ast.Attribute):
            chain, inner = [], node
            while isinstance(inner, ast.Attribute):
                chain.append(inner.attr)
                inner = inner.value
            if isinstance(inner, ast.Name) and inner.id == "outlines":
                names.add(".".join(["outlines", *reversed(chain)]))
    return names


def _package_text(root: Path) -> str:
    package = root / "src" / "outlines" if (root / "src" / "outlines").is_dir() else root / "outlines"
    return "\n".join(p.read_text(errors="replace") for p in package.rglob("*.py"))


def _module_exists(package: Path, module: str) -> bool:
    path = package.parent.joinpath(*module.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def documented_names(version: str) -> dict[str, str]:
    """``{name: first file using it}`` for the names outlines ``version`` itself defines (an
    outdated example importing a module that version does not have is not demanded)."""
    try:
        root = _suites().fetch(version)
    except Exception as exc:  # noqa: BLE001 - registry unreachable
        pytest.skip(f"outlines {version} could not be fetched from the package registry: {exc}")
    package = root / "src" / "outlines" if (root / "src" / "outlines").is_dir() else root / "outlines"
    text = _package_text(root)
    found: dict[str, str] = {}
    for where, code in _sources(root):
        for name in _names_in(code):
            last = re.split(r"[.:]", name)[-1]
            if ":" in name and not _module_exists(package, name.split(":")[0]):
                continue
            if re.search(rf"\b{re.escape(last)}\b", text):
                found.setdefault(name, where)
    return found


def _resolve(name: str):
    if ":" in name:
        module, attr = name.split(":")
        return getattr(importlib.import_module(module), attr)
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
            break
        except ImportError:
            continue
    for part in parts[cut:]:
        obj = getattr(obj, part)
    return obj


@pytest.fixture
def installed():
    import tokenrails.compat.outlines as shim

    shim.install()
    yield shim
    shim.uninstall()


@pytest.mark.slow  # fetches outlines' sdists from the package registry on first use
@pytest.mark.parametrize("version", VERSIONS)
def test_every_documented_name_resolves(version, installed):
    names = documented_names(version)
    assert len(names) > 10, names  # the scan found the docs
    missing = []
    for name, where in sorted(names.items()):
        try:
            _resolve(name)
        except (ImportError, AttributeError) as exc:
            missing.append(f"{name} ({where}): {exc}")
    assert missing == []


PROVIDER_CALLS = [
    "outlines.from_openai", "outlines.from_vllm", "outlines.from_llamacpp", "outlines.from_anthropic",
    "outlines.models.openai", "outlines.models.llamacpp", "outlines.models.vllm", "outlines.models.mlxlm",
    "outlines.models.transformers_vision", "outlines.models.exllamav2", "outlines.models.openai.OpenAI",
    "outlines.integrations.llamacpp.JSONLogitsProcessor", "outlines.integrations.llamacpp.RegexLogitsProcessor",
]


@pytest.mark.parametrize("name", PROVIDER_CALLS)
def test_other_providers_refuse_with_a_typed_error(name, installed):
    from tokenrails.guided.errors import GuideError

    import outlines

    if name == "outlines.models.openai.OpenAI":  # the submodule's class (0.x's ``openai`` function has the name)
        target = importlib.import_module("outlines.models.openai").OpenAI
    else:  # attribute access, as the docs call them: ``outlines.models.openai(...)``
        target = outlines
        for part in name.split(".")[1:]:
            target = getattr(target, part)
    with pytest.raises(GuideError) as info:
        target("some-model", "arg")
    assert isinstance(info.value, NotImplementedError)


def test_openai_config_is_data(installed):
    from outlines.models.openai import OpenAIConfig

    config = OpenAIConfig(model="gpt-4", temperature=0.2, stop=["\n"])
    assert (config.model, config.temperature, config.n) == ("gpt-4", 0.2, 1)


def test_tensor_type_annotates_a_custom_processor(installed, smollm2_tokenizer):
    """outlines' custom logits-processor example: subclass, annotate with ``TensorType``."""
    from outlines.processors.base_logits_processor import OutlinesLogitsProcessor, TensorType

    class OnlyEven(OutlinesLogitsProcessor):
        def process_logits(self, input_ids: TensorType, logits: TensorType) -> TensorType:
            logits = logits.clone()
            logits[..., 1::2] = float("-inf")
            return logits

    out = OnlyEven("torch")(torch.tensor([[1, 2]]), torch.zeros((1, 6)))
    assert torch.isinf(out[0, 1::2]).all() and not torch.isinf(out[0, ::2]).any()


def _walk(step, prompt: list[int], text_ids: list[int]) -> None:
    """Feed ``text_ids`` one by one; each must be allowed at its step."""
    for i, token in enumerate(text_ids):
        allowed = step(prompt + text_ids[:i])
        assert token in allowed, (i, token)


def test_transformers_prefix_allowed_tokens(installed, smollm2_tokenizer):
    """0.0.46's ``JSONPrefixAllowedTokens`` / ``RegexPrefixAllowedTokens``: what transformers
    calls with ``(batch_id, sentence)``; rows are followed separately."""
    from outlines.integrations.transformers import JSONPrefixAllowedTokens, RegexPrefixAllowedTokens
    from pydantic import BaseModel

    class Person(BaseModel):
        first_name: str
        surname: str

    fn = JSONPrefixAllowedTokens(schema=Person, tokenizer_or_pipe=smollm2_tokenizer, whitespace_pattern=r" ?")
    prompt = smollm2_tokenizer.encode("He is Tom Jones:")
    good = smollm2_tokenizer.encode('{"first_name": "Tom", "surname": "Jones"}', add_special_tokens=False)
    _walk(lambda ids: list(fn(0, torch.tensor(ids))), prompt, good)
    final = list(fn(0, torch.tensor(prompt + good)))
    assert final == [smollm2_tokenizer.eos_token_id]
    assert smollm2_tokenizer.encode("x", add_special_tokens=False)[0] not in list(fn(0, torch.tensor(prompt)))

    digits = RegexPrefixAllowedTokens(r"[0-9]{2}", smollm2_tokenizer)
    other = smollm2_tokenizer.encode("Two digits:")
    one = smollm2_tokenizer.encode("1", add_special_tokens=False)
    assert set(digits(1, torch.tensor(other))) == set(digits(0, torch.tensor(prompt)))  # row 1 starts fresh
    letter = smollm2_tokenizer.encode("a", add_special_tokens=False)[0]
    assert letter not in list(digits(1, torch.tensor(other + one)))


def test_vllm_logits_processor(installed, smollm2_tokenizer):
    """0.0.46's vLLM integration: ``processor(generated_ids, logits)`` masks to the regex."""
    from outlines.integrations.vllm import JSONLogitsProcessor, RegexLogitsProcessor

    class FakeLLM:  # what the processor reads from vllm.LLM
        def get_tokenizer(self):
            return smollm2_tokenizer

    width = len(smollm2_tokenizer)
    proc = RegexLogitsProcessor(r"(yes|no)!", FakeLLM())
    scores = torch.zeros(width)
    yes = smollm2_tokenizer.encode("yes", add_special_tokens=False)
    allowed = set(torch.nonzero(~torch.isinf(proc([], scores))).flatten().tolist())
    assert yes[0] in allowed and smollm2_tokenizer.encode("maybe", add_special_tokens=False)[0] not in allowed
    after = set(torch.nonzero(~torch.isinf(proc(yes, scores))).flatten().tolist())
    assert after == {t for t in range(width) if smollm2_tokenizer.decode([t]) == "!"}

    json_proc = JSONLogitsProcessor({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
                                    FakeLLM(), whitespace_pattern="")
    text = smollm2_tokenizer.encode('{"a":12}', add_special_tokens=False)
    for i, token in enumerate(text):
        assert not torch.isinf(json_proc(text[:i], scores)[token]), i
    assert torch.isinf(json_proc(text, scores)).sum() == width - 1  # only EOS after the object


def test_logits_generator_annotates_and_checks_models(installed, smollm2_tokenizer):
    """outlines 0.0.x/0.1.x's ``models.LogitsGenerator``: a Union of the model classes, used in
    annotations (``typing.get_type_hints`` resolves it) and in ``isinstance``."""
    import typing

    from outlines.models import LogitsGenerator, Transformers

    def run(model: LogitsGenerator, prompt: str) -> str:
        return prompt

    assert typing.get_type_hints(run, localns={"LogitsGenerator": LogitsGenerator})["model"] == LogitsGenerator
    model = Transformers(torch.nn.Linear(1, 1), smollm2_tokenizer)
    assert isinstance(model, LogitsGenerator)
    assert not isinstance(smollm2_tokenizer, LogitsGenerator)
    assert Transformers in typing.get_args(LogitsGenerator)

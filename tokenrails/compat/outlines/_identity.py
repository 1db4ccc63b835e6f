"""The shim's stand-in classes read as outlines' own: ``type(x)``, ``__module__``, ``__qualname__``
and default reprs say ``outlines.models.transformers.Transformers``, not the tokenrails module the
class lives in — per outlines release where outlines moved or renamed a class (0.0.x's
``FSMLogitsProcessor`` is 0.1's ``GuideLogitsProcessor``; ``SamplingParameters`` moved from
``outlines.generate.api`` to ``outlines.samplers``), following ``_api_version``.

Pickle finds a class by ``__module__`` + ``__qualname__``; those now name an outlines module,
which without ``install()`` does not exist, or is the real outlines (another class). So instances
of stand-in classes reduce to a reconstructor of this module that names the class by its
tokenrails home (``Transformers`` -> ``tokenrails.compat.outlines.models.transformers:Transformers``):
pickles and ``copy``/``deepcopy`` never depend on what ``outlines`` is in the loading process.
A user's subclass of a stand-in keeps Python's own reduction (it is pickled under its own name).
The class objects themselves pickle by name, as any class: that works where ``outlines`` is the
shim (after ``install()``; every stand-in is found where outlines keeps it, except 0.1's
``outlines_core.fsm.guide`` instructions), and cloudpickle copies them by value elsewhere.
String annotations are evaluated in the tokenrails module before the rename, so
``typing.get_type_hints`` and pydantic do not look them up in the ``outlines`` module.
"""
from __future__ import annotations

import copyreg
import importlib
import typing
from typing import Any, Callable

from ._api_version import _parse, api_version, on_change

_PACKAGE = __name__.rpartition(".")[0]

# outlines' name for each stand-in, per release line ("0.0", "0.1", "1"): a string is the same in
# every line; a line missing from a dict (the class did not exist there) reads as the nearest
# later line, else the nearest earlier one. Keys: ``<shim module>:<attribute>``, relative to this
# package.
HOMES: dict[str, str | dict[str, str]] = {
    "applications:Application": "outlines.applications:Application",
    "backends.base:BaseBackend": "outlines.backends.base:BaseBackend",
    "backends.llguidance:LLGuidanceBackend": "outlines.backends.llguidance:LLGuidanceBackend",
    "backends.llguidance:LLGuidanceLogitsProcessor": "outlines.backends.llguidance:LLGuidanceLogitsProcessor",
    "backends.outlines_core:OutlinesCoreBackend": "outlines.backends.outlines_core:OutlinesCoreBackend",
    "backends.outlines_core:OutlinesCoreLogitsProcessor": "outlines.backends.outlines_core:OutlinesCoreLogitsProcessor",
    "backends.xgrammar:XGrammarBackend": "outlines.backends.xgrammar:XGrammarBackend",
    "backends.xgrammar:XGrammarLogitsProcessor": "outlines.backends.xgrammar:XGrammarLogitsProcessor",
    "caching:CloudpickleDisk": "outlines.caching:CloudpickleDisk",
    **{f"exceptions:{name}": f"outlines.exceptions:{name}" for name in (
        "OutlinesError", "APIError", "AuthenticationError", "PermissionDeniedError", "NotFoundError", "RateLimitError",
        "BadRequestError", "ServerError", "APITimeoutError", "APIConnectionError", "ProviderResponseError",
        "GenerationError")},
    "fsm.fsm:CFGFSM": "outlines.fsm.fsm:CFGFSM",
    "fsm.fsm:RegexFSM": "outlines.fsm.fsm:RegexFSM",
    "fsm.fsm:StopAtEosFSM": "outlines.fsm.fsm:StopAtEosFSM",
    "fsm.guide:CFGGuide": "outlines.fsm.guide:CFGGuide",
    "fsm.guide:Guide": "outlines.fsm.guide:Guide",
    "fsm.guide:RegexGuide": "outlines.fsm.guide:RegexGuide",
    "fsm.guide:StopAtEOSGuide": "outlines.fsm.guide:StopAtEOSGuide",
    # 0.1's outlines.fsm.guide re-exports outlines-core's instructions
    # (1.x has neither: the shim's ``outlines.fsm.guide`` keeps them)
    "fsm.guide:Generate": {"0.0": "outlines.fsm.guide:Generate", "0.1": "outlines_core.fsm.guide:Generate",
                           "1": "outlines.fsm.guide:Generate"},
    "fsm.guide:Write": {"0.0": "outlines.fsm.guide:Write", "0.1": "outlines_core.fsm.guide:Write",
                        "1": "outlines.fsm.guide:Write"},
    "fsm.parsing:PartialLark": "outlines.fsm.parsing:PartialLark",
    "fsm.parsing:PartialPythonIndenter": "outlines.fsm.parsing:PartialPythonIndenter",
    "fsm.regex:BetterAlphabet": "outlines.fsm.regex:BetterAlphabet",
    "fsm.regex:BetterFSM": "outlines.fsm.regex:BetterFSM",
    "function:Function": "outlines.function:Function",
    "generate.api:SequenceGenerator": "outlines.generate.api:SequenceGenerator",
    "generate.api:SequenceGeneratorAdapter": "outlines.generate.api:SequenceGeneratorAdapter",
    "generate.generator:ContextLengthExceededError": "outlines.generate.generator:ContextLengthExceededError",
    "generate.generator:GenerationState": "outlines.generate.generator:GenerationState",
    "generator:SteerableGenerator": "outlines.generator:SteerableGenerator",
    "inputs:Audio": "outlines.inputs:Audio",
    "inputs:Chat": "outlines.inputs:Chat",
    "inputs:Image": "outlines.inputs:Image",
    "inputs:Video": "outlines.inputs:Video",
    "integrations.llamacpp:CFGLogitsProcessor": "outlines.integrations.llamacpp:CFGLogitsProcessor",
    "integrations.llamacpp:JSONLogitsProcessor": "outlines.integrations.llamacpp:JSONLogitsProcessor",
    "integrations.llamacpp:LogitsProcessor": "outlines.integrations.llamacpp:LogitsProcessor",
    "integrations.llamacpp:RegexLogitsProcessor": "outlines.integrations.llamacpp:RegexLogitsProcessor",
    "integrations.transformers:JSONPrefixAllowedTokens": "outlines.integrations.transformers:JSONPrefixAllowedTokens",
    "integrations.transformers:RegexPrefixAllowedTokens": "outlines.integrations.transformers:RegexPrefixAllowedTokens",
    "integrations.vllm:JSONLogitsProcessor": "outlines.integrations.vllm:JSONLogitsProcessor",
    "integrations.vllm:RegexLogitsProcessor": "outlines.integrations.vllm:RegexLogitsProcessor",
    "models.openai:OpenAIConfig": "outlines.models.openai:OpenAIConfig",
    "models.exllamav2:ExLlamaV2Model": "outlines.models.exllamav2:ExLlamaV2Model",
    "models.providers:LlamaCpp": "outlines.models.llamacpp:LlamaCpp",
    "models.llamacpp:LlamaCppTokenizer": "outlines.models.llamacpp:LlamaCppTokenizer",
    "models.mlxlm:MLXLM": "outlines.models.mlxlm:MLXLM",
    "models.providers:OpenAI": "outlines.models.openai:OpenAI",
    "models.transformers_vision:TransformersVision": "outlines.models.transformers_vision:TransformersVision",
    "models.providers:VLLM": "outlines.models.vllm:VLLM",
    "models.tokenizer:Tokenizer": "outlines.models.tokenizer:Tokenizer",
    "models.transformer_tokenizer:TransformerTokenizer": "outlines.models.transformers:TransformerTokenizer",
    "models.transformers:Transformers": "outlines.models.transformers:Transformers",
    "models.transformers:TransformersTypeAdapter": "outlines.models.transformers:TransformersTypeAdapter",
    "processors.base_logits_processor:OutlinesLogitsProcessor": {
        "0.0": "outlines.processors.base_logits_processor:BaseLogitsProcessor",
        "0.1": "outlines.processors.base_logits_processor:OutlinesLogitsProcessor"},
    "processors.structured:GuideLogitsProcessor": {
        "0.0": "outlines.processors.structured:FSMLogitsProcessor",
        "0.1": "outlines.processors.structured:GuideLogitsProcessor"},
    "processors.structured:CFGLogitsProcessor": "outlines.processors.structured:CFGLogitsProcessor",
    "processors.structured:JSONLogitsProcessor": "outlines.processors.structured:JSONLogitsProcessor",
    "processors.structured:RegexLogitsProcessor": "outlines.processors.structured:RegexLogitsProcessor",
    "processors.tensor_adapters.base:TensorAdapter": "outlines.processors.tensor_adapters.base:TensorAdapter",
    "processors.tensor_adapters.numpy:NumpyTensorAdapter": "outlines.processors.tensor_adapters.numpy:NumpyTensorAdapter",
    "processors.tensor_adapters.torch:TorchTensorAdapter": "outlines.processors.tensor_adapters.torch:TorchTensorAdapter",
    "prompts:Prompt": "outlines.prompts:Prompt",
    "samplers:BeamSearchSampler": "outlines.samplers:BeamSearchSampler",
    "samplers:GreedySampler": "outlines.samplers:GreedySampler",
    "samplers:MultinomialSampler": "outlines.samplers:MultinomialSampler",
    "samplers:SamplingParameters": {"0.0": "outlines.generate.api:SamplingParameters",
                                    "0.1": "outlines.samplers:SamplingParameters"},
    "templates:Template": "outlines.templates:Template",
    **{f"types.terms:{name}": f"outlines.types.dsl:{name}" for name in (
        "Term", "String", "Regex", "CFG", "Choice", "JsonSchema", "Sequence", "Alternatives", "Optional", "KleeneStar",
        "KleenePlus", "QuantifyExact", "QuantifyMinimum", "QuantifyMaximum", "QuantifyBetween")},
    # enums built on first use; outlines names them differently from the attribute holding them
    "types.airports:IATA": "outlines.types.airports:Airport",
    "types.countries:Alpha2": "outlines.types.countries:Alpha_2",
    "types.countries:Alpha3": {"0.0": "outlines.types.countries:Alpha_2", "1": "outlines.types.countries:Alpha_3"},
    "types.countries:Numeric": "outlines.types.countries:Numeric_code",
    "types.countries:Name": "outlines.types.countries:Name",
    "types.countries:Flag": "outlines.types.countries:Flag",
}
LINES = ("0.0", "0.1", "1")

# stand-in class -> (tokenrails module, attribute): where unpickling finds it
_home: dict[type, tuple[str, str]] = {}


def release_line(version: str) -> str:
    major, minor = _parse(version)[:2]
    return "1" if major >= 1 else f"0.{min(minor, 1)}"


def outlines_name(key: str, version: str) -> tuple[str, str]:
    """``(module, qualname)`` outlines ``version`` gives the stand-in ``key`` (a ``HOMES`` key)."""
    spec = HOMES[key]
    if not isinstance(spec, str):  # per line: this version's, else the nearest later, else earlier
        at = LINES.index(release_line(version))
        spec = next(spec[line] for line in (*LINES[at:], *reversed(LINES[:at])) if line in spec)
    module, _, qualname = spec.partition(":")
    return module, qualname


def _rename(cls: type, key: str, version: str) -> None:
    module, qualname = outlines_name(key, version)
    if "__reduce_ex__" not in cls.__dict__:
        cls.__reduce_ex__ = _reducer_for(cls)  # type: ignore[method-assign]
    cls.__module__ = module
    cls.__qualname__ = qualname
    cls.__name__ = qualname.rpartition(".")[2]


def adopt(key: str) -> None:
    """Give the already-built stand-in ``key`` outlines' name (lazily built classes call this)."""
    shim_module, _, attr = key.partition(":")
    module = importlib.import_module(f"{_PACKAGE}.{shim_module}")
    cls = vars(module).get(attr)  # never the module's lazy ``__getattr__``: no enum is built here
    if cls is None:
        return
    if cls not in _home:
        _home[cls] = (module.__name__, attr)
        _evaluate_annotations(cls, vars(module))
    _rename(cls, key, api_version())


def _evaluate_annotations(cls: type, namespace: dict) -> None:
    """Replace the class's string annotations (``from __future__ import annotations``) by what
    they name in its tokenrails module: ``typing.get_type_hints`` and pydantic would look the
    strings up in ``sys.modules[cls.__module__]``, which now names an outlines module."""
    hints = cls.__dict__.get("__annotations__") or {}
    for name, value in list(hints.items()):
        if isinstance(value, typing.ForwardRef):  # NamedTuple's spelling of a string annotation
            value = value.__forward_arg__
        if isinstance(value, str):
            try:
                hints[name] = eval(value, dict(namespace), dict(vars(cls)))  # noqa: S307 - the shim's own source
            except Exception:  # noqa: BLE001 - left as written (a name only a type checker knows)
                continue
    for field in (cls.__dict__.get("__dataclass_fields__") or {}).values():
        if isinstance(field.type, str) and field.name in hints:
            field.type = hints[field.name]


def apply() -> None:
    """Name every stand-in as the chosen outlines release does (at import, on ``set_api_version``)."""
    for key in HOMES:
        adopt(key)


on_change(apply)


def stand_ins() -> dict[type, tuple[str, str]]:
    """``{class: (tokenrails module, attribute)}`` of every stand-in named so far."""
    return dict(_home)


# ---- pickling / copying: rebuild from the tokenrails home, never from ``outlines.*`` ----------
def _stand_in(module: str, attr: str) -> type:
    return getattr(importlib.import_module(module), attr)


def _new(module: str, attr: str, *args: Any) -> Any:
    """``copyreg.__newobj__`` for a stand-in named by its tokenrails home."""
    cls = _stand_in(module, attr)
    return cls.__new__(cls, *args)


def _new_ex(module: str, attr: str, args: tuple, kwargs: dict) -> Any:
    """``copyreg.__newobj_ex__`` for a stand-in named by its tokenrails home."""
    cls = _stand_in(module, attr)
    return cls.__new__(cls, *args, **kwargs)


def _call(module: str, attr: str, *args: Any) -> Any:
    """``cls(*args)`` (exceptions' and enum members' reduction) for a stand-in."""
    return _stand_in(module, attr)(*args)


def _reconstruct(module: str, attr: str, base: type, state: Any) -> Any:
    """``copyreg._reconstructor`` (pickle protocols 0 and 1) for a stand-in."""
    return copyreg._reconstructor(_stand_in(module, attr), base, state)  # type: ignore[attr-defined]


def _rehome(reduced: Any, cls: type) -> Any:
    """Replace the class in a reduction tuple by its tokenrails home."""
    if not isinstance(reduced, tuple) or cls not in _home:
        return reduced
    home = _home[cls]
    func, args, *rest = reduced
    if func is cls:
        return (_call, (*home, *args), *rest)
    if func is copyreg.__newobj__ and args and args[0] is cls:
        return (_new, (*home, *args[1:]), *rest)
    if func is copyreg.__newobj_ex__ and args and args[0] is cls:  # type: ignore[attr-defined]
        return (_new_ex, (*home, *args[1:]), *rest)
    if func is copyreg._reconstructor and args and args[0] is cls:  # type: ignore[attr-defined]
        return (_reconstruct, (*home, *args[1:]), *rest)
    return reduced


def _reducer_for(owner: type) -> Callable[[Any, Any], Any]:
    def __reduce_ex__(self: Any, protocol: Any) -> Any:
        reduced = super(owner, self).__reduce_ex__(protocol)
        return _rehome(reduced, type(self)) if type(self) is owner else reduced

    __reduce_ex__.__qualname__ = f"{owner.__qualname__}.__reduce_ex__"
    return __reduce_ex__


__all__ = ["HOMES", "LINES", "adopt", "apply", "outlines_name", "release_line", "stand_ins"]

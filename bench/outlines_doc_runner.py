"""Child process of ``bench/outlines_doc_examples.py``: runs documentation pages' blocks, in order.

    python bench/outlines_doc_runner.py JOB.json RESULTS.jsonl

``JOB.json``: ``{"version", "api": "0.x"|"1.x", "mode": "shim"|"real", "cap", "timeout",
"pages": [{"page", "blocks": [{"ident", "code", "run"}]}]}``. One JSON line per block is appended
to ``RESULTS.jsonl`` as soon as the block ends, so the parent can start a new child after the
block that crashed or hung this one.

The machine, never the example, is adapted: ``import outlines`` is the shim (``mode`` "shim",
installed as ``bench/outlines_shim_plugin.py`` installs it) or outlines itself (``mode`` "real",
its sdist first on ``sys.path``); every Hugging Face hub name loads the embedded SmolLM2 (the
only change to what an example asks for, with ``"cuda"`` devices → CPU: no GPU here); a
generation whose example sets no limit gets at most ``cap`` new tokens, in transformers'
``generate`` and in outlines 0.x's own token loop (an example's own ``max_tokens`` /
``max_new_tokens`` is honoured in full); each generation call of outlines' public API is recorded
with what it asked for and checked (``bench/outlines_doc_validate.py``); each block starts from
torch seed 0 and stops after ``timeout`` seconds. outlines 0.0.x itself gets its KV cache
reordered the way transformers 5 can (``_cache_object_reorder``).
"""
from __future__ import annotations

import ast
import contextlib
import io
import json
import os
import re
import signal
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import outlines_doc_validate as validate  # noqa: E402

RECORDS: list[dict] = []
_DEPTH = threading.local()
CAP_HITS: list[int] = []
RAW: list[str] = []  # digests of the texts a 0.x generator parsed (``format_sequence``), this block
RAW_TEXT: list[str] = []  # the start of the first such text, for reading
OWN_LIMIT_HITS: list[int] = []


class BlockTimeout(Exception):
    pass


def _on_alarm(signum, frame):
    raise BlockTimeout("block timed out")


def _record(api: str, request: tuple[str, Any], output: Any, batched: bool) -> None:
    try:
        reason = validate.check(api, request, output, batched=batched)
    except Exception as exc:  # the oracle itself failed: report, do not hide
        reason = f"unchecked: oracle error {type(exc).__name__}: {exc}"[:200]
    RECORDS.append({"kind": request[0], "ok": reason is None, "unchecked": bool(reason and reason.startswith("unchecked")),
                    "reason": reason, "output": repr(output)[:300], "digest": _digest(output)})


def _digest(output: Any) -> str:
    """A digest of the whole output, so the shim's and outlines' outputs of one block can be
    compared whole (``output`` keeps only the start, for reading)."""
    import hashlib

    return hashlib.sha256(repr(output).encode("utf-8", "replace")).hexdigest()[:16]


CAP: list = [128]  # the bench's cap: new tokens of a generation whose example sets no limit (``--cap``)
_ASKED: list = [None]  # the limit the example passed to the call being run (None: none)


def _limit() -> tuple[int, bool]:
    """The new-token limit of a generation starting now, and whether it is the bench's cap (else
    the example's own ``max_tokens`` / ``max_new_tokens``, honoured in full: it is part of the example)."""
    return (CAP[0], True) if _ASKED[0] is None else (int(_ASKED[0]), False)


def _asked_limit(args: tuple, kwargs: dict, positional: bool = False) -> Any:
    """The example's own limit of one call (``positional``: 0.x ``generator(prompts, max_tokens)``)."""
    limit = kwargs.get("max_tokens", kwargs.get("max_new_tokens"))
    if limit is None and positional and args and isinstance(args[0], int) and not isinstance(args[0], bool):
        limit = args[0]
    return limit if isinstance(limit, int) and not isinstance(limit, bool) else None


VERSION: list = [""]  # the outlines version the job runs (set by ``setup``)


def _seeded(args: tuple, kwargs: dict) -> dict:
    """outlines 0.0.x's token loop draws from a ``torch.Generator`` it seeds from the clock
    (``rng.seed()``) when the call passes none, so its samples differ from run to run and the shim's
    cannot be compared with outlines' own. The bench passes one seeded with 0 instead (every block
    already starts from torch seed 0); a call that passes its own ``rng`` keeps it."""
    if not VERSION[0].startswith("0.0.") or "rng" in kwargs or len(args) >= 3:
        return kwargs
    import torch

    return dict(kwargs, rng=torch.Generator().manual_seed(0))


@contextlib.contextmanager
def _asked(limit: Any):
    previous, _ASKED[0] = _ASKED[0], limit if limit is not None else _ASKED[0]
    try:
        yield
    finally:
        _ASKED[0] = previous


@contextlib.contextmanager
def _outermost():
    depth = getattr(_DEPTH, "n", 0)
    _DEPTH.n = depth + 1
    try:
        yield depth == 0
    finally:
        _DEPTH.n = depth


class _StreamRecorder:
    """Passes a 0.x stream through; at its end checks the joined text of a single prompt."""

    def __init__(self, it, api, request, single, limit=None):
        self._it, self._api, self._request, self._single, self._parts = iter(it), api, request, single, []
        self._limit = limit  # the example's own limit: in force while the stream generates

    def __iter__(self):
        return self

    def __next__(self):
        try:
            with _asked(self._limit):
                part = next(self._it)
        except StopIteration:
            if self._single and all(isinstance(p, str) for p in self._parts):
                kind, spec = self._request
                text = "".join(self._parts)
                if kind in ("regex", "cfg", "text", "choice"):
                    _record(self._api, self._request, text, False)
                else:  # json/format streams are text of a parsed type: check its JSON/text form
                    _record(self._api, ("stream", spec), text, False)
            else:
                RECORDS.append({"kind": "stream", "ok": True, "unchecked": True, "reason": "unchecked: batched stream",
                                "output": ""})
            raise
        self._parts.append(part)
        return part


def _noting_raw(parse):
    """``format_sequence`` that notes the digest of each text it parses (kept when it raises: a
    0.x ``generate.json`` whose text does not validate raises inside outlines' call)."""
    if getattr(parse, "_notes_raw", False):
        return parse

    def format_sequence(text):
        RAW.append(_digest(text))
        if not RAW_TEXT:
            RAW_TEXT.append(repr(text)[:300])
        return parse(text)

    format_sequence._notes_raw = True
    return format_sequence


class RecordedGenerator:
    """A 0.x generator (``generate.json(model, X)``) that records each call's output."""

    def __init__(self, inner, request):
        object.__setattr__(self, "_inner", inner)
        object.__setattr__(self, "_request", request)
        if callable(getattr(inner, "format_sequence", None)):
            self.format_sequence = inner.format_sequence

    def __setattr__(self, name, value):  # ``generator.format_sequence = parse`` (generate.format)
        if name == "format_sequence" and callable(value):
            value = _noting_raw(value)
        setattr(self._inner, name, value)

    def __call__(self, prompts, *args, **kwargs):
        with _outermost() as outer, _asked(_asked_limit(args, kwargs, positional=True)):
            out = self._inner(prompts, *args, **_seeded(args, kwargs))
        if outer:
            batched = isinstance(prompts, list) or isinstance(out, list) and self._request[0] != "json"
            _record("0.x", self._request, out, batched)
        return out

    def stream(self, prompts, *args, **kwargs):
        limit = _asked_limit(args, kwargs, positional=True)
        with _asked(limit):
            stream = self._inner.stream(prompts, *args, **_seeded(args, kwargs))
        return _StreamRecorder(stream, "0.x", self._request, isinstance(prompts, str), limit)

    def __getattr__(self, name):
        return getattr(self._inner, name)


class RecordedGenerator1x:
    """A 1.x ``Generator(model, output_type)`` that records each call's output."""

    def __init__(self, inner, output_type):
        self._inner, self._request = inner, ("output_type", output_type)

    def __call__(self, prompt, *args, **kwargs):
        with _outermost() as outer, _asked(_asked_limit(args, kwargs)):
            out = self._inner(prompt, *args, **kwargs)
        if outer:
            _record("1.x", self._request, out, isinstance(out, list))
        return out

    def batch(self, prompts, *args, **kwargs):
        with _outermost() as outer, _asked(_asked_limit(args, kwargs)):
            out = self._inner.batch(prompts, *args, **kwargs)
        if outer:
            _record("1.x", self._request, out, True)
        return out

    def __getattr__(self, name):
        return getattr(self._inner, name)


def _hook_0x(outlines) -> None:
    gen = outlines.generate
    for kind in ("json", "regex", "choice", "format", "cfg", "text", "fsm"):
        original = getattr(gen, kind, None)
        if not callable(original):
            continue

        def wrapper(model, *args, _original=original, _kind=kind, **kwargs):
            spec = args[0] if args else next((kwargs[k] for k in ("schema_object", "regex_str", "choices",
                                                                   "python_type", "cfg_str") if k in kwargs), None)
            return RecordedGenerator(_original(model, *args, **kwargs), (_kind, spec))

        wrapper.__name__ = kind
        setattr(gen, kind, wrapper)


def _hook_1x(outlines) -> None:
    original = outlines.Generator

    def Generator(model, output_type=None, *args, **kwargs):
        return RecordedGenerator1x(original(model, output_type, *args, **kwargs), output_type)

    outlines.Generator = Generator
    try:
        import outlines.generator as generator_module

        generator_module.Generator = Generator if generator_module.Generator is original else generator_module.Generator
    except ImportError:
        pass
    from outlines.models.transformers import Transformers

    call, batch = Transformers.__call__, Transformers.batch

    def __call__(self, model_input, output_type=None, *args, **kwargs):
        if not isinstance(model_input, (str, list, dict)) and type(model_input).__name__ != "Chat":
            return call(self, model_input, output_type, *args, **kwargs)  # 0.x forward call (tensors)
        with _outermost() as outer, _asked(_asked_limit(args, kwargs)):
            out = call(self, model_input, output_type, *args, **kwargs)
        if outer:
            _record("1.x", ("output_type", output_type), out, isinstance(out, list))
        return out

    def batch_(self, model_input, output_type=None, *args, **kwargs):
        with _outermost() as outer, _asked(_asked_limit(args, kwargs)):
            out = batch(self, model_input, output_type, *args, **kwargs)
        if outer:
            _record("1.x", ("output_type", output_type), out, True)
        return out

    Transformers.__call__, Transformers.batch = __call__, batch_


def _cap_generation() -> None:
    """Every transformers ``generate`` gets at most the limit in force (``_limit``) new tokens; a
    call that ran to it is noted (the bench's cap, or the example's own limit)."""
    import transformers

    inner = transformers.GenerationMixin.generate

    def generate(self, *args, **kwargs):
        limit, capped = _limit()
        if kwargs.get("max_new_tokens") is None or kwargs["max_new_tokens"] > limit:
            kwargs["max_new_tokens"] = limit
            kwargs.pop("max_length", None)
        cap_now = kwargs["max_new_tokens"]
        out = inner(self, *args, **kwargs)
        ids = kwargs.get("input_ids", args[0] if args else None)
        seqs = getattr(out, "sequences", out)
        try:  # a generation that ran to its limit: the bench's cap, or the example's own max_tokens
            if ids is not None and seqs.shape[-1] - ids.shape[-1] >= cap_now:
                (CAP_HITS if capped and cap_now == limit else OWN_LIMIT_HITS).append(cap_now)
        except AttributeError:
            pass
        return out

    transformers.GenerationMixin.generate = generate


def _cap_token_loop() -> None:
    """outlines 0.x's own token loop (``sequence_generator``: what 0.0.x's ``generate.*`` run, in
    outlines 0.0.x and in the shim standing in for it, and what a hand-built ``SequenceGenerator``
    or a sampler of outlines' own protocol runs) never calls transformers' ``generate``, so the cap
    above does not reach it: the loop is cut after the limit in force (``_limit``) steps, noted
    the same way. Patched where the loop is looked up: the module defining it and, in outlines
    0.0.x, ``outlines.generate.api`` which imported it by name."""
    import importlib

    try:
        module = importlib.import_module("outlines.generate.generator")
    except ImportError:  # outlines 1.x: no such loop
        return
    inner = getattr(module, "sequence_generator", None)
    if inner is None:
        return

    def sequence_generator(*args, **kwargs):
        limit, capped = _limit()
        for steps, state in enumerate(inner(*args, **kwargs), start=1):
            if steps >= limit:  # the consumer stops here itself when the limit is the example's own
                (CAP_HITS if capped else OWN_LIMIT_HITS).append(limit)
                yield state
                return
            yield state

    module.sequence_generator = sequence_generator
    api = sys.modules.get("outlines.generate.api") or importlib.import_module("outlines.generate.api")
    if getattr(api, "sequence_generator", None) is inner:
        api.sequence_generator = sequence_generator


def _cache_local_models(local: str) -> None:
    """The embedded model is loaded once per process (the examples load "their" model again and
    again; it is the same file every time)."""
    import transformers

    cls = transformers.AutoModelForCausalLM
    original = cls.from_pretrained.__func__
    cache: dict = {}

    def from_pretrained(klass, name, *args, **kwargs):
        if str(name) == local and not args:
            key = tuple(sorted((k, repr(v)) for k, v in kwargs.items() if k not in ("device_map", "device")))
            if key not in cache:
                cache[key] = original(klass, name, *args, **kwargs)
            return cache[key]
        return original(klass, name, *args, **kwargs)

    cls.from_pretrained = classmethod(from_pretrained)


_CUDA = re.compile(r"""(["'])cuda(:\d+)?\1""")


def adapt_code(code: str) -> str:
    """The only source change besides the hub names (done at load time): CUDA devices → CPU
    (``torch.Generator(device="cuda")``, ``models.transformers(name, device="cuda")``)."""
    return _CUDA.sub('"cpu"', code)


def _datasets_hasher_stand_in() -> None:
    """outlines 0.0.46 imports ``datasets.fingerprint.Hasher`` only to hash a tokenizer for its
    cache key; ``datasets`` would bring pyarrow and pandas. When it is absent, a stand-in with the
    same ``Hasher.hash(obj) -> str`` (a digest of the pickled object) takes its place."""
    import importlib.util
    import types

    if importlib.util.find_spec("datasets") is not None:
        return
    import hashlib

    import cloudpickle

    class Hasher:
        @staticmethod
        def hash(value) -> str:
            return hashlib.sha256(cloudpickle.dumps(value)).hexdigest()[:16]

    package, fingerprint = types.ModuleType("datasets"), types.ModuleType("datasets.fingerprint")
    fingerprint.Hasher = Hasher
    package.fingerprint = fingerprint
    sys.modules.update({"datasets": package, "datasets.fingerprint": fingerprint})


def _pyairports_stand_in() -> None:
    """outlines 0.0.46's ``types.airports`` reads ``pyairports.airports.AIRPORT_LIST`` (rows whose
    4th field is the IATA code). That project is gone from the registry (the name now holds an
    unrelated package, which this bench never installs); the rows are built from
    ``airportsdata`` (what outlines 0.1 switched to) instead."""
    import importlib.util
    import types

    if importlib.util.find_spec("airportsdata") is None or "pyairports" in sys.modules:
        return
    import airportsdata

    rows = [(a["name"], a["city"], a["country"], a["iata"], a["icao"]) for a in airportsdata.load().values()]
    package, airports = types.ModuleType("pyairports"), types.ModuleType("pyairports.airports")
    airports.AIRPORT_LIST = rows
    package.airports = airports
    sys.modules.update({"pyairports": package, "pyairports.airports": airports})


def _cache_object_reorder() -> None:
    """outlines 0.0.x (run itself, ``--real``) reorders the KV cache its model returns as the legacy
    tuple of per-layer tuples (``reorder_kv_cache``); transformers 5 returns a ``Cache`` object,
    whose iteration that function cannot index (every generation fails with ``'NoneType' object
    has no attribute 'device'``). The machine is adapted, not outlines' loop: a ``Cache`` is
    reordered by its own ``reorder_cache`` (the same row selection by ancestors); a tuple still
    goes to outlines' function."""
    import importlib

    module = importlib.import_module("outlines.generate.generator")
    original = module.reorder_kv_cache

    def reorder_kv_cache(kv_cache, ancestors):
        reorder = getattr(kv_cache, "reorder_cache", None)
        if callable(reorder):
            reorder(ancestors)
            return kv_cache
        return original(kv_cache, ancestors)

    module.reorder_kv_cache = reorder_kv_cache


def setup(job: dict) -> str:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    if job["mode"] == "real":  # before torch imports numpy: outlines 0.0.46 needs its numpy < 2
        for path in reversed(job["sys_path"]):
            sys.path.insert(0, path)
        _datasets_hasher_stand_in()
        _pyairports_stand_in()
    import torch

    torch.set_num_threads(1)
    import outlines_shim_plugin as plugin
    from tokenrails.demo_model import resolve_model_dir

    local = str(resolve_model_dir(quiet=True)[0])
    if job["mode"] == "shim":
        from tokenrails.compat.outlines import _install

        _install.install()
        for name, module in list(sys.modules.items()):
            if name == "outlines" or name.startswith("outlines."):
                plugin._guard_module(module)
        sys.meta_path.append(plugin.MissingOutlinesModules())
        if job["api"] == "0.x":  # outlines 0.1's docs import outlines-core 0.1's layout (as its tests do)
            sys.meta_path.append(plugin.OutlinesCoreV01Modules())
    plugin.GENERATION_CAP = 10**9  # our own cap below (it also notes calls that reach it)
    plugin._redirect_hub_names()
    _cache_local_models(local)
    CAP[0], VERSION[0] = int(job["cap"]), job["version"]
    _cap_generation()
    import outlines

    _cap_token_loop()
    if job["mode"] == "real" and job["version"].startswith("0.0."):
        _cache_object_reorder()

    if job["api"] == "0.x":
        _hook_0x(outlines)
    else:
        _hook_1x(outlines)
    return local


def default_model(api: str, local: str):
    """The model a page uses without building one ("assume a model")."""
    import outlines

    if api == "0.x":
        return outlines.models.transformers(local)
    import transformers

    return outlines.from_transformers(transformers.AutoModelForCausalLM.from_pretrained(local),
                                      transformers.AutoTokenizer.from_pretrained(local))


def _error_line(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip().splitlines()
    first = text[0] if text else type(exc).__name__
    tb = traceback.extract_tb(exc.__traceback__)
    where = next((f"{Path(f.filename).name}:{f.lineno}" for f in reversed(tb)
                  if "outlines" in f.filename or "tokenrails" in f.filename), "")
    return (first[:240] + (f" [{where}]" if where else ""))


def run_page(page: dict, job: dict, local: str, out) -> None:
    import torch

    ns: dict = {"__name__": "__main__"}
    failed_before = False
    for block in page["blocks"]:
        result = {"ident": block["ident"], "page": page["page"], "expected_error": block.get("expected_error")}
        if not block["run"]:
            continue
        code = adapt_code(block["code"])
        assumes = set(block.get("assumes", []))
        if "outlines" in assumes and "outlines" not in ns:
            import outlines

            ns["outlines"] = outlines
        RECORDS.clear()
        CAP_HITS.clear()
        OWN_LIMIT_HITS.clear()
        RAW.clear()
        RAW_TEXT.clear()
        torch.manual_seed(0)
        start = time.perf_counter()
        signal.signal(signal.SIGALRM, _on_alarm)
        signal.alarm(int(job["timeout"]))
        error = None
        stdout = io.StringIO()
        try:
            if "model" in assumes and "model" not in ns:
                ns["model"] = default_model(job["api"], local)
                result["assumed_model"] = True
            with contextlib.redirect_stdout(stdout):
                exec(compile(code, block["ident"], "exec", dont_inherit=True), ns)
        except BaseException as exc:  # noqa: BLE001 - every failure of an example is a result
            if isinstance(exc, KeyboardInterrupt):
                raise
            error = exc
        finally:
            signal.alarm(0)
        result.update(seconds=round(time.perf_counter() - start, 2), records=list(RECORDS),
                      cap_hits=len(CAP_HITS), own_limit_hits=OWN_LIMIT_HITS[:1], raw=RAW[:50], raw_text=RAW_TEXT[:1], stdout=stdout.getvalue()[-300:])
        if error is not None:
            result["error"] = _error_line(error)
            result["error_type"] = type(error).__name__
            result["after_failure"] = failed_before
            failed_before = failed_before or type(error).__name__ != block.get("expected_error")
        elif any(not r["ok"] and not r["unchecked"] for r in RECORDS):
            failed_before = True
        out.write(json.dumps(result) + "\n")
        out.flush()


def main() -> None:
    job = json.loads(Path(sys.argv[1]).read_text())
    done = set()
    results = Path(sys.argv[2])
    if results.exists():
        done = {json.loads(line)["ident"] for line in results.read_text().splitlines() if line.strip()}
    local = setup(job)
    import warnings

    warnings.simplefilter("ignore")
    with results.open("a") as out:
        for page in job["pages"]:
            if any(b["ident"] in done for b in page["blocks"]):
                continue  # run before (a page that crashed a process is finished by the parent)
            run_page(page, job, local, out)


if __name__ == "__main__":
    main()

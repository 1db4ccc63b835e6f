"""``tokenrails lmdeploy ...``: LMDeploy's own CLI with the upgrade active in every process.

    tokenrails lmdeploy serve api_server MODEL [lmdeploy options]   # any lmdeploy command
        [--grammar-drafts K]   # draft the tokens the grammar forces, K per step (grammar_drafts.py)
        [--budget close|off]   # close every constrained output within max_tokens (guided/budget.py)
    tokenrails lmdeploy install-hook | uninstall-hook | status

For LMDeploy commands: sets ``TOKENRAILS_LMDEPLOY=1`` (inherited by every child process),
activates in this process, makes sure children start the hook (the installed ``.pth``, or else
a ``sitecustomize`` directory prepended to ``PYTHONPATH``), then runs LMDeploy's CLI in-process.
"""
from __future__ import annotations

import os
import sys

from . import startup
from .boot.inherit import SITECUSTOMIZE_DIR as _SITECUSTOMIZE_DIR

USAGE = __doc__ or ""


def _ensure_children_hooked() -> str:
    """How children get the hook: 'pth' when installed, else prepend the sitecustomize dir."""
    if startup.pth_installed():
        return "pth"
    entries = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if str(_SITECUSTOMIZE_DIR) not in entries:
        os.environ["PYTHONPATH"] = os.pathsep.join([str(_SITECUSTOMIZE_DIR)] + entries)
    return "sitecustomize"


def _status() -> int:
    from . import is_active

    print(f"{startup.ENV_FLAG}={os.environ.get(startup.ENV_FLAG, '')!r} "
          f"pth_installed={startup.pth_installed()} ({startup.site_dir()}) active_here={is_active()}")
    try:
        import lmdeploy

        print(f"lmdeploy {getattr(lmdeploy, '__version__', '?')} importable")
    except ImportError as exc:
        print(f"lmdeploy not importable: {exc}")
        return 1
    return 0


def with_engine_choice(argv: list[str]) -> list[str]:
    """``serve``/``chat`` run the PyTorch engine unless ``--backend`` says otherwise: LMDeploy picks
    TurboMind by default for supported models, and only the PyTorch engine is upgraded (TurboMind
    keeps stock's constraint kinds, see engines.py). Says on stderr which engine runs."""
    if not argv or argv[0] not in ("serve", "chat") or "--help" in argv or "-h" in argv:
        return argv
    chosen = next((a.split("=", 1)[1] for a in argv if a.startswith("--backend=")), None)
    if chosen is None and "--backend" in argv and argv.index("--backend") + 1 < len(argv):
        chosen = argv[argv.index("--backend") + 1]
    if chosen is None:
        argv = argv + ["--backend", "pytorch"]
        chosen = "pytorch"
    note = ("the tokenrails upgrade is active" if chosen == "pytorch" else
            "stock LMDeploy constraint kinds only; other kinds are refused with HTTP 400")
    print(f"tokenrails: LMDeploy engine: {chosen} ({note})", file=sys.stderr)
    return argv


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0
    cmd = argv[0]
    if cmd == "install-hook":
        print(f"installed {startup.install_pth(argv[1] if len(argv) > 1 else None)}")
        return 0
    if cmd == "uninstall-hook":
        removed = startup.uninstall_pth(argv[1] if len(argv) > 1 else None)
        print("removed" if removed else "no hook installed")
        return 0
    if cmd == "status":
        return _status()
    os.environ[startup.ENV_FLAG] = "1"
    _ensure_children_hooked()
    from . import activate
    from .speculative.grammar_drafts import pop_cli_option
    from .boot.settings import pop_budget_option

    argv, drafts = pop_cli_option(argv)
    argv, budget = pop_budget_option(argv)
    activate(grammar_drafts=drafts, budget=budget)
    try:
        from lmdeploy.cli.entrypoint import run
    except ImportError as exc:
        print(f"cannot import LMDeploy's CLI: {exc} (pip install tokenrails[lmdeploy])", file=sys.stderr)
        return 2
    argv = with_engine_choice(argv)
    saved = sys.argv
    sys.argv = ["lmdeploy"] + argv
    try:
        run()
    except SystemExit as exc:  # argparse / LMDeploy exit codes
        return int(exc.code or 0) if not isinstance(exc.code, str) else 1
    finally:
        sys.argv = saved
    return 0

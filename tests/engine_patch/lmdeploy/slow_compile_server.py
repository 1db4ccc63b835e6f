"""A real CPU api_server whose compiles of marked patterns sleep (``slow_compile_site``): the
server-level tests of fairness and deadlines inject their slow compiles through it."""
from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from harness.server_attack import stop_server

from .test_real_server import start_ready

SITE = Path(__file__).with_name("slow_compile_site")


@contextmanager
def slow_compile_server(model_dir: str, log: Path, env: dict[str, str], *args: str,
                        limits: dict) -> Iterator[tuple[str, str]]:
    """(base URL, model id) of a server started with ``env`` (``TOKENRAILS_TEST_SLOW_*``: which
    patterns sleep, for how long) and LMDeploy's ``args``; stopped on exit."""
    path = [str(SITE)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    # Every spec these tests send is a few bytes (compiled in-process, slowed by the site hook): the
    # engine's compile worker processes, booted with it, would only take CPU from the server's start.
    # The compiles still running at exit are the hook's sleeps (abandoned past their deadline), not
    # native calls, which the exit's wait is for (native_threads.py): it held each stop 10-30 s.
    env = {"PYTHONPATH": os.pathsep.join(path), "TOKENRAILS_COMPILE_PROCESSES": "0", "TOKENRAILS_EXIT_WAIT_S": "0",
           **env}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)  # the server's processes inherit them (start_server copies os.environ)
    try:
        proc, base, model_id = start_ready(model_dir, log, *args, limits=limits)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    try:
        yield base, model_id
    finally:
        stop_server(proc)

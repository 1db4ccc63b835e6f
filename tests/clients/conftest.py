"""One upgraded and one stock CPU api_server for the client-library tests, and the side-by-side ledger.

The client tests call the upgraded server through a real client library (openai, instructor,
LangChain, litellm) and assert the object the client itself parsed. With
``TOKENRAILS_TEST_CLIENT_LEDGER=1`` every call also goes to stock LMDeploy, in parallel, and the
calls kept only for comparison are sent too: those outcomes are recorded (the terminal summary
prints the table), never asserted, so the default run starts no stock server and sends none of
them. The servers start once for the package and run with a 2,048-token session, so schema-heavy
client prompts fit. ``TOKENRAILS_TEST_CLIENT_SERVERS=FILE`` points the tests at servers already
running instead (``{"upgraded": {"base": URL, "model": ID}, "stock": {...}}``): a branch's server,
or quick reruns.
"""
from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pytest

# litellm fetches a model price map from the network at import unless told to use its bundled copy
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

SESSION_LEN = 2048
START_TIMEOUT = 240
LEDGER_ON = os.environ.get("TOKENRAILS_TEST_CLIENT_LEDGER") == "1"  # stock side by side, comparison-only calls


@dataclass(frozen=True)
class Server:
    """One running api_server: what a client needs to reach it."""

    name: str
    base: str
    model: str

    @property
    def v1(self) -> str:
        return f"{self.base}/v1"

    def openai(self, **kw: Any):
        """An openai SDK client for this server: no retries (one request per call), long timeout."""
        import openai

        return openai.OpenAI(base_url=self.v1, api_key="none", max_retries=0, timeout=300, **kw)


@dataclass(frozen=True)
class Servers:
    upgraded: Server
    stock: Server | None  # only with the ledger on


@dataclass
class Outcome:
    """What one client call gave: the parsed value, or the exception it raised."""

    value: Any = None
    error: BaseException | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def summary(self) -> str:
        if self.ok:
            return "parsed"
        text = str(self.error).strip().splitlines()[0] if str(self.error).strip() else ""
        return f"{type(self.error).__name__}: {text[:90]}"

    def get(self) -> Any:
        """The value, or the call's own exception re-raised (so pytest shows the client's traceback)."""
        if self.error is not None:
            raise self.error
        return self.value


@dataclass
class Ledger:
    rows: list[tuple[str, Outcome, Outcome]] = field(default_factory=list)


LEDGER = Ledger()


def _attempt(call: Callable[[Server], Any], server: Server) -> Outcome:
    try:
        return Outcome(value=call(server))
    except Exception as exc:  # the client's own error is the outcome
        return Outcome(error=exc)


NOT_SENT = Outcome(error=LookupError("not sent: stock LMDeploy has no such request field"))


def side_by_side(servers: Servers, name: str, call: Callable[[Server], Any], *,
                 with_stock: bool = True) -> tuple[Outcome, Outcome]:
    """``call`` against the upgraded and (with the ledger on, unless ``with_stock=False``) the
    stock server at once; both outcomes go to the ledger."""
    if not with_stock or servers.stock is None:
        upgraded, stock = _attempt(call, servers.upgraded), NOT_SENT
    else:
        with ThreadPoolExecutor(1) as pool:
            stock_future = pool.submit(_attempt, call, servers.stock)
            upgraded = _attempt(call, servers.upgraded)
            stock = stock_future.result()
    LEDGER.rows.append((name, upgraded, stock))
    return upgraded, stock


def _ledger_lines() -> list[tuple[str, str, str, bool, bool]]:
    return [(name, up.summary(), stock.summary(), up.ok, stock.ok) for name, up, stock in LEDGER.rows]


_WORKER_LINES: list = []


def pytest_sessionfinish(session):
    """An xdist worker hands its ledger to the controller, which prints the summary."""
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput["client_ledger"] = _ledger_lines()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    _WORKER_LINES.extend(getattr(node, "workeroutput", {}).get("client_ledger", []))


def pytest_terminal_summary(terminalreporter):
    rows = _ledger_lines() + [tuple(row) for row in _WORKER_LINES]
    if not rows:
        return
    tr = terminalreporter
    tr.section("client libraries: upgraded vs stock LMDeploy (same call, same model)")
    width = max(len(r[0]) for r in rows)
    for name, up, stock, _, _ in rows:
        tr.write_line(f"{name:<{width}}  upgraded: {up:<40}  stock: {stock}")
    served = sum(r[3] for r in rows), sum(r[4] for r in rows)
    tr.write_line(f"parsed by the client: upgraded {served[0]}/{len(rows)}, stock {served[1]}/{len(rows)}")


def _start_both(model: str, logdir) -> tuple[Servers, list]:
    """The servers starting at once (their loads overlap; stock only with the ledger on); a start
    that fails is retried through ``start_ready``, which retries LMDeploy's engine-start manager race only."""
    from tests.engine_patch.lmdeploy.test_real_server import start_ready
    from harness import server_attack as atk

    extra = ("--session-len", str(SESSION_LEN))
    started = {name: atk.start_server(model, logdir / f"{name}.log", stock=name == "stock", extra_args=extra)
               for name in (("upgraded", "stock") if LEDGER_ON else ("upgraded",))}
    procs, ready = [], {}
    try:
        for name, (proc, base) in started.items():
            procs.append(proc)
            model_id = atk.wait_ready(proc, base, START_TIMEOUT)
            if model_id is None and proc.poll() is None:
                pytest.fail(f"{name} api_server not ready after {START_TIMEOUT}s:\n"
                            f"{(logdir / f'{name}.log').read_text()[-4000:]}")
            if model_id is None:
                atk.stop_server(proc)
                proc, base, model_id = start_ready(model, logdir / f"{name}.log", *extra, stock=name == "stock")
                procs.append(proc)
            ready[name] = Server(name, base, model_id)
    except BaseException:
        for proc in procs:
            atk.stop_server(proc)
        raise
    return Servers(ready["upgraded"], ready.get("stock")), procs


@pytest.fixture(scope="package")
def servers(tmp_path_factory):
    """The upgraded and (with the ledger on) the stock CPU api_server (SmolLM2, qwen tool-call
    parser), started once."""
    pytest.importorskip("lmdeploy")
    pytest.importorskip("fastapi")
    pytest.importorskip("openai")
    running = os.environ.get("TOKENRAILS_TEST_CLIENT_SERVERS")
    if running:  # servers a developer already runs: {"upgraded": {"base": ..., "model": ...}, "stock": {...}}
        spec = json.loads(Path(running).read_text())
        yield Servers(*(Server(name, spec[name]["base"], spec[name]["model"]) if name == "upgraded" or LEDGER_ON
                        else None for name in ("upgraded", "stock")))
        return
    from harness import server_attack as atk
    from tokenrails.demo_model import ModelNotFoundError, resolve_model_dir
    try:
        model = str(resolve_model_dir(quiet=True)[0])
    except ModelNotFoundError as exc:
        pytest.skip(str(exc))
    pair, procs = _start_both(model, tmp_path_factory.mktemp("client-servers"))
    try:
        yield pair
    finally:
        for proc in procs:
            atk.stop_server(proc)

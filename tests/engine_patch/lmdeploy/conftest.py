"""Fixtures for the LMDeploy patch tests: skip cleanly without LMDeploy; stock vs upgraded."""
from __future__ import annotations

import os

import pytest

pytest.importorskip("lmdeploy")
pytest.importorskip("lmdeploy.pytorch.engine.logits_process")

from tests.conftest import XDIST_GROUPS  # noqa: E402

from . import harness  # noqa: E402

# Default: the production ladder ("auto"); set the variable to pin one backend.
BACKEND = os.environ.get("TOKENRAILS_TEST_LMDEPLOY_BACKEND", "auto")


@pytest.fixture
def cpu_lmdeploy(monkeypatch):
    harness.stub_cuda(monkeypatch)
    yield


@pytest.fixture
def upgraded():
    """LMDeploy with the tokenrails upgrade active for the test, restored afterwards."""
    import tokenrails.engine_patch.lmdeploy as patch

    patch.activate(backend=BACKEND)
    yield patch
    patch.deactivate()


@pytest.fixture(params=["stock", "tokenrails"])
def mode(request, cpu_lmdeploy):
    """Run a test against stock LMDeploy and against the upgrade."""
    import tokenrails.engine_patch.lmdeploy as patch

    if request.param == "tokenrails":
        patch.activate(backend=BACKEND)
    else:
        patch.deactivate()
    yield request.param
    patch.deactivate()


def _model_dir() -> str:
    from tokenrails.demo_model import ModelNotFoundError, resolve_model_dir
    try:
        path, _, _ = resolve_model_dir(quiet=True)
    except ModelNotFoundError as exc:
        pytest.skip(str(exc))
    return str(path)


@pytest.fixture(scope="module")
def model_dir():
    """The embedded SmolLM2 as a safetensors directory (the demo's cache) for the real engine."""
    return _model_dir()


@pytest.fixture(scope="session")
def shortest():
    """Tokens (EOS included) of the budget record's shortest output (tests/engine_patch/budget_cases.py),
    from the core's table: the budget tests' ``max_tokens`` are set around it."""
    from transformers import AutoTokenizer

    from tokenrails import Vocabulary
    from tokenrails.engine_patch.lmdeploy.server.request_parsing import parse_format
    from tokenrails.guided.budget import budget_table
    from tokenrails.guided.manager import GuidedDecodingManager

    from ..budget_cases import SCHEMA

    fmt = {"type": "json_schema", "json_schema": {"name": "record", "schema": SCHEMA}, "tokenrails_budget": "close"}
    mgr = GuidedDecodingManager(Vocabulary.from_huggingface(AutoTokenizer.from_pretrained(_model_dir())))
    try:
        return budget_table(mgr.get_compiled(parse_format(fmt)[0])).start
    finally:
        mgr.close()


# ---- one engine, one api_server, each for the modules that only send it requests -----------------
# Each group of modules uses one object (the first use starts it) instead of one per module; their
# tests run one after another (pytest_collection_modifyitems; under xdist on one worker: the groups
# are XDIST_GROUPS in tests/conftest.py) and the object stops after the last of them. The server's
# modules start test_real_server.start_ready's defaults; their log checks read what a request added.
SHARED_MODULES = {kind: tuple(path.rsplit("/", 1)[1] for path in XDIST_GROUPS[group])
                  for kind, group in (("engine", "lmdeploy-shared-engine"), ("server", "lmdeploy-shared-api-server"))}
_SHARED: dict = {}  # kind -> (object, stop)


def _stop_shared(kind: str) -> None:
    entry = _SHARED.pop(kind, None)
    if entry is not None:
        entry[1]()


def _start_engine(model_dir: str):
    import torch
    from lmdeploy import pipeline

    from tokenrails.engine_patch.lmdeploy import activate, deactivate
    from tokenrails.engine_patch.lmdeploy.cpu import cpu_engine_config
    torch.set_num_threads(1)
    activate()
    p = pipeline(model_dir, backend_config=cpu_engine_config(max_batch_size=4, session_len=512))

    def stop() -> None:
        p.close()
        deactivate()
    return p, stop


@pytest.fixture
def pipe(model_dir):
    """LMDeploy's real engine on the CPU path with the upgrade active, shared by the ``"engine"``
    modules; the upgrade is activated again (default options) for each test, since a fixture of
    another module may have deactivated it or changed its options meanwhile."""
    from tokenrails.engine_patch.lmdeploy import activate
    if "engine" not in _SHARED:
        _SHARED["engine"] = _start_engine(model_dir)
    activate()
    return _SHARED["engine"][0]


@pytest.fixture
def shared_server(tmp_path_factory, model_dir):
    """(base URL, model id, server process, log path) of the shared upgraded api_server; started on
    first use, again if a test order ran other modules in between."""
    if "server" not in _SHARED:
        from harness.server_attack import stop_server

        from .test_real_server import start_ready
        log = tmp_path_factory.mktemp("shared-server") / "server.log"
        proc, base, model_id = start_ready(model_dir, log)
        _SHARED["server"] = ((base, model_id, proc, log), lambda: stop_server(proc))
    return _SHARED["server"][0]


def pytest_collection_modifyitems(session, config, items):
    """Each group's modules, each in its own order, together where the first of them was."""
    for modules in SHARED_MODULES.values():
        users = [item for item in items if item.path.name in modules]
        if users:
            first = items.index(users[0])
            rest = [item for item in items if item.path.name not in modules]
            items[:] = rest[:first] + users + rest[first:]


def pytest_runtest_teardown(item, nextitem):
    for kind, modules in SHARED_MODULES.items():
        if kind in _SHARED and (nextitem is None or nextitem.path.name not in modules):
            _stop_shared(kind)


def pytest_sessionfinish(session, exitstatus):
    for kind in list(_SHARED):
        _stop_shared(kind)

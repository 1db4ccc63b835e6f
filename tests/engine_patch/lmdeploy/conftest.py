"""Fixtures for the LMDeploy patch tests: skip cleanly without LMDeploy; stock vs upgraded."""
from __future__ import annotations

import os

import pytest

pytest.importorskip("lmdeploy")
pytest.importorskip("lmdeploy.pytorch.engine.logits_process")

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


@pytest.fixture(scope="module")
def model_dir():
    """The embedded SmolLM2 as a safetensors directory (the demo's cache) for the real engine."""
    from tokenrails.demo_model import ModelNotFoundError, resolve_model_dir
    try:
        path, _, _ = resolve_model_dir(quiet=True)
    except ModelNotFoundError as exc:
        pytest.skip(str(exc))
    return str(path)


@pytest.fixture(scope="module")
def pipe(model_dir):
    """LMDeploy's real engine on the CPU path with the upgrade active (one per test module)."""
    import torch
    from lmdeploy import pipeline

    from tokenrails.engine_patch.lmdeploy import activate, deactivate
    from tokenrails.engine_patch.lmdeploy.cpu import cpu_engine_config
    torch.set_num_threads(1)
    activate()
    p = pipeline(model_dir, backend_config=cpu_engine_config(max_batch_size=4, session_len=512))
    yield p
    p.close()
    deactivate()


# ---- one upgraded api_server for the modules that only send it requests --------------------------
# These modules start the same server (``test_real_server.start_ready``'s defaults) and only read it
# (their log checks read what a request added): one start instead of one per module. Their tests run
# one after another (pytest_collection_modifyitems) and the server stops after the last of them.
SHARED_SERVER_MODULES = ("test_body_limits_server.py", "test_real_server.py", "test_request_fields_server.py")
_SHARED: dict = {}


def _stop_shared_server() -> None:
    server = _SHARED.pop("server", None)
    if server is not None:
        from harness.server_attack import stop_server
        stop_server(server[2])


@pytest.fixture
def shared_server(tmp_path_factory, model_dir):
    """(base URL, model id, server process, log path) of the shared upgraded api_server; started on
    first use, again if a test order ran other modules in between."""
    if "server" not in _SHARED:
        from .test_real_server import start_ready
        log = tmp_path_factory.mktemp("shared-server") / "server.log"
        proc, base, model_id = start_ready(model_dir, log)
        _SHARED["server"] = (base, model_id, proc, log)
    return _SHARED["server"]


# Modules that start engines of several processes each (TP ranks, DP replicas, a Ray cluster): under
# xdist one worker runs them one after another, so two never oversubscribe the two cores together.
PROCESS_GROUP_MODULES = ("test_real_engine_tp.py", "test_real_engine_tp_budget.py", "test_cpu_tp_ring.py",
                         "test_activate_once_real.py", "test_proxy_dp.py", "test_inherit.py", "test_cpu_serve.py")


def pytest_collection_modifyitems(session, config, items):
    """The shared server's modules, each in its own order, together where the first of them was;
    under xdist on one worker (one group), like the multi-process modules."""
    for item in items:
        if item.path.name in SHARED_SERVER_MODULES:
            item.add_marker(pytest.mark.xdist_group("lmdeploy-shared-api-server"))
        elif item.path.name in PROCESS_GROUP_MODULES:
            item.add_marker(pytest.mark.xdist_group("lmdeploy-multi-process"))
    users = [item for item in items if item.path.name in SHARED_SERVER_MODULES]
    if users:
        first = items.index(users[0])
        rest = [item for item in items if item.path.name not in SHARED_SERVER_MODULES]
        items[:] = rest[:first] + users + rest[first:]


def pytest_runtest_teardown(item, nextitem):
    if "server" in _SHARED and (nextitem is None or nextitem.path.name not in SHARED_SERVER_MODULES):
        _stop_shared_server()


def pytest_sessionfinish(session, exitstatus):
    _stop_shared_server()

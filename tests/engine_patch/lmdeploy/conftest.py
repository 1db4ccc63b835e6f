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

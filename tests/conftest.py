"""Shared fixtures: a real tokenizer (SmolLM2, committed under tests/fixtures) and its vocabulary."""
from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest
import torch

torch.set_num_threads(1)

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="session")
def smollm2_tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(FIXTURES / "smollm2"))


@pytest.fixture(scope="session")
def vocab(smollm2_tokenizer):
    from tokenrails import Vocabulary

    return Vocabulary.from_huggingface(smollm2_tokenizer)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    """No test may import JAX into the pytest process: JAX starts threads on import and the suite
    forks afterwards (LMDeploy's engines, servers, TP ranks), which JAX warns may deadlock. Tests of
    jax arrays run in a subprocess (tests/compat/test_outlines_internals.py)."""
    had_jax = "jax" in sys.modules
    result = yield
    if not had_jax and "jax" in sys.modules:
        raise AssertionError(f"{item.nodeid} imported jax into the test process; run it in a subprocess")
    return result


def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (the README's ``-n 2 --dist loadgroup``) a worker takes whole groups: by
    default one test module, so a module-scoped engine or server is built once, on one worker.
    Modules that share one fixture (a session's api_server) name their common group themselves
    (``xdist_group``); conftests deeper in the tree run this hook first."""
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::", 1)[0]))


def pytest_collection_finish(session):
    if "jax" in sys.modules:
        import warnings
        warnings.warn("jax was imported while collecting the tests; the suite forks later (see pytest_runtest_call)")


def pytest_sessionfinish(session, exitstatus):
    """Compiles a test abandoned (hostile specs, deadlines) may still run: wait for them here, past
    the product's exit bound, so none returns while the interpreter finalizes (which aborts it)."""
    from tokenrails.guided.native_threads import running, wait_for_native_threads

    pending = running()
    if pending:
        left = wait_for_native_threads(300.0)
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(f"tokenrails: waited for {len(pending)} native thread(s) at session end "
                                f"({', '.join(sorted({t.name for t in pending}))}); {len(left)} still running")

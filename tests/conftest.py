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


@pytest.fixture(scope="session", autouse=True)
def _compile_workers_on_demand():
    """An engine's guided manager boots its compile worker interpreters as it is built, so a real
    engine's first large spec finds one ready; each boot costs ~1.5 s of CPU. The tests build
    hundreds of such managers in their own process and none sends a spec large enough for a
    worker: there the workers start on demand (as after a kill). The api_servers' engines they start
    (other processes) keep the warm start."""
    from tokenrails.guided.compile_procs import ProcessCompiler

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ProcessCompiler, "warm", lambda self: None)
        yield


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


# Test files that share one engine or server beyond their own module (a path, or a folder ending in
# "/"), by group: under pytest-xdist each group goes to one worker as one unit, so the fixture starts
# once; the multi-process modules (TP ranks, DP replicas, a Ray cluster) run one after another, never
# two at once on the two cores. Every other file is a unit of its own (module-scoped engines).
_LMDEPLOY = "tests/engine_patch/lmdeploy/"
XDIST_GROUPS = {
    "client-servers": ("tests/clients/",),  # the package's stock + upgraded api_server pair
    # the shared engine's and the shared api_server's modules (tests/engine_patch/lmdeploy/conftest.py)
    "lmdeploy-shared-engine": tuple(_LMDEPLOY + name for name in (
        "test_deactivate_running.py", "test_real_engine.py", "test_real_engine_budget.py",
        "test_real_engine_cpu_sampling.py", "test_row_waits.py")),
    "lmdeploy-shared-api-server": tuple(_LMDEPLOY + name for name in (
        "test_body_limits_server.py", "test_real_server.py", "test_request_fields_server.py")),
    "lmdeploy-multi-process": tuple(_LMDEPLOY + name for name in (
        "test_real_engine_tp.py", "test_cpu_tp_ring.py", "test_activate_once_real.py",
        "test_proxy_dp.py", "test_inherit.py", "test_cpu_collectives.py")),
}


# Wall seconds of the heaviest units (a group above or a file) in the README's command on a quiet
# 2-core machine, rounded (``--durations=0`` summed per unit; a unit whose tests changed since is
# scaled by its CPU time measured alone, before vs after). The scheduler hands out the heaviest
# unit left first (longest processing time first): xdist's own order, most tests first, left the
# few-test units that start engines and child processes for the end, where one worker ran them
# alone while the other idled. Units not listed weigh 0 and keep xdist's order after these.
UNIT_SECONDS = {
    "lmdeploy-multi-process": 310,
    _LMDEPLOY + "test_grammar_drafts.py": 105,
    _LMDEPLOY + "test_real_engine_kinds.py": 200,
    "lmdeploy-shared-engine": 170,
    "tests/compat/test_outlines_0x_class_token_sets.py": 145,
    "client-servers": 70,
    "tests/compat/test_outlines_class_token_sets.py": 125,
    "lmdeploy-shared-api-server": 135,
    _LMDEPLOY + "test_defects.py": 20,
    _LMDEPLOY + "test_request_deadlines_server.py": 70,
    "tests/compat/test_outlines_fsm_regex.py": 80,
    _LMDEPLOY + "test_tool_thinking.py": 15,
    "tests/compat/test_outlines_stand_in_pickling.py": 65,
    _LMDEPLOY + "test_grammar_drafts_reasoning_tools.py": 60,
    "tests/compat/test_outlines_regex_dialect.py": 55,
    "tests/fsm/test_native_index.py": 50,
    _LMDEPLOY + "test_cpu_serve.py": 50,
    _LMDEPLOY + "test_engine_fairness_server.py": 50,
    _LMDEPLOY + "test_grammar_drafts_server.py": 45,
    _LMDEPLOY + "test_grammar_eagle.py": 45,
    "tests/fsm/test_dfa_native.py": 45,
    _LMDEPLOY + "test_tool_markers.py": 40,
    "tests/guided/test_tool_string_lengths.py": 40,
    _LMDEPLOY + "test_front_check.py": 40,
    "tests/safety/test_hostile_clients.py": 35,
    _LMDEPLOY + "test_draft_usage_server.py": 35,
    _LMDEPLOY + "test_server_attack.py": 35,
    "tests/guided/test_manager.py": 35,
    _LMDEPLOY + "test_budget_server.py": 30,
    _LMDEPLOY + "test_grammar_drafts_ahead.py": 50,
    _LMDEPLOY + "test_real_engine_spec.py": 30,
    "tests/compat/test_outlines_doc_names.py": 30,
    "tests/kernels/test_kernels_cpu.py": 30,
    "tests/safety/test_soak.py": 25,
    "tests/compat/test_outlines_internals.py": 25,
}


def heaviest_unit(units) -> str:
    """The unit of ``units`` (in xdist's order) to start next: the heaviest in ``UNIT_SECONDS``,
    else the first."""
    return max(units, key=lambda unit: UNIT_SECONDS.get(unit, 0))


def xdist_unit(nodeid: str) -> str:
    """The unit of work ``nodeid`` belongs to: its group in ``XDIST_GROUPS``, else its file."""
    path = nodeid.split("::", 1)[0]
    for group, members in XDIST_GROUPS.items():
        if any(path == m or (m.endswith("/") and path.startswith(m)) for m in members):
            return group
    return path


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadfile`` (the README's command) with the groups above, heaviest unit first:
    xdist's own ``xdist_group`` marks are not seen under pytest 9.2 (its worker renames
    ``item._nodeid``, which pytest no longer reads), so the groups are chosen here, from the node ids."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class GroupedFileScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_unit(nodeid)

        def _assign_work_unit(self, node) -> None:
            self.workqueue.move_to_end(heaviest_unit(self.workqueue), last=False)
            super()._assign_work_unit(node)

    return GroupedFileScheduling(config, log)


def pytest_collection_finish(session):
    if "jax" in sys.modules:
        import warnings
        warnings.warn("jax was imported while collecting the tests; the suite forks later (see pytest_runtest_call)")


def pytest_sessionfinish(session, exitstatus):
    """Compiles a test abandoned (hostile specs, deadlines) may still run: wait for them here, past
    the product's exit bound, so none returns while the interpreter finalizes (which aborts it)."""
    from tokenrails.guided.native_threads import running, wait_for_native_threads

    import time

    pending = running()
    if pending:
        started = time.monotonic()
        left = wait_for_native_threads(300.0)
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(f"tokenrails: waited {time.monotonic() - started:.1f} s for {len(pending)} native "
                                f"thread(s) at session end ({', '.join(sorted({t.name for t in pending}))}); "
                                f"{len(left)} still running")

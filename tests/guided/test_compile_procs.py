"""Large compiles in worker processes: results come back usable, a compile past its deadline is
stopped (its process killed, a fresh one takes the next spec), errors come back typed."""
from __future__ import annotations

import json
import os
import time

import pytest

import tokenrails as tr
from tokenrails.guided import compile_procs
from tokenrails.guided.errors import GuideLimitError, GuideTimeoutError
from tokenrails.guided.manager import GuidedDecodingManager
from tokenrails.guided.vocabulary import Vocabulary

PERSON = {"type": "object", "properties": {"name": {"enum": ["Ann", "Bo"]}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}


@pytest.fixture(scope="module")
def byte_vocab() -> Vocabulary:
    """One token per byte plus EOS: a document is accepted byte by byte, an exact oracle."""
    return Vocabulary([bytes([b]) for b in range(256)] + [b"</s>"], eos_ids=(256,), name="bytes")


@pytest.fixture
def every_spec_in_a_worker(monkeypatch):
    monkeypatch.setattr(compile_procs, "PROCESS_MIN_COST", 0)
    import tokenrails.guided.manager as manager_mod

    monkeypatch.setattr(manager_mod, "PROCESS_MIN_COST", 0)


def _accepts(guide, text: str) -> bool:
    m = guide.matcher()
    return all(m.accept_token(b) for b in text.encode()) and m.is_accepting()


@pytest.mark.parametrize("backend", ["xgrammar", "llguidance", "fsm"])
def test_a_guide_compiled_in_a_worker_enforces_its_constraint(byte_vocab, every_spec_in_a_worker, backend):
    mgr = GuidedDecodingManager(byte_vocab, backend=backend, compile_processes=1)
    try:
        guide = mgr.get_compiled(tr.GuideSpec.json_schema(PERSON))
        assert mgr._procs.counters["compiles"] == 1  # it did come from the worker
        good, bad = json.dumps({"name": "Ann", "age": 7}), json.dumps({"name": "Ann"})
        assert _accepts(guide, good) and not _accepts(guide, bad)
        regex = mgr.get_compiled(tr.GuideSpec.regex(r"[a-c]{2}-\d"))
        assert _accepts(regex, "ab-3") and not _accepts(regex, "ad-3")
        with pytest.raises(GuideLimitError):  # the worker's typed error, as in-process
            mgr.get_compiled(tr.GuideSpec.json_schema({"enum": list(range(20_000))}))
    finally:
        mgr.close()


def test_a_compile_past_its_deadline_is_stopped_and_its_worker_replaced(byte_vocab, every_spec_in_a_worker):
    # xgrammar needs seconds for a 10,000-object enum in a tag (about 11 s here): over the 3 s deadline
    tag = {"type": "structural_tag", "triggers": ["<t"], "structures": [
        {"begin": "<t>", "schema": {"enum": [{"k": f"v{i}", "n": i} for i in range(10_000)]}, "end": "</t>"}]}
    from tokenrails.requests import spec_from_request

    mgr = GuidedDecodingManager(byte_vocab, backend="xgrammar", compile_processes=1,
                                limits=tr.GuideLimits(compile_timeout_s=3.0))
    try:
        mgr._procs.compile(tr.GuideSpec.regex("warm"), time.monotonic() + 120)  # the worker has booted
        pid = mgr._procs._idle[0].proc.pid
        start = time.perf_counter()
        with pytest.raises(GuideTimeoutError):
            mgr.get_compiled(spec_from_request(tag))
        assert time.perf_counter() - start < 4.0
        deadline = time.monotonic() + 2
        while (mgr._pool.abandoned or _alive(pid)) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not _alive(pid), "the worker still runs the abandoned compile"
        assert mgr._pool.abandoned == 0  # nothing left running: no abandoned work accumulates
        assert mgr._procs.counters["killed"] == 1
        guide = mgr._procs.compile(tr.GuideSpec.regex("[xy]+"), time.monotonic() + 120)  # a fresh worker
        assert _accepts(guide, "xyx")
    finally:
        mgr.close()


def test_small_specs_stay_in_process(byte_vocab):
    mgr = GuidedDecodingManager(byte_vocab, backend="fsm", compile_processes=1)
    try:
        mgr.get_compiled(tr.GuideSpec.regex("[0-9]{3}"))
        assert mgr._procs.counters["started"] == 0
    finally:
        mgr.close()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


# ---- the on-disk compile cache (compile_store.py) ---------------------------------------------
@pytest.mark.parametrize("backend", ["xgrammar", "llguidance", "fsm"])
def test_compiled_guides_survive_a_restart(byte_vocab, tmp_path, monkeypatch, backend):
    import tokenrails.guided.manager as manager_mod

    monkeypatch.setattr(manager_mod, "STORE_MIN_SECONDS", -1)  # keep even the fastest compile
    spec = tr.GuideSpec.json_schema(PERSON)
    first = GuidedDecodingManager(byte_vocab, backend=backend, cache_dir=str(tmp_path))
    first.get_compiled(spec)
    assert first._store.counters["writes"] == 1
    first.close()
    again = GuidedDecodingManager(byte_vocab, backend=backend, cache_dir=str(tmp_path))  # a restart
    guide = again.get_compiled(spec)
    assert again._store.counters["hits"] == 1
    assert _accepts(guide, json.dumps({"name": "Bo", "age": 41})) and not _accepts(guide, '{"name": "Al"}')
    again.close()


def test_an_entry_of_another_library_version_is_never_loaded(byte_vocab, tmp_path, monkeypatch):
    from tokenrails.guided import compile_store

    import tokenrails.guided.manager as manager_mod

    monkeypatch.setattr(manager_mod, "STORE_MIN_SECONDS", -1)
    spec = tr.GuideSpec.regex("[a-z]{4}")
    GuidedDecodingManager(byte_vocab, backend="fsm", cache_dir=str(tmp_path)).get_compiled(spec)
    monkeypatch.setattr(compile_store, "_versions", lambda: "xgrammar=99.0")  # an upgrade
    upgraded = GuidedDecodingManager(byte_vocab, backend="fsm", cache_dir=str(tmp_path))
    upgraded.get_compiled(spec)
    assert upgraded._store.counters["hits"] == 0


def test_a_corrupt_entry_is_compiled_again(byte_vocab, tmp_path, monkeypatch):
    import tokenrails.guided.manager as manager_mod

    monkeypatch.setattr(manager_mod, "STORE_MIN_SECONDS", -1)
    spec = tr.GuideSpec.regex("[a-z]{5}")
    first = GuidedDecodingManager(byte_vocab, backend="fsm", cache_dir=str(tmp_path))
    first.get_compiled(spec)
    with open(first._store.path(spec), "wb") as f:
        f.write(b"not a numpy file")
    again = GuidedDecodingManager(byte_vocab, backend="fsm", cache_dir=str(tmp_path))
    assert _accepts(again.get_compiled(spec), "abcde")
    assert again._store.counters["unreadable"] == 1


def test_a_large_spec_over_a_limit_is_refused_without_a_worker(byte_vocab):
    """The bounded checks run here first: a refusal does not wait for a worker to boot."""
    grammar = "root ::= " + " | ".join(f'"{chr(97 + i) * 16000}"' for i in range(3))  # 48 KB of literals
    mgr = GuidedDecodingManager(byte_vocab, backend="xgrammar", compile_processes=1)
    try:
        mgr.get_compiled(tr.GuideSpec.grammar('root ::= "warm"'))  # xgrammar's first use (imports, tables)
        start = time.perf_counter()
        with pytest.raises(GuideLimitError, match="max_grammar_literal_bytes"):
            mgr.get_compiled(tr.GuideSpec.grammar(grammar))
        assert time.perf_counter() - start < 1.0
        assert mgr._procs.counters["started"] == 0
    finally:
        mgr.close()


# ---- workers yield the CPU to decoding and give memory back ------------------------------------
def _nice(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[16])


def test_workers_run_below_the_engine_and_one_grown_past_its_bound_is_replaced(byte_vocab, every_spec_in_a_worker):
    mgr = GuidedDecodingManager(byte_vocab, backend="fsm", compile_processes=1)
    mgr._procs.worker_max_rss_mb = 1.0  # every worker is past it after a compile
    try:
        guide = mgr.get_compiled(tr.GuideSpec.regex("[ab]{2}"))
        assert _accepts(guide, "ab") and not _accepts(guide, "ac")
        assert mgr._procs.counters["recycled"] == 1 and mgr._procs.counters["killed"] == 0
        mgr._procs.worker_max_rss_mb = 1e9
        mgr._procs.compile(tr.GuideSpec.regex("x"), time.monotonic() + 120)
        # the idle worker: the one that compiled "x", or the recycled one's replacement, started on a
        # thread and maybe still booting (it lowers its priority once booted, before any compile)
        (worker,) = mgr._procs._idle
        deadline = time.monotonic() + 60
        while _nice(worker.proc.pid) < _nice(os.getpid()) + 10 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _nice(worker.proc.pid) >= _nice(os.getpid()) + 10  # compiles below the engine's priority
    finally:
        mgr.close()


def test_a_manager_dropped_without_close_stops_its_workers(byte_vocab, every_spec_in_a_worker):
    """A manager dropped without ``close`` (LMDeploy's rank manager has none; the step-level tests
    drop hundreds) ends its idle workers with it. They waited on their stdin for the rest of the
    process (subprocess keeps a running child's Popen, pipe included)."""
    import gc

    mgr = GuidedDecodingManager(byte_vocab, backend="fsm", compile_processes=1)
    guide = mgr.get_compiled(tr.GuideSpec.regex("[ab]{2}"))
    assert _accepts(guide, "ab") and mgr._procs.counters["compiles"] == 1
    (worker,) = mgr._procs._idle
    pid = worker.proc.pid
    del mgr, worker, guide
    gc.collect()
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid), "the dropped manager's compile worker still runs"


# ---- nothing left behind: the setup has no name, a forked child releases nothing --------------
_KILLED_PARENT = r"""
import os, signal, sys, time
from tokenrails.guided import compile_procs
from tokenrails.guided.limits import GuideLimits
from tokenrails.guided.vocabulary import Vocabulary
vocab = Vocabulary([bytes([b]) for b in range(256)] + [b"</s>"], eos_ids=(256,), name="bytes")
procs = compile_procs.ProcessCompiler(vocab, "fsm", GuideLimits(), workers=1)
procs.warm()  # a worker started (its setup written), as an engine's manager does
print(procs._idle[0].proc.pid, flush=True)
os.kill(os.getpid(), signal.SIGKILL)  # as a stopped server's group: no close, no atexit
"""


def test_a_killed_process_leaves_no_setup_file(tmp_path):
    """The vocabulary the workers read at boot was a named file in the temporary directory,
    removed only by ``close`` or at a clean exit: every server stopped by a signal left one."""
    import subprocess
    import sys

    env = dict(os.environ, TMPDIR=str(tmp_path), PYTHONPATH=os.pathsep.join(
        [str(__import__("pathlib").Path(tr.__file__).parents[1])] + os.environ.get("PYTHONPATH", "").split(os.pathsep)))
    import signal
    import tempfile

    with tempfile.TemporaryFile() as out:  # not a pipe: the orphaned worker inherits the parent's stderr
        code = subprocess.run([sys.executable, "-c", _KILLED_PARENT], env=env, stdout=out, stderr=out,
                              timeout=120).returncode
        out.seek(0)
        text = out.read().decode(errors="replace")
    assert code == -9, text
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    try:
        os.kill(int(text.split()[0]), signal.SIGKILL)  # the orphan would only boot to read EOF and end
    except ProcessLookupError:
        pass


def test_a_forked_child_leaves_its_parents_workers_alone(byte_vocab, every_spec_in_a_worker):
    """A child forked from a process with a compile manager exits normally (its interpreter runs
    the manager's exit release): the parent's workers and setup stay, and the next compile works."""
    mgr = GuidedDecodingManager(byte_vocab, backend="fsm", compile_processes=1)
    try:
        mgr._procs._give_back(mgr._procs._start())  # a worker started (warm() is off in the tests)
        (worker,) = mgr._procs._idle
        pid = os.fork()
        if pid == 0:  # the child: run the exit-time release as a normal interpreter exit would
            try:
                import atexit

                atexit._run_exitfuncs()
            finally:
                os._exit(0)
        os.waitpid(pid, 0)
        assert worker.proc.poll() is None, "the child's exit killed the parent's compile worker"
        guide = mgr.get_compiled(tr.GuideSpec.regex("[cd]{2}"))  # the worker boots from its setup
        assert _accepts(guide, "cd") and not _accepts(guide, "ab")
        assert mgr._procs.counters["started"] == 1 and mgr._procs.counters["compiles"] == 1
    finally:
        mgr.close()

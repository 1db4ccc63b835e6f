"""Instances of the shim's stand-in classes read as outlines' (``type(x)``, default reprs) and
still pickle and copy (issue 28, "Reprs and class identity").

The classes say ``outlines.models.transformers.Transformers`` etc.; pickle finds a class by that
name, so instances reduce through a reconstructor in tokenrails instead (``_identity.py``). Each
representative instance (outlines_identity_cases.py: models, tokenizers, samplers, inputs,
exceptions, guides, backends, DSL terms, enums...) is built in a fresh process, in each of:

- ``direct``: ``tokenrails.compat.outlines`` used without ``install()``, no outlines importable;
- ``installed``: ``install()`` then ``import outlines``;
- with the real outlines 1.3.3 importable (its sdist, fetched at test time) and imported first,
  the shim used directly or installed (slow: fetches from the package registry).

and must read as outlines (no ``tokenrails`` in its class name or repr), round-trip through
pickle (protocols 0–5; 2–5 for Hugging Face tokenizers), ``copy`` and ``deepcopy``, with pickles
that never name an ``outlines`` module; exceptions are still caught by the shim's classes. Pickles
written in one configuration load in the next (installed -> direct -> real outlines direct ->
real outlines installed). Under ``install()`` the class objects themselves pickle by name.

On main the name and repr checks fail (models, processors, samplers... read as
``tokenrails.compat.outlines...``); the pickling checks pass there too and guard the change.
Cases whose state never pickled (compiled native guides, jinja templates, closures: listed in
``UNPICKLABLE``) are checked for names, reprs and ``copy`` only.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from outlines_identity_cases import HF_TOKENIZER, UNPICKLABLE
from outlines_peer import peer_path

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent


def _run(mode: str, extra_path: str = "", save_to: Path | None = None, load_from: Path | None = None) -> dict:
    code = f"""
        import json, sys
        from outlines_identity_cases import run
        print(json.dumps(run({mode!r}, {str(save_to) if save_to else None!r}, {str(load_from) if load_from else None!r})))
    """
    path = os.pathsep.join(p for p in (str(ROOT), extra_path, str(HERE)) if p)
    env = dict(os.environ, PYTHONPATH=path, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               PYTHONWARNINGS="ignore")
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True,
                          timeout=600, cwd=str(HERE))
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def pickles(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("stand-in-pickles")


@pytest.fixture(scope="module")
def installed(pickles) -> dict:
    return _run("installed", save_to=pickles / "installed.pkl")


@pytest.fixture(scope="module")
def direct(pickles, installed) -> dict:
    return _run("direct", save_to=pickles / "direct.pkl", load_from=pickles / "installed.pkl")


@pytest.fixture(scope="module")
def real_direct(pickles, direct) -> dict:
    report = _run("direct", peer_path("1.3.3"), save_to=pickles / "real_direct.pkl", load_from=pickles / "direct.pkl")
    assert report["real_outlines"] and "outlines-1.3.3" in report["real_outlines"]  # the real one was imported
    return report


@pytest.fixture(scope="module")
def real_installed(pickles, real_direct) -> dict:
    return _run("installed", peer_path("1.3.3"), load_from=pickles / "real_direct.pkl")


def _reads_as_outlines(report: dict) -> list[str]:
    wrong = []
    for name, row in report["cases"].items():
        if not row["type"].startswith("outlines.") or "tokenrails" in row["repr"] or not row["exported"]:
            wrong.append(f"{name}: {row['type']} {row['repr'][:120]}")
    return wrong


def _round_trips(report: dict) -> list[str]:
    wrong = []
    for name, row in report["cases"].items():
        checks = {k: v for k, v in row.items() if k.startswith(("pickle", "deepcopy", "copy", "caught"))}
        if name not in UNPICKLABLE:
            protocols = {f"pickle{p}" for p in range(0 if name not in HF_TOKENIZER else 2, 6)}
            if not protocols <= set(checks) or "deepcopy" not in checks:
                wrong.append(f"{name}: not all round trips ran: {sorted(checks)}")
        wrong += [f"{name} {k}: {v}" for k, v in checks.items() if v is not True]
    return wrong


def _loaded(report: dict) -> list[str]:
    expected = len(report["cases"]) - len(UNPICKLABLE)
    wrong = [f"{name}: {ok}" for name, ok in report["loaded"].items() if ok is not True]
    return wrong if len(report["loaded"]) == expected else wrong + [f"{len(report['loaded'])} of {expected} loaded"]


def test_instances_read_as_outlines_without_install(direct):
    assert len(direct["cases"]) >= 50
    assert _reads_as_outlines(direct) == []


def test_instances_read_as_outlines_after_install(installed):
    assert _reads_as_outlines(installed) == []


def test_pickle_and_copy_round_trip_without_install(direct):
    assert _round_trips(direct) == []


def test_pickle_and_copy_round_trip_after_install(installed):
    assert _round_trips(installed) == []


def test_pickles_of_an_installed_shim_load_without_install(direct):
    assert _loaded(direct) == []


def test_class_objects_pickle_by_name_after_install(installed):
    assert len(installed["classes"]) >= 80
    assert {name: ok for name, ok in installed["classes"].items() if ok is not True} == {}


@pytest.mark.slow  # fetches outlines 1.3.3 from the package registry on first use
def test_a_real_outlines_beside_the_shim_changes_nothing(real_direct, real_installed):
    for report in (real_direct, real_installed):
        assert _reads_as_outlines(report) == []
        assert _round_trips(report) == []
        assert _loaded(report) == []
    assert {name: ok for name, ok in real_installed["classes"].items() if ok is not True} == {}

"""Run the real outlines next to the shim: its sdist fetched from the package registry at test
time (bench/outlines_suites.py's cache; nothing of outlines is in this repository) and imported
in a subprocess, because in this process ``import outlines`` belongs to the shim.

outlines 1.x imports ``genson`` (and ``iso3166`` for country types) at import time; neither is a
tokenrails dependency, so they are installed with pip into a side folder of the same cache (never
into the venv) and put on the subprocess' path. When the registry cannot be reached the caller
gets ``pytest.skip`` with the reason.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
# outlines' runtime imports that the venv lacks, per version line
_SIDE_DEPS = {"1": ["genson", "iso3166"], "0.1": ["genson"], "0.0": []}


def _suites():
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import outlines_suites
    finally:
        sys.path.remove(str(ROOT / "bench"))
    return outlines_suites


def _side_deps(version: str) -> Path | None:
    line = "1" if version.startswith("1.") else version[:3]
    wanted = _SIDE_DEPS.get(line, [])
    if not wanted:
        return None
    target = _suites().CACHE / "side-deps"
    marker = target / (".ok-" + "-".join(wanted))
    if not marker.exists():
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps",
                        "--target", str(target), *wanted], check=True, capture_output=True)
        marker.touch()
    return target


@contextlib.contextmanager
def cache_lock():
    """One process at a time fills the peer cache (pytest-xdist workers, two sessions): a fetch,
    an extraction or a pip install run twice at once into one folder leaves it half-written."""
    cache = _suites().CACHE
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / ".lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def peer_path(version: str) -> str:
    """``PYTHONPATH`` under which ``import outlines`` is outlines ``version`` itself."""
    try:
        with cache_lock():
            root = _suites().package_root(version)
            side = _side_deps(version)
    except (subprocess.CalledProcessError, OSError) as exc:  # registry unreachable
        pytest.skip(f"outlines {version} could not be fetched from the package registry: {exc}")
    parts = [str(root)] + ([str(side)] if side else []) + [str(HERE)]
    return os.pathsep.join(parts)


def run_peer(version: str, code: str, timeout: float = 300) -> object:
    """Run ``code`` under the real outlines ``version``; it must ``print`` one JSON document last."""
    env = dict(os.environ, PYTHONPATH=peer_path(version), OMP_NUM_THREADS="1",
               HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONWARNINGS="ignore")
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True,
                          text=True, timeout=timeout, cwd=str(HERE))
    if done.returncode != 0:
        raise AssertionError(f"outlines {version} subprocess failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])

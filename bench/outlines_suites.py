"""outlines' own test suites against tokenrails' outlines shim (issue 15).

Fetches outlines' source distributions from the package registry at run time (nothing of
outlines is committed here), copies their ``tests/`` (without the ``outlines`` package, so only
the shim can answer ``import outlines``), and runs the in-scope files with pytest and
``bench/outlines_shim_plugin.py`` (shim installed, missing names as placeholders that fail only
their tests, hub names → the embedded SmolLM2). Prints per-file passed/total and totals.

In scope: everything but other inference providers and hardware (llama.cpp, vLLM, MLX,
exllamav2, OpenAI and other API clients, TGI, SGLang, Ollama, LM Studio, vision/multimodal).

    OMP_NUM_THREADS=1 .venv/bin/python bench/outlines_suites.py [--versions 0.0.46,0.1.14,1.3.3]
        [--files PATTERN] [--timeout 900] [--verbose] [--save-reports DIR]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("TOKENRAILS_PEER_CACHE", Path.home() / ".cache" / "tokenrails" / "peer-suites")) / "outlines"
VERSIONS = ["0.0.46", "0.1.14", "1.3.3"]
OUT_OF_SCOPE = re.compile(
    r"llamacpp|llama_cpp|vllm|mlx|exllama|openai|anthropic|anthopic|dottxt|gemini|lmstudio|mistral|ollama|"
    r"sglang|tgi|provider_exceptions|vision|multimodal|"
    r"tests/test_exceptions\.py|"  # 1.x: per-provider (API client) exception mapping
    r"tests/generate/test_api\.py")  # 0.1.x: VisionSequenceGeneratorAdapter only (vision)
# parametrized cases that run another provider or hardware inside an in-scope file
# (and 1.x's black-box generator tests, which drive the vLLM OpenAI-client model with a mocked client)
OUT_OF_SCOPE_PARAM = re.compile(r"\[.*(llamacpp|llama_cpp|exllama|mlx|vllm|vision|openai).*\]|::test_vision|"
                                r"test_generator\.py::(test_black_box|test_async_black_box|test_generator_black_box)")
# outlines' own runtime/test dependencies its tests import (light ones; none pins torch)
TEST_DEPS = ["interegular", "lark", "nest_asyncio", "cloudpickle", "diskcache", "pycountry", "airportsdata",
             "genson", "iso3166", "pytest-mock", "pytest-asyncio", "responses", "pillow", "jax",
             "numba"]  # 0.0.46's tests/fsm/test_regex.py imports it: without it the file is one collection error
# the files issue 15 wants at 100 %
CORE = re.compile(r"tests/(fsm/|types/|processors/)|json_schema|test_types\.py")


def fetch(version: str) -> Path:
    """The extracted sdist of ``outlines==version`` (cached)."""
    CACHE.mkdir(parents=True, exist_ok=True)
    src = CACHE / f"outlines-{version}"
    if not (src / "tests").is_dir():
        archive = CACHE / f"outlines-{version}.tar.gz"
        if not archive.exists():
            subprocess.run([sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps",
                            "--disable-pip-version-check", "-q", f"outlines=={version}", "-d", str(CACHE)],
                           check=True)
        with tarfile.open(archive) as tar:
            tar.extractall(CACHE, filter="data")
    return src


def package_root(version: str) -> Path:
    """The folder holding outlines ``version``'s ``outlines`` package (``src/`` from 1.0 on), to
    put first on ``sys.path`` / ``PYTHONPATH`` and import outlines itself as a peer."""
    src = fetch(version)
    return src / "src" if (src / "src" / "outlines").is_dir() else src


def in_scope_files(src: Path, pattern: str | None) -> list[str]:
    files = sorted(str(p.relative_to(src)) for p in (src / "tests").rglob("test_*.py"))
    files = [f for f in files if not OUT_OF_SCOPE.search(f)]
    return [f for f in files if pattern is None or re.search(pattern, f)]


def run(version: str, pattern: str | None, timeout: float, verbose: bool,
        save_dir: Path | None = None) -> dict[str, dict[str, int]]:
    src = fetch(version)
    files = in_scope_files(src, pattern)
    work = Path(tempfile.mkdtemp(prefix=f"outlines-{version}-"))
    try:
        shutil.copytree(src / "tests", work / "tests")
        (work / "pytest.ini").write_text("[pytest]\n")  # not outlines' own config (warnings as errors...)
        report = work / "report.jsonl"
        env = dict(os.environ, TOKENRAILS_SUITE_REPORT=str(report), OMP_NUM_THREADS="1",
                   PYTHONPATH=os.pathsep.join([str(ROOT / "bench"), str(ROOT), os.environ.get("PYTHONPATH", "")]),
                   HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
        cmd = [sys.executable, "-m", "pytest", *files, "-p", "outlines_shim_plugin", "-q",
               "--continue-on-collection-errors", "--tb=line" if verbose else "--tb=no",
               "-p", "no:cacheprovider", "--rootdir", str(work), "-c", str(work / "pytest.ini")]
        proc = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=timeout)
        if verbose:
            print(proc.stdout[-20000:], proc.stderr[-5000:])
        counts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        for f in files:
            counts[f]  # every in-scope file shows up, even with nothing collected
        if report.exists() and save_dir is not None:
            save_dir.mkdir(parents=True, exist_ok=True)
            shutil.copy(report, save_dir / f"outlines-{version}.jsonl")
        if report.exists():
            for line in report.read_text().splitlines():
                rec = json.loads(line)
                outcome = "out-of-scope" if OUT_OF_SCOPE_PARAM.search(rec["nodeid"]) else rec["outcome"]
                counts[rec["nodeid"].split("::")[0]][outcome] += 1
        return {f: dict(c) for f, c in counts.items()}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def summarize(version: str, counts: dict[str, dict[str, int]]) -> tuple[int, int]:
    total = passed = 0
    core_total = core_passed = 0
    print(f"\n== outlines {version}")
    for f, c in sorted(counts.items()):
        n = sum(v for k, v in c.items() if k not in ("skipped", "out-of-scope"))
        ok = c.get("passed", 0)
        total += n
        passed += ok
        if CORE.search(f):
            core_total += n
            core_passed += ok
        extra = ", ".join(f"{k} {v}" for k, v in sorted(c.items()) if k not in ("passed",))
        print(f"  {f:60s} {ok:4d}/{n:<4d} {extra}")
    pct = 100 * passed / total if total else 0.0
    core_pct = 100 * core_passed / core_total if core_total else 0.0
    print(f"  total: {passed}/{total} ({pct:.0f} %); fsm/json_schema/types/processors: "
          f"{core_passed}/{core_total} ({core_pct:.0f} %)")
    return passed, total


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--versions", default=",".join(VERSIONS))
    ap.add_argument("--files", default=None, help="regex on test file paths")
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--verbose", action="store_true")
    ap.add_argument("--save-reports", type=Path, default=None,
                    help="keep each version's per-test outcomes and error lines (JSON lines) here")
    ap.add_argument("--no-install", action="store_true", help="do not pip-install outlines' test dependencies")
    args = ap.parse_args()
    if not args.no_install:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", *TEST_DEPS],
                       check=True)
    results = {}
    for version in args.versions.split(","):
        counts = run(version, args.files, args.timeout, args.verbose, args.save_reports)
        results[version] = summarize(version, counts)
    print("\n" + json.dumps({v: {"passed": p, "total": t} for v, (p, t) in results.items()}))


if __name__ == "__main__":
    main()

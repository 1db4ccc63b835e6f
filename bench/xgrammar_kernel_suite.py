"""xgrammar's own kernel tests, and vLLM v1's calling pattern, run against ``tokenrails.compat.xgrammar``.

Nothing of xgrammar's is kept in this repository: the script fetches xgrammar's published source
distribution from the package registry at run time (cached under ``~/.cache/tokenrails/peer-suites``),
takes ``tests/python/test_token_bitmask_operations.py`` out of it, and runs it twice in this run:

* ``ours``: xgrammar's kernel entry points (``xgrammar.apply_token_bitmask_inplace``,
  ``allocate_token_bitmask``, ``reset_token_bitmask``, ``get_bitmask_shape`` and
  ``xgrammar.kernels.apply_token_bitmask_inplace_cpu``) replaced by the drop-in through a pytest
  plugin; the plugin counts the drop-in's calls, so a run that never reached it is visible;
* ``xgrammar``: the installed xgrammar unchanged (the peer, for the same counts).

Then vLLM v1's ``apply_grammar_bitmask`` pattern (vllm/v1/structured_output/utils.py, 0.8 - 0.11:
the scheduler's compact bitmask is scattered into a full-batch ``-1`` bitmask, speculative rows
included, and applied with ``indices`` = the structured rows, or ``None`` when every row is
structured) is re-enacted in 8 cases against both, with the expected logits computed by a dense
torch oracle. Finally the CPU apply time of the 128k-vocabulary cases, ours / xgrammar.

    OMP_NUM_THREADS=1 python bench/xgrammar_kernel_suite.py [--version 0.2.8]
"""
from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
import torch  # noqa: E402

torch.set_num_threads(1)

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
CACHE = Path(os.environ.get("TOKENRAILS_PEER_CACHE", Path.home() / ".cache" / "tokenrails" / "peer-suites"))
TEST_FILE = "tests/python/test_token_bitmask_operations.py"

PLUGIN = '''
import os, pytest, torch
TARGET = os.environ["TOKENRAILS_XGR_TARGET"]
CALLS = {"n": 0}

def _counted(fn):
    def wrapper(*a, **k):
        CALLS["n"] += 1
        return fn(*a, **k)
    return wrapper

if TARGET == "ours":
    import xgrammar
    import xgrammar.kernels.apply_token_bitmask_inplace_cpu as xgr_cpu
    from tokenrails.compat import xgrammar as dropin
    for name in ("apply_token_bitmask_inplace", "allocate_token_bitmask", "reset_token_bitmask", "get_bitmask_shape"):
        setattr(xgrammar, name, _counted(getattr(dropin, name)))
    xgr_cpu.apply_token_bitmask_inplace_cpu = _counted(dropin.apply_token_bitmask_inplace_cpu)

@pytest.fixture
def num_parallel_threads():
    return 1  # pytest-run-parallel's fixture; this run is single-threaded

def pytest_terminal_summary(terminalreporter):
    terminalreporter.write_line(f"TOKENRAILS_DROPIN_CALLS={CALLS['n']}")
'''


def fetch_test_file(version: str) -> Path:
    """The test file from xgrammar's sdist, fetched from the registry once and cached."""
    target = CACHE / f"xgrammar-{version}" / TEST_FILE
    if target.exists():
        return target
    sdist = CACHE / f"xgrammar-{version}.tar.gz"
    if not sdist.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        request = urllib.request.Request(
            "https://pypi.org/simple/xgrammar/", headers={"Accept": "application/vnd.pypi.simple.v1+json"}
        )
        files = json.load(urllib.request.urlopen(request, timeout=60))["files"]
        url = next(f["url"] for f in files if f["filename"] == f"xgrammar-{version}.tar.gz")
        urllib.request.urlretrieve(url, sdist)
    with tarfile.open(sdist) as archive:
        archive.extract(f"xgrammar-{version}/{TEST_FILE}", CACHE, filter="data")
    return target


def run_suite(test_file: Path, target: str) -> dict:
    """Run the file under pytest with the plugin; return outcome counts and the drop-in call count."""
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "conftest.py").write_text(PLUGIN)
        (Path(tmp) / test_file.name).write_text(test_file.read_text())
        env = dict(os.environ, TOKENRAILS_XGR_TARGET=target, PYTHONPATH=f"{ROOT}:{os.environ.get('PYTHONPATH', '')}")
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-rfE", "-p", "no:cacheprovider", "--rootdir", tmp, tmp],
            env=env, capture_output=True, text=True, cwd=tmp,
        )
    counts = {"passed": 0, "failed": 0, "skipped": 0, "error": 0}
    calls = 0
    for line in proc.stdout.splitlines():
        if line.startswith("TOKENRAILS_DROPIN_CALLS="):
            calls = int(line.split("=")[1])
        if (" passed" in line or " failed" in line) and ("in " in line):
            for part in line.strip("= ").split(","):
                words = part.split()
                if len(words) >= 2 and words[1].rstrip("s") in ("passed", "failed", "skipped", "error"):
                    counts[words[1].rstrip("s")] += int(words[0])
    failures = [line for line in proc.stdout.splitlines() if line.startswith(("FAILED", "ERROR"))]
    return {"counts": counts, "calls": calls, "failures": failures}


# --- vLLM v1's calling pattern --------------------------------------------------------------------
VLLM_CASES = [
    # (batch, structured rows -> speculative tokens, vocab of logits, vocab of bitmask, dtype)
    (4, {0: 0, 2: 0}, 1000, 1000, torch.float32),
    (4, {0: 0, 1: 0, 2: 0, 3: 0}, 1000, 1000, torch.float32),  # every row structured: indices=None
    (3, {1: 2}, 777, 777, torch.float32),  # one request with two speculative tokens
    (5, {0: 1, 3: 1}, 1024, 1024, torch.bfloat16),
    (2, {1: 0}, 1030, 1000, torch.float32),  # logits padded wider than the tokenizer vocabulary
    (6, {5: 0}, 500, 500, torch.float16),
    (8, {i: 0 for i in range(0, 8, 2)}, 4096, 4096, torch.float32),
    (1, {0: 3}, 64, 64, torch.float32),
]


def vllm_case(xgr, batch: int, structured: dict, logits_vocab: int, mask_vocab: int, dtype) -> bool:
    """One step of vLLM v1's pattern; True iff the logits equal the dense oracle bit for bit."""
    gen = torch.Generator().manual_seed(batch * 7919 + logits_vocab)
    spec_rows = {row: n for row, n in structured.items()}
    # logits rows: each request owns 1 + its speculative tokens, in batch order
    layout, row = {}, 0
    for req in range(batch):
        layout[req] = row
        row += 1 + spec_rows.get(req, 0)
    total = row
    logits = torch.randn(total, logits_vocab, generator=gen).to(dtype)
    words = (mask_vocab + 31) // 32
    compact_rows = sum(1 + n for n in spec_rows.values())
    allowed = torch.rand(compact_rows, mask_vocab, generator=gen) < 0.3
    compact = _pack(allowed, words)
    full = torch.full((total, words), -1, dtype=torch.int32)
    out_indices, cursor = [], 0
    for req in sorted(spec_rows):
        for k in range(1 + spec_rows[req]):
            full[layout[req] + k] = compact[cursor]
            out_indices.append(layout[req] + k)
            cursor += 1
    expected = logits.clone()
    dense = torch.ones(total, logits_vocab, dtype=torch.bool)
    for i, r in enumerate(out_indices):
        dense[r, :mask_vocab] = allowed[i]
    expected[~dense] = float("-inf")
    skip = len(out_indices) == total
    xgr.apply_token_bitmask_inplace(logits, full, indices=None if skip else out_indices,
                                    vocab_size=None if logits_vocab <= 32 * words else mask_vocab)
    return torch.equal(logits.view(torch.int16 if dtype != torch.float32 else torch.int32),
                       expected.view(torch.int16 if dtype != torch.float32 else torch.int32))


def _pack(allowed: torch.Tensor, words: int) -> torch.Tensor:
    padded = torch.zeros(allowed.shape[0], words * 32, dtype=torch.int64)
    padded[:, : allowed.shape[1]] = allowed.to(torch.int64)
    weights = torch.tensor([1 << b for b in range(32)], dtype=torch.int64)
    packed = (padded.view(allowed.shape[0], words, 32) * weights).sum(-1)
    return torch.where(packed >= 1 << 31, packed - (1 << 32), packed).to(torch.int32)


def time_large(xgr, repeat: int = 20) -> float:
    """Median seconds of a 64 x 128k float32 apply with half the rows named by indices."""
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(64, 128000, generator=gen)
    bitmask = torch.randint(-(1 << 31), (1 << 31) - 1, (64, 4000), dtype=torch.int32, generator=gen)
    indices = list(range(0, 64, 2))
    times = []
    for _ in range(repeat + 3):
        work = logits.clone()
        t0 = time.perf_counter()
        xgr.apply_token_bitmask_inplace(work, bitmask, indices=indices)
        times.append(time.perf_counter() - t0)
    return sorted(times[3:])[len(times[3:]) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--version", default="0.2.8", help="xgrammar sdist whose tests to run")
    args = parser.parse_args()
    import xgrammar
    from tokenrails.compat import xgrammar as dropin

    test_file = fetch_test_file(args.version)
    print(f"xgrammar {args.version} {TEST_FILE} (installed xgrammar {importlib.metadata.version('xgrammar')})")
    for target in ("ours", "xgrammar"):
        result = run_suite(test_file, target)
        c = result["counts"]
        ran = c["passed"] + c["failed"] + c["error"]
        print(f"  {target:9s} passed {c['passed']}/{ran}  failed {c['failed']}  errors {c['error']}  "
              f"skipped (CUDA/MLX) {c['skipped']}" + (f"  drop-in calls {result['calls']}" if target == "ours" else ""))
        for line in result["failures"]:
            print(f"      {line}")
    print("vLLM v1 apply_grammar_bitmask pattern (dense oracle, bit-exact):")
    for name, module in (("ours", dropin), ("xgrammar", xgrammar)):
        passed = sum(vllm_case(module, *case) for case in VLLM_CASES)
        print(f"  {name:9s} {passed}/{len(VLLM_CASES)}")
    ours, peer = time_large(dropin), time_large(xgrammar)
    print(f"64 x 128k float32, 32 indexed rows, median apply: ours {ours * 1e6:.0f} us, "
          f"xgrammar {peer * 1e6:.0f} us, ours/xgrammar {ours / peer:.2f}")


if __name__ == "__main__":
    main()

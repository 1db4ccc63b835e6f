"""CPU bitmask-apply benchmark: tokenrails' CPU kernels (the C one and the numpy fallback) vs
xgrammar's C++ CPU kernel vs the reference.

Half the rows of each batch are guided (compact bitmask + indices for us; xgrammar takes a full
bitmask and the same indices). Times are medians of many runs on one thread; native, numpy and
xgrammar runs alternate (so machine noise hits them alike), the reference is timed on its own.
Every implementation gets its own copy of the same logits; the results are checked bit-equal.
"native" is the public entry point ``tokenrails.apply_token_bitmask_inplace`` (argument checks,
dispatch, the C kernel); "numpy" is the same checks + the numpy path, without the dispatch.

    OMP_NUM_THREADS=1 python bench/kernel_apply.py [--vocab 49152 151936] [--batch 1 16 64 256]
        [--masks random grammar allowed] [--dtype float32 bfloat16] [--runs 30] [--no-reference]
        [--fresh 8]

Mask kinds: ``random`` (uniform random bits); ``structural`` (shaped like a real JSON mask at a
structural position: ~0.5% of tokens allowed, scattered); ``instring`` (inside a JSON string: ~3%
of tokens disallowed, scattered); ``grammar`` (rows alternate structural / instring);
``allowed`` (a fresh all-ones bitmask).
"""
from __future__ import annotations

import argparse
import itertools
import os
import statistics
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from tokenrails import native  # noqa: E402
from tokenrails.kernels import (  # noqa: E402
    apply_token_bitmask_inplace,
    apply_token_bitmask_inplace_reference,
    check_apply_args,
)
from tokenrails.kernels.cpu import apply_checked_numpy  # noqa: E402


def mask_rows(kind: str, rows: int, vocab: int, rng: np.random.Generator) -> torch.Tensor:
    """int32 ``[rows, ceil(vocab / 32)]`` bitmask of the given kind."""
    words = (vocab + 31) // 32
    if kind == "random":
        return torch.from_numpy(rng.integers(-(2**31), 2**31, (rows, words)).astype(np.int32))
    if kind == "allowed":
        return torch.full((rows, words), -1, dtype=torch.int32)
    if kind not in ("grammar", "structural", "instring"):
        raise ValueError(kind)
    allowed = np.zeros((rows, 32 * words), dtype=bool)
    for r in range(rows):
        if kind == "structural" or (kind == "grammar" and r % 2 == 0):  # ~0.5% of tokens allowed
            allowed[r, rng.choice(vocab, size=vocab // 200, replace=False)] = True
        else:  # inside a string: most tokens allowed
            allowed[r, :vocab] = True
            allowed[r, rng.choice(vocab, size=vocab * 3 // 100, replace=False)] = False
    packed = np.packbits(allowed, axis=1, bitorder="little").view(np.int32)
    return torch.from_numpy(np.ascontiguousarray(packed))


def interleaved_medians(fns: list, min_runs: int, budget_s: float) -> list:
    """Median seconds per call of each fn, run round-robin so machine noise hits them alike."""
    times: list = [[] for _ in fns]
    for fn in fns:
        fn()  # warm-up (scratch buffers, imports)
    start = time.perf_counter()
    while len(times[0]) < min_runs or (time.perf_counter() - start < budget_s and len(times[0]) < 20 * min_runs):
        for i, fn in enumerate(fns):
            t0 = time.perf_counter()
            fn()
            times[i].append(time.perf_counter() - t0)
    return [statistics.median(t) for t in times]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vocab", type=int, nargs="+", default=[49152, 151936])
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 16, 64, 256])
    parser.add_argument(
        "--masks", nargs="+", default=["random", "grammar", "structural", "instring", "allowed"]
    )
    parser.add_argument("--dtype", nargs="+", default=["float32"], choices=["float32", "float16", "bfloat16"])
    parser.add_argument("--runs", type=int, default=30, help="minimum runs per cell (median)")
    parser.add_argument("--budget", type=float, default=2.0, help="seconds per cell, at least --runs runs")
    parser.add_argument("--no-reference", action="store_true", help="skip the (slow) reference column")
    parser.add_argument(
        "--fresh", type=int, default=1,
        help="cycle through this many different masks per cell (a new mask every call, as in decoding; "
        "1 = one mask, which branch predictors can learn)",
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    import xgrammar as xgr

    if native.load("apply") is None:
        raise SystemExit("tokenrails._apply_native is not built (or TOKENRAILS_NATIVE=0): nothing to compare")
    rng = np.random.default_rng(0)
    print(
        f"torch threads={torch.get_num_threads()}, half the rows guided, {args.fresh} mask(s) per cell; "
        "ms per call (median)"
    )
    header = (
        f"{'dtype':>8} {'vocab':>7} {'batch':>5} {'rows':>4} {'mask':>10} | {'native':>8} {'numpy':>8} "
        f"{'xgrammar':>9} {'reference':>9} | {'nat/xgr':>7} {'np/xgr':>7} {'ref/nat':>8}"
    )
    print(header)
    print("-" * len(header))
    worst = 0.0
    for dtype_name in args.dtype:
        dtype = getattr(torch, dtype_name)
        bits = torch.int32 if dtype == torch.float32 else torch.int16
        for vocab in args.vocab:
            for batch in args.batch:
                guided = list(range(0, batch, 2)) if batch > 1 else [0]
                for kind in args.masks:
                    compacts = [mask_rows(kind, len(guided), vocab, rng) for _ in range(args.fresh)]
                    fulls = []
                    for compact in compacts:
                        fulls.append(torch.full((batch, compact.shape[1]), -1, dtype=torch.int32))
                        fulls[-1][guided] = compact
                    nat_logits = torch.randn(batch, vocab).to(dtype)
                    np_logits, xgr_logits, ref_logits = nat_logits.clone(), nat_logits.clone(), nat_logits.clone()
                    turn = [itertools.cycle(range(args.fresh)) for _ in range(3)]  # same mask sequence each
                    nat, nump, theirs = interleaved_medians(
                        [
                            lambda: apply_token_bitmask_inplace(nat_logits, compacts[next(turn[0])], guided),
                            lambda: apply_checked_numpy(check_apply_args(np_logits, compacts[next(turn[1])], guided)),
                            lambda: xgr.apply_token_bitmask_inplace(
                                xgr_logits, fulls[next(turn[2])], indices=guided, backend="cpu"
                            ),
                        ],
                        args.runs,
                        args.budget,
                    )
                    ref = float("nan")
                    if not args.no_reference:  # timed on its own: its traffic would evict the others' caches
                        (ref,) = interleaved_medians(
                            [lambda: apply_token_bitmask_inplace_reference(ref_logits, compacts[0], guided)],
                            max(3, args.runs // 5),
                            args.budget / 2,
                        )
                        if args.fresh == 1:  # else it saw fewer masks than the others
                            assert torch.equal(nat_logits.view(bits), ref_logits.view(bits))
                    assert torch.equal(nat_logits.view(bits), xgr_logits.view(bits))
                    assert torch.equal(nat_logits.view(bits), np_logits.view(bits))
                    worst = max(worst, nat / theirs)
                    print(
                        f"{dtype_name:>8} {vocab:>7} {batch:>5} {len(guided):>4} {kind:>10} | {nat * 1e3:8.3f} "
                        f"{nump * 1e3:8.3f} {theirs * 1e3:9.3f} {ref * 1e3:9.3f} | {nat / theirs:7.2f} "
                        f"{nump / theirs:7.2f} {ref / nat:8.1f}",
                        flush=True,
                    )
    print(f"worst native/xgrammar: {worst:.2f}")


if __name__ == "__main__":
    main()

"""The C CPU kernel (``tokenrails._apply_native``) against the reference and the numpy path.

Bit-exact on every dtype, shape, stride, index form and mask density; both of its scatter
strategies (gathered two-pass and direct loop) are forced in turn, since which one runs depends
on the call's size. Its own argument checks are tested by calling it with raw pointers.
"""
from __future__ import annotations

import contextlib
import os
import threading

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenrails import native
from tokenrails.kernels import (
    apply_token_bitmask_inplace,
    apply_token_bitmask_inplace_reference,
    check_apply_args,
)
from tokenrails.kernels import cpu as cpu_module
from tokenrails._env import env_lookup

from .cases import DTYPES, MASK_KINDS, bits_equal, make_bitmask, make_logits, mask_row

NATIVE_OFF = not native.enabled()
needs_native = pytest.mark.skipif(NATIVE_OFF, reason="TOKENRAILS_NATIVE=0")
DTYPE_CODE = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
STRATEGIES = {"by-size": 0, "direct": 1, "gathered": 2}
# extra densities: a single zero / a single one bit in an otherwise uniform row
DENSITIES = MASK_KINDS + ("one_zero", "one_one", "sparse_zeros", "sparse_ones")


@needs_native
def test_native_module_is_built():
    """CI must exercise the C kernel: in this checkout it has to be compiled and active."""
    assert native.status()["apply"], "tokenrails._apply_native is not built: run setup.py build_ext --inplace"
    assert native.load("apply") is not None


@pytest.fixture
def module():
    if NATIVE_OFF:
        pytest.skip("TOKENRAILS_NATIVE=0")
    mod = native.load("apply")
    assert mod is not None
    return mod


@contextlib.contextmanager
def forced_strategy(name: str):
    """Force the C kernel's scatter strategy (by-size / direct / gathered) inside the block."""
    mod = native.load("apply")
    previous = mod._set_strategy(STRATEGIES[name])
    try:
        yield
    finally:
        mod._set_strategy(previous)


@pytest.fixture(params=sorted(STRATEGIES))
def strategy(request, module):
    with forced_strategy(request.param):
        yield request.param


def density_row(rng: np.random.Generator, words: int, kind: str) -> np.ndarray:
    if kind in MASK_KINDS:
        return mask_row(rng, words, kind)
    n = 32 * words
    if kind in ("one_zero", "one_one"):
        bits = np.full(n, kind == "one_zero")
        bits[rng.integers(n)] = kind != "one_zero"
    else:  # sparse_zeros / sparse_ones: ~1% of the minority value
        minority = rng.random(n) < 0.01
        bits = ~minority if kind == "sparse_zeros" else minority
    return np.packbits(bits, bitorder="little").view(np.int32).copy()


def run_three_ways(logits: torch.Tensor, bitmask: torch.Tensor, indices, vocab_size) -> None:
    """native == numpy == reference, bits compared on the whole storage of ``logits``."""
    expected = logits.clone()
    apply_token_bitmask_inplace_reference(expected, bitmask, indices, vocab_size)
    numpy_out = logits.clone()
    cpu_module.apply_checked_numpy(check_apply_args(numpy_out, bitmask, indices, vocab_size))
    apply_token_bitmask_inplace(logits, bitmask, indices, vocab_size)
    assert bits_equal(logits, expected)
    assert bits_equal(numpy_out, expected)


def as_indices(rows: list, form: str):
    if form == "list":
        return list(rows)
    if form == "tuple":
        return tuple(rows)
    if form == "numpy":
        return np.array(rows, dtype=np.int64)
    return torch.tensor(rows, dtype=torch.int32 if form == "int32" else torch.int64)


@pytest.mark.parametrize("strategy_name", sorted(STRATEGIES))
@settings(max_examples=150, deadline=None)
@given(
    data=st.data(),
    batch=st.integers(1, 5),
    vocab=st.one_of(st.integers(1, 130), st.integers(131, 5000)),
    extra_cols=st.sampled_from([0, 0, 1, 31, 40]),
    extra_words=st.integers(0, 2),
    row_pad=st.sampled_from([0, 0, 3, 64]),
    dtype=st.sampled_from(DTYPES),
    seed=st.integers(0, 2**32 - 1),
)
def test_matches_reference_and_numpy(
    data, batch, vocab, extra_cols, extra_words, row_pad, dtype, seed, strategy_name
):
    if NATIVE_OFF:
        pytest.skip("TOKENRAILS_NATIVE=0")
    rng = np.random.default_rng(seed)
    width = vocab + extra_cols
    words = (vocab + 31) // 32 + extra_words
    form = data.draw(st.sampled_from(["none", "list", "tuple", "numpy", "int32", "int64"]), label="form")
    if form == "none":
        rows, indices = list(range(batch)), None
    else:  # duplicates allowed: a repeated row gets the AND of its masks
        rows = data.draw(st.lists(st.integers(0, batch - 1), min_size=0, max_size=2 * batch), label="rows")
        indices = as_indices(rows, form)
    kinds = [data.draw(st.sampled_from(DENSITIES), label="density") for _ in rows]
    bitmask = torch.from_numpy(
        np.stack([density_row(rng, words, k) for k in kinds]) if kinds else np.zeros((0, words), np.int32)
    )
    storage = make_logits(rng, batch, width + row_pad, dtype)  # NaN, +-inf, -0.0 sprinkled in
    logits = storage[:, :width]  # rows row_pad elements apart from each other's end
    vocab_size = data.draw(st.sampled_from([None, vocab, max(0, vocab - 5)]), label="vocab_size")
    if vocab_size is None and min(width, 32 * words) != vocab:
        vocab_size = None
    before = storage.clone()
    with forced_strategy(strategy_name):
        run_three_ways(logits, bitmask, indices, vocab_size)
    assert bits_equal(storage[:, width:], before[:, width:])  # the padding is never written
    for row in set(range(batch)) - set(rows):  # rows not named keep every bit
        assert bits_equal(storage[row], before[row])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", DENSITIES)
def test_large_rows_each_density(dtype, kind, strategy):
    """Real-vocabulary widths: whole 512-column blocks, 2048-column chunks, partial last word."""
    rng = np.random.default_rng(len(kind))
    vocab, width = 151936 - 5, 151936 + 64
    words = (vocab + 31) // 32
    bitmask = torch.from_numpy(np.stack([density_row(rng, words, kind) for _ in range(3)]))
    logits = make_logits(rng, 4, width, dtype)
    run_three_ways(logits, bitmask, [3, 0, 3], vocab)


@pytest.mark.parametrize("dtype", DTYPES)
def test_one_dimensional_and_odd_layouts(dtype, strategy):
    rng = np.random.default_rng(1)
    run_three_ways(make_logits(rng, 1, 1000, dtype)[0], make_bitmask(rng, ["random"], 32)[0], None, None)
    wide = make_bitmask(rng, ["in_string", "few_allowed"] * 3, 40)
    run_three_ways(make_logits(rng, 3, 1200, dtype), wide[::2], None, None)  # strided bitmask rows
    columns = torch.from_numpy(np.stack([mask_row(rng, 3, "random") for _ in range(2)]).T.copy()).T
    assert columns.stride(1) != 1  # words not contiguous: the wrapper copies them
    run_three_ways(make_logits(rng, 2, 90, dtype), columns, None, None)
    storage = make_logits(rng, 2, 400, dtype)
    run_three_ways(storage[:, ::2], make_bitmask(rng, ["random", "random"], 7), None, None)


def test_duplicate_rows_get_every_mask(module):
    logits = torch.zeros(2, 64)
    bitmask = torch.tensor([[-1 ^ 1, -1], [-1 ^ 2, -1 ^ 4]], dtype=torch.int32)  # row 1 twice
    apply_token_bitmask_inplace(logits, bitmask, [1, 1])
    assert torch.isinf(logits[1]).nonzero().flatten().tolist() == [0, 1, 34]
    assert not torch.isinf(logits[0]).any()


def test_big_calls_from_many_threads(module):
    """Calls above the GIL-release size, run concurrently, each stay exact."""
    rng = np.random.default_rng(2)
    jobs = [(make_logits(rng, 6, 70000, dtype), make_bitmask(rng, ["random", "in_string", "few_allowed"] * 2, 2188))
            for dtype in DTYPES * 2]
    expected = []
    for logits, bitmask in jobs:
        e = logits.clone()
        apply_token_bitmask_inplace_reference(e, bitmask)
        expected.append(e)
    threads = [threading.Thread(target=apply_token_bitmask_inplace, args=job) for job in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(bits_equal(logits, e) for (logits, _), e in zip(jobs, expected))


def raw_call(module, logits, bitmask, rows=None, itemsize=0, vocab=None, **override):
    args = dict(
        logits_ptr=logits.data_ptr(), logits_rows=logits.shape[0], row_stride=logits.stride(0),
        ncols=logits.shape[1], dtype_code=DTYPE_CODE[logits.dtype], bitmask_ptr=bitmask.data_ptr(),
        bitmask_stride=bitmask.stride(0), bitmask_width=bitmask.shape[1], nmask=bitmask.shape[0],
        rows=rows, rows_itemsize=itemsize, vocab=logits.shape[1] if vocab is None else vocab,
    )
    args.update(override)
    module.apply(*args.values())


RAW_BAD = {
    "index too large (tuple)": dict(rows=(0, 3)),
    "negative index (list)": dict(rows=[0, -1]),
    "index too large (int64 pointer)": dict(rows="int64:0,7", itemsize=8),
    "negative index (int32 pointer)": dict(rows="int32:-2,0", itemsize=4),
    "bad itemsize": dict(rows="int64:0,1", itemsize=2),
    "rows not ints": dict(rows=(0, "1")),
    "rows length": dict(rows=(0,)),
    "dtype code": dict(dtype_code=3),
    "vocab beyond logits": dict(vocab=65),
    "vocab beyond bitmask": dict(vocab=64, bitmask_width=1),
    "negative vocab": dict(vocab=-1),
    "overlapping rows": dict(row_stride=10),
    "null logits": dict(logits_ptr=0),
    "identity rows, wrong count": dict(rows=None),
}


@pytest.mark.parametrize("case", sorted(RAW_BAD))
def test_native_checks_its_own_arguments(module, case):
    """Every size and index is re-checked in C: ValueError, and nothing written."""
    logits = torch.randn(3, 64)
    bitmask = torch.zeros(2, 2, dtype=torch.int32)
    override = dict(RAW_BAD[case])
    keep = None
    if isinstance(override.get("rows"), str):
        kind, values = override["rows"].split(":")
        keep = torch.tensor([int(v) for v in values.split(",")], dtype=getattr(torch, kind))
        override["rows"] = keep.data_ptr()
    rows = override.pop("rows", (0, 1))
    itemsize = override.pop("itemsize", 0)
    before = logits.clone()
    with pytest.raises(ValueError):
        raw_call(module, logits, bitmask, rows, itemsize, **override)
    assert bits_equal(logits, before)


def test_native_raw_call_works(module):
    """The positive control of the test above: the same call with good rows does write."""
    logits = torch.randn(3, 64)
    keep = torch.tensor([2, 0], dtype=torch.int64)
    raw_call(module, logits, torch.zeros(2, 2, dtype=torch.int32), keep.data_ptr(), 8)
    assert torch.isinf(logits[[0, 2]]).all() and torch.isfinite(logits[1]).all()


def test_switch_selects_the_path(module, monkeypatch):
    """TOKENRAILS_NATIVE=0 (read on every call) sends CPU calls to the numpy path, else to C."""
    calls = []
    original = cpu_module.apply_checked_numpy
    monkeypatch.setattr(cpu_module, "apply_checked_numpy", lambda args: calls.append(1) or original(args))
    logits, bitmask = torch.randn(1, 64), torch.zeros(1, 2, dtype=torch.int32)
    apply_token_bitmask_inplace(logits, bitmask)
    assert calls == []
    monkeypatch.setenv(native.NATIVE_ENV, "0")
    apply_token_bitmask_inplace(logits, bitmask)
    assert calls == [1]
    monkeypatch.delenv(native.NATIVE_ENV)
    apply_token_bitmask_inplace(logits, bitmask)
    assert calls == [1]


def test_env_lookup_follows_os_environ(monkeypatch):
    name = "TOKENRAILS_TEST_ENV_LOOKUP"
    lookup = env_lookup(name)
    monkeypatch.delenv(name, raising=False)
    assert lookup() is None
    monkeypatch.setenv(name, "on")
    assert lookup() == "on" == os.environ.get(name)
    monkeypatch.setenv(name, "")
    assert lookup() == ""
    monkeypatch.delenv(name)
    assert lookup() is None


def test_portable_scalar_build_is_exact(tmp_path):
    """The scalar loops that non-GCC/Clang compilers get (-DTR_FORCE_SCALAR) match the reference."""
    import importlib.util
    import shutil
    import subprocess
    import sysconfig
    from pathlib import Path

    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler")
    source = Path(__file__).resolve().parents[2] / "csrc" / "apply_native.c"
    target = tmp_path / f"_apply_native{sysconfig.get_config_var('EXT_SUFFIX')}"
    subprocess.run(
        [compiler, "-O1", "-std=c11", "-fno-strict-aliasing", "-DTR_FORCE_SCALAR", "-fPIC", "-shared",
         f"-I{sysconfig.get_paths()['include']}", str(source), "-o", str(target)],
        check=True, capture_output=True,
    )
    spec = importlib.util.spec_from_file_location("_apply_native", target)
    scalar = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(scalar)
    rng = np.random.default_rng(4)
    for dtype in DTYPES:
        for mode in (1, 2):  # direct, gathered
            scalar._set_strategy(mode)
            vocab, width = 5000 - 3, 5100
            words = (vocab + 31) // 32
            bitmask = torch.from_numpy(np.stack([density_row(rng, words, k) for k in DENSITIES]))
            logits = make_logits(rng, len(DENSITIES) + 1, width, dtype)
            rows = list(range(len(DENSITIES)))[::-1]
            expected = logits.clone()
            apply_token_bitmask_inplace_reference(expected, bitmask, rows, vocab)
            raw_call(scalar, logits, bitmask, tuple(rows), 0, vocab)
            assert bits_equal(logits, expected), (dtype, mode)

"""Grammar-draft verification shapes through LMDeploy's own CUDA attention code, Triton interpreted on CPU.

``triton_shapes_child.py`` (a child process: ``TRITON_INTERPRET=1`` must be set before Triton compiles)
builds a drafts decode step as the engine does and runs LMDeploy 0.18's ``FA3Impl.forward`` on it (its
query-length rule, Triton ``fill_kv_cache``, Triton paged-decode kernel; FA3's CUDA-only kernel carried
out by the Triton paged kernel one query position at a time, see the child's docstring), then compares
every output position with torch's ``scaled_dot_product_attention`` under each row's causal mask.
Padded rows (one bucketed width per step, what ``draft_shapes`` feeds a CUDA device) agree; the ragged
rows of the CPU path do not: LMDeploy's code reads ``total // batch`` as every row's length.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("lmdeploy")
pytest.importorskip("triton")

CHILD = Path(__file__).with_name("triton_shapes_child.py")
ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def cases() -> dict[str, dict]:
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1")
    env.setdefault("PYTHONPATH", str(ROOT))  # the code under test: the caller's, else this checkout
    proc = subprocess.run([sys.executable, str(CHILD)], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = {}
    for line in proc.stdout.splitlines():
        if line.startswith("{"):
            row = json.loads(line)
            out[row["case"]] = row
    return out


@pytest.mark.parametrize("name", ["padded_buckets", "padded_fixed", "padded_fill_crosses_block",
                                  "padded_nothing_forced"])
def test_padded_steps_pass_lmdeploys_attention_exactly(cases, name):
    row = cases[name]
    q = row["q_seqlens"]
    assert len(set(q)) == 1 and row["max_q_seqlen_fa3"] == q[0], row  # FA3's total // batch is every row's length
    assert "error" not in row and row["kv_written"], row
    assert row["wrong_positions"] == 0 and row["max_err"] < 1e-5, row


def test_ragged_steps_are_misread_by_lmdeploys_attention(cases):
    # 4 tokens in rows of 3 and 1: FA3's rule reads "2 per row", attends with the wrong rows' queries
    div = cases["ragged_divisible"]
    assert div["q_seqlens"] == [3, 1] and div["max_q_seqlen_fa3"] == 2, div
    assert div["wrong_positions"] >= 2 and div["max_err"] > 1e-2, div
    # 6 tokens in 4 rows: "1 per row", so the Triton fill writes one token per row (the forced
    # positions' KV is lost) and the Triton paged-decode kernel refuses the query
    ind = cases["ragged_indivisible"]
    assert ind["q_seqlens"] == [3, 1, 1, 1] and ind["max_q_seqlen_fa3"] == 1, ind
    assert not ind["kv_written"], ind
    assert ind["error"].startswith("AssertionError"), ind


def test_triton_decode_kernel_alone_is_not_causal_inside_a_block(cases):
    # why LMDeploy asks for FA3 for speculative decoding: given a [batch, 1 + K] block, its Triton
    # paged-decode kernel lets every position see the whole block (right only for the last one)
    row = cases["triton_decode_block"]
    assert row["err_last"] < 1e-5 and row["err_others"] > 1e-2, row

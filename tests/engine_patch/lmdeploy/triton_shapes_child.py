"""Child process of test_draft_shapes_triton.py: LMDeploy's CUDA attention code on CPU, Triton interpreted.

Run with ``TRITON_INTERPRET=1`` (set before Triton compiles anything, hence a child process). Builds
one grammar-drafts decode step the way the engine does (``pack_rows`` + the step's shaping, then
LMDeploy's own ``_get_q_start_loc`` / ``CudaSequenceMetadata`` / ``build_triton_attention_metadata``),
runs LMDeploy 0.18's FA3 attention implementation (``FA3Impl.forward``: its query-length rule, its
Triton ``fill_kv_cache``, its Triton paged-decode kernel for one-position steps) and compares every
output position with ``torch``'s ``scaled_dot_product_attention`` under the causal mask of the row the
position belongs to. Prints one JSON object per case.

Not interpretable, replaced as stated:
* FA3's ``flash_attn_with_kvcache`` (``lmdeploy.pytorch.third_party.flash_attn_interface``) is a compiled
  CUDA extension, not Triton. Its contract (``q [batch, S, heads, dim]``; query ``j`` of row ``b`` sees the
  cache up to ``cache_seqlens[b] - S + j``) is carried out by LMDeploy's Triton paged-decode kernel called
  once per query position (one-token rows), so the attention arithmetic is still LMDeploy's kernel.
* LMDeploy's Triton varlen flash-attention (``flashattention.py``) uses ``tl.make_block_ptr``, which the
  Triton 3.9 interpreter refuses ("Block pointers have been removed in favor of the tensor descriptor API").

Interpreter shims (kernel bodies unchanged): ``get_device_props`` answers for an sm80 part (it asks
``torch.cuda``), ``is_cuda`` is False, and the modules' aliases ``tl_log2``/``tl_exp2`` (bound to Triton's
builtins at import, which the interpreter only patches on ``tl`` itself) call through ``tl``.
"""
from __future__ import annotations

import importlib
import json
import os
import sys
import types

assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"

import torch  # noqa: E402
import triton.language as tl  # noqa: E402

torch.set_num_threads(1)
HEADS, KV_HEADS, DIM, BLOCK, NUM_BLOCKS, K = 4, 2, 16, 16, 24, 4


def _kernels():
    mod = {n: importlib.import_module(f"lmdeploy.pytorch.kernels.cuda.{n}")
           for n in ("pagedattention", "fill_kv_cache")}
    props = {"multi_processor_count": 4, "compute_capability": (8, 0), "warps_per_sm": 64, "blocks_per_sm": 32}
    pa = mod["pagedattention"]
    pa.get_device_props = lambda *a, **k: props
    pa.is_cuda = lambda: False
    for name in ("tl_log2", "tl_exp2"):
        setattr(pa, name, (lambda f: lambda *a, **k: getattr(tl, f)(*a, **k))(name[3:]))
    return pa.flash_attn_with_kvcache, mod["fill_kv_cache"].fill_kv_cache


PAGED, FILL = _kernels()


def fa3_contract(q, k_cache, v_cache, cache_seqlens, max_seqlen_q, page_table, softmax_scale, causal=True, **_):
    """FA3's ``flash_attn_with_kvcache`` (causal, paged): each of a row's ``S`` queries is a one-token
    decode over the cache up to its own position, run by LMDeploy's Triton paged kernel."""
    assert causal
    batch, s = q.shape[0], q.shape[1]
    rows = torch.arange(batch).repeat_interleave(s)
    offs = torch.arange(s).repeat(batch)
    seqlens = (cache_seqlens.to(torch.long)[rows] - s + 1 + offs).to(torch.int32)
    out = PAGED(q.reshape(batch * s, *q.shape[2:]), k_cache, v_cache, cache_seqlens=seqlens,
                page_table=page_table[rows].contiguous(), max_seqlen_q=1, softmax_scale=softmax_scale)
    return out.reshape(q.shape[:-1] + (out.shape[-1],))


def fa3_impl():
    """LMDeploy's FA3Impl with its methods and Triton kernels, minus the CUDA-only FA3 import."""
    from lmdeploy.pytorch.backends.cuda.attention.default import TritonAttentionImpl
    from lmdeploy.pytorch.backends.cuda.attention.fa3 import FA3Impl

    impl = object.__new__(FA3Impl)
    TritonAttentionImpl.__init__(impl, num_heads=HEADS, head_size=DIM, num_kv_heads=KV_HEADS, causal=True)
    impl.logit_softcapping = 0.0  # as FA3Impl.__init__ sets it
    impl.fill_kv_cache, impl.paged_attention_fwd = FILL, PAGED
    impl.flash_attn_with_kvcache_v3 = fa3_contract
    return impl


def step_inputs(history: list[int], runs: list[int], shape: str):
    """The decode step's ModelInputs as the engine builds them from each row's forced run."""
    from lmdeploy.pytorch.model_inputs import ModelInputs

    from tokenrails.engine_patch.lmdeploy.speculative import adaptive_drafts as ad
    from tokenrails.engine_patch.lmdeploy.speculative import draft_shapes as ds

    step = ad._step_inputs_class()(_pad_token_id=0, _num_spec_tokens=K)
    step.shape_request = shape
    batch = len(runs)
    drafts = torch.full((batch, K), ad.PAD, dtype=torch.long)
    for i, n in enumerate(runs):
        drafts[i, :n] = torch.arange(100 + 10 * i, 100 + 10 * i + n)
    ids, q = ad.pack_rows(torch.arange(1, batch + 1), drafts)
    ids, q = step._shaped(ids, q, max(runs))
    hist = torch.tensor(history)
    gen = torch.Generator().manual_seed(1)
    blocks = torch.randperm(NUM_BLOCKS, generator=gen)[:4 * batch].reshape(batch, 4).to(torch.int32)  # disjoint
    return ModelInputs(input_ids=ids, seq_length=q, history_lengths=hist, block_offsets=blocks, is_decoding=True,
                       num_ignored_history=torch.zeros_like(hist), max_q_seqlen=int(q.max()),
                       max_kv_seqlen=int((hist + q).max()), sum_kv_seqlen=int((hist + q).sum())), ds


def attn_metadata(inputs):
    """LMDeploy's own derivation of the attention metadata from ModelInputs (StepContext.new's rules)."""
    from lmdeploy.messages import QuantPolicy
    from lmdeploy.pytorch.backends.cuda.attention.default import (TritonAttentionMetadata,
                                                                    build_triton_attention_metadata)
    from lmdeploy.pytorch.backends.cuda.step_metadata import CudaSequenceMetadata
    from lmdeploy.pytorch.model_inputs import StepContext

    ctx = types.SimpleNamespace(
        input_ids=inputs.input_ids, is_decoding=True, q_seqlens=inputs.seq_length,
        kv_seqlens=inputs.seq_length + inputs.history_lengths, q_start_loc=StepContext._get_q_start_loc(inputs),
        block_offsets=inputs.block_offsets, max_kv_seqlen=inputs.max_kv_seqlen, sum_kv_seqlen=inputs.sum_kv_seqlen,
        kv_quant_policy=QuantPolicy.NONE, max_q_seqlen=inputs.max_q_seqlen)
    return build_triton_attention_metadata(TritonAttentionMetadata, ctx, CudaSequenceMetadata.from_step_context(ctx))


def reference(query, key, value, k_hist, v_hist, q, hist):
    """Causal attention of each row's queries over its history and this step's keys (torch sdpa)."""
    outs, start = [], 0
    for b in range(q.numel()):
        n, h = int(q[b]), int(hist[b])
        kk = torch.cat([k_hist[b][:h], key[start:start + n]]).repeat_interleave(HEADS // KV_HEADS, 1)
        vv = torch.cat([v_hist[b][:h], value[start:start + n]]).repeat_interleave(HEADS // KV_HEADS, 1)
        mask = torch.arange(h + n)[None, :] <= torch.arange(h, h + n)[:, None]
        o = torch.nn.functional.scaled_dot_product_attention(
            query[start:start + n].transpose(0, 1), kk.transpose(0, 1), vv.transpose(0, 1), attn_mask=mask)
        outs.append(o.transpose(0, 1))
        start += n
    return torch.cat(outs)


def run_case(name: str, history: list[int], runs: list[int], shape: str) -> dict:
    inputs, _ = step_inputs(history, runs, shape)
    q, hist, blocks = inputs.seq_length, inputs.history_lengths, inputs.block_offsets
    total, batch = int(q.sum()), q.numel()
    gen = torch.Generator().manual_seed(7)
    k_cache = torch.zeros(NUM_BLOCKS, BLOCK, KV_HEADS, DIM)
    v_cache = torch.zeros_like(k_cache)
    k_hist = torch.randn(batch, 64, KV_HEADS, DIM, generator=gen)
    v_hist = torch.randn(batch, 64, KV_HEADS, DIM, generator=gen)
    for b in range(batch):
        # history, then stale KV past it (what an earlier padded step's fillers left): the step must
        # write over its own positions and attend to nothing past kv_seqlen
        pos = torch.arange(4 * BLOCK)
        stale = 100 * torch.randn(4 * BLOCK, KV_HEADS, DIM, generator=gen)
        live = (pos < int(hist[b]))[:, None, None]
        k_cache[blocks[b].long()[pos // BLOCK], pos % BLOCK] = torch.where(live, k_hist[b], stale)
        v_cache[blocks[b].long()[pos // BLOCK], pos % BLOCK] = torch.where(live, v_hist[b], stale)
    query = torch.randn(total, HEADS, DIM, generator=gen)
    key = torch.randn(total, KV_HEADS, DIM, generator=gen)
    value = torch.randn(total, KV_HEADS, DIM, generator=gen)
    meta = attn_metadata(inputs)
    impl = fa3_impl()
    result = {"case": name, "q_seqlens": q.tolist(), "max_q_seqlen_fa3": impl._get_max_q_seqlen(query, meta)}
    # the KV this step must write: each row's positions hist .. hist + q - 1
    start, cache_ok = 0, True
    try:
        out = impl.forward(query, key, value, k_cache, v_cache, meta)
    except Exception as exc:  # noqa: BLE001 - the case reports what LMDeploy's code did
        result["error"] = f"{type(exc).__name__}: {exc}"
        out = None
    for b in range(batch):
        pos = torch.arange(int(hist[b]), int(hist[b]) + int(q[b]))
        got = k_cache[blocks[b].long()[pos // BLOCK], pos % BLOCK]
        cache_ok &= bool(torch.equal(got, key[start:start + int(q[b])]))
        start += int(q[b])
    result["kv_written"] = cache_ok
    if out is not None:
        ref = reference(query, key, value, k_hist, v_hist, q, hist)
        out = out.reshape(total, HEADS, DIM)
        err = (out - ref).abs().amax(dim=(1, 2))
        result["max_err"] = float(err.max())
        result["wrong_positions"] = int((err > 1e-4).sum())
    return result


def raw_triton_decode_on_a_block() -> dict:
    """LMDeploy's Triton paged-decode kernel given the padded step's [batch, 1 + K] block directly (what
    its non-FA3 decode path would do with it): not causal inside the block, so not a verifier."""
    inputs, _ = step_inputs([5, 17, 9], [2, 0, 1], "buckets")
    q, hist, blocks = inputs.seq_length, inputs.history_lengths, inputs.block_offsets
    gen = torch.Generator().manual_seed(3)
    total, batch = int(q.sum()), q.numel()
    k_hist = torch.randn(batch, 64, KV_HEADS, DIM, generator=gen)
    v_hist = torch.randn(batch, 64, KV_HEADS, DIM, generator=gen)
    key = torch.randn(total, KV_HEADS, DIM, generator=gen)
    value = torch.randn(total, KV_HEADS, DIM, generator=gen)
    query = torch.randn(total, HEADS, DIM, generator=gen)
    k_cache = torch.zeros(NUM_BLOCKS, BLOCK, KV_HEADS, DIM)
    v_cache = torch.zeros_like(k_cache)
    start = 0
    for b in range(batch):
        n = int(hist[b]) + int(q[b])
        pos = torch.arange(n)
        k_cache[blocks[b].long()[pos // BLOCK], pos % BLOCK] = torch.cat([k_hist[b][:int(hist[b])],
                                                                         key[start:start + int(q[b])]])
        v_cache[blocks[b].long()[pos // BLOCK], pos % BLOCK] = torch.cat([v_hist[b][:int(hist[b])],
                                                                         value[start:start + int(q[b])]])
        start += int(q[b])
    out = PAGED(query, k_cache, v_cache, cache_seqlens=(hist + q).to(torch.int32), page_table=blocks,
                max_seqlen_q=int(q[0]))
    err = (out - reference(query, key, value, k_hist, v_hist, q, hist)).abs().amax(dim=(1, 2))
    last = torch.zeros(total, dtype=torch.bool)
    last[q.cumsum(0) - 1] = True
    return {"case": "triton_decode_block", "q_seqlens": q.tolist(), "err_last": float(err[last].max()),
            "err_others": float(err[~last].min())}


if __name__ == "__main__":
    cases = [
        # padded (what runs on CUDA): runs 2, 0, 1 with k = 4 -> one width 2 -> 3 positions per row
        ("padded_buckets", [5, 17, 9], [2, 0, 1], "buckets"),
        ("padded_fixed", [5, 17, 9], [2, 0, 1], "fixed"),
        ("padded_fill_crosses_block", [14, 30], [3, 4], "buckets"),
        ("padded_nothing_forced", [5, 17, 9], [0, 0, 0], "buckets"),  # width 0: a plain decode
        # ragged (the CPU path's shapes) through the same code
        ("ragged_divisible", [5, 17], [2, 0], "adaptive"),  # 4 tokens / 2 rows: "2 each"
        ("ragged_indivisible", [5, 17, 9, 3], [2, 0, 0, 0], "adaptive"),  # 6 tokens / 4 rows: "1 each"
    ]
    for case in cases:
        print(json.dumps(run_case(*case)), flush=True)
    print(json.dumps(raw_triton_decode_on_a_block()), flush=True)
    sys.exit(0)

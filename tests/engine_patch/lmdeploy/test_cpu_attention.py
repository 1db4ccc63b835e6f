"""The CPU path's paged attention against torch's reference attention, per row and position."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("lmdeploy")
torch = pytest.importorskip("torch")


@pytest.mark.parametrize("window", [None, 40])
def test_paged_attention_matches_reference_for_decode_and_multi_position_rows(window):
    """Rows of one, two and four query positions (a decode row, drafts being verified) over a
    paged GQA cache: every output position equals causal (optionally windowed) attention over the
    row's history computed by ``scaled_dot_product_attention``."""
    from tokenrails.engine_patch.lmdeploy.cpu.attention import CpuPagedAttentionImpl

    gen = torch.Generator().manual_seed(0)
    heads, kv_heads, dim, block = 6, 2, 16, 8
    impl = CpuPagedAttentionImpl.__new__(CpuPagedAttentionImpl)
    impl.num_heads, impl.num_kv_heads, impl.v_head_size, impl.scale = heads, kv_heads, dim, dim ** -0.5
    impl.logit_softcapping, impl.causal, impl.sliding_window = None, True, window
    q_lens, kv_lens = [1, 2, 4, 1], [13, 30, 9, 64]
    blocks = torch.randperm(40, generator=gen).reshape(4, 10)  # each row's blocks, scattered
    k_cache = torch.randn(40, block, kv_heads, dim, generator=gen)
    v_cache = torch.randn(40, block, kv_heads, dim, generator=gen)
    query = torch.randn(sum(q_lens), heads, dim, generator=gen)
    starts = [sum(q_lens[:i]) for i in range(len(q_lens))]
    meta = SimpleNamespace(q_start_loc=torch.tensor(starts), q_seqlens=torch.tensor(q_lens),
                           kv_seqlens=torch.tensor(kv_lens), block_offsets=blocks)
    out = impl.forward(query, None, None, k_cache, v_cache, meta)
    for b, (start, qlen, kvlen) in enumerate(zip(starts, q_lens, kv_lens)):
        pos = torch.arange(kvlen)
        k = k_cache[blocks[b][pos // block], pos % block].transpose(0, 1).repeat_interleave(heads // kv_heads, 0)
        v = v_cache[blocks[b][pos // block], pos % block].transpose(0, 1).repeat_interleave(heads // kv_heads, 0)
        qpos = torch.arange(kvlen - qlen, kvlen)[:, None]
        allowed = pos[None, :] <= qpos
        if window:
            allowed &= pos[None, :] > qpos - window
        ref = torch.nn.functional.scaled_dot_product_attention(query[start:start + qlen].transpose(0, 1), k, v,
                                                               attn_mask=allowed)
        assert torch.allclose(out[start:start + qlen], ref.transpose(0, 1), atol=1e-5), (b, qlen)

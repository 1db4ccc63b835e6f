"""Torch-native paged attention and KV-cache fill for LMDeploy's PyTorch engine on CPU.

Layout follows LMDeploy's ``default`` backend block shapes: ``k_cache[num_blocks, block_size,
kv_heads, head_dim]``. Queries are packed (``[total_q, heads, dim]``) with ``q_start_loc``/``q_seqlens``;
``kv_seqlens`` counts the cached history plus this step's tokens. Written for clarity over speed.
"""
from __future__ import annotations

import torch
from lmdeploy.pytorch.backends.attention import AttentionImpl, AttentionMetadata


def fill_kv_cache(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                  meta: AttentionMetadata) -> None:
    """Write this step's keys/values into their sequence's blocks, after the cached history."""
    block_size = k_cache.size(1)
    q_start = meta.q_start_loc.tolist()
    q_lens = meta.q_seqlens.tolist()
    kv_lens = meta.kv_seqlens.tolist()
    for b, (start, qlen, kvlen) in enumerate(zip(q_start, q_lens, kv_lens)):
        if qlen == 0:
            continue
        pos = torch.arange(kvlen - qlen, kvlen)
        blocks = meta.block_offsets[b].to(torch.long)[pos // block_size]
        offs = pos % block_size
        k_cache[blocks, offs] = key[start:start + qlen].to(k_cache.dtype)
        v_cache[blocks, offs] = value[start:start + qlen].to(v_cache.dtype)


def _gather(cache: torch.Tensor, block_offsets: torch.Tensor, kvlen: int) -> torch.Tensor:
    block_size = cache.size(1)
    nblocks = (kvlen + block_size - 1) // block_size
    blocks = block_offsets[:nblocks].to(torch.long)
    return cache[blocks].flatten(0, 1)[:kvlen]


class CpuPagedAttentionImpl(AttentionImpl[AttentionMetadata]):
    """Causal (optionally sliding-window) GQA attention over the paged cache, one sequence at a time."""

    def forward(self, query, key, value, k_cache, v_cache, attn_metadata, k_scales_zeros=None,
                v_scales_zeros=None, learnable_sink=None, nsa_indices=None, inplace=False):
        if key is not None:
            fill_kv_cache(key, value, k_cache, v_cache, attn_metadata)
        out = query.new_empty(query.shape[:-1] + (self.v_head_size, ))
        group = self.num_heads // self.num_kv_heads
        meta = attn_metadata
        for b, (start, qlen, kvlen) in enumerate(
                zip(meta.q_start_loc.tolist(), meta.q_seqlens.tolist(), meta.kv_seqlens.tolist())):
            if qlen == 0:
                continue
            q = query[start:start + qlen].transpose(0, 1).float()  # [H, q, D]
            k = _gather(k_cache, meta.block_offsets[b], kvlen).transpose(0, 1).float()  # [KH, kv, D]
            v = _gather(v_cache, meta.block_offsets[b], kvlen)[..., :self.v_head_size].transpose(0, 1).float()
            if group > 1:
                k = k.repeat_interleave(group, dim=0)
                v = v.repeat_interleave(group, dim=0)
            scores = torch.matmul(q, k.transpose(1, 2)) * self.scale
            if self.logit_softcapping:
                scores = torch.tanh(scores / self.logit_softcapping) * self.logit_softcapping
            window = self.sliding_window
            if isinstance(window, (tuple, list)):
                window = window[0]
            windowed = window is not None and window > 0
            # a one-token query is the last position: the causal mask hides nothing, so it is not built
            if windowed or (self.causal and qlen > 1):
                qpos = torch.arange(kvlen - qlen, kvlen).unsqueeze(1)
                kpos = torch.arange(kvlen).unsqueeze(0)
                mask = kpos > qpos if self.causal else torch.zeros_like(kpos > qpos)
                if windowed:
                    mask = mask | (kpos < qpos - window + 1)
                scores = scores.masked_fill(mask, float('-inf'))
            probs = torch.softmax(scores, dim=-1)
            out[start:start + qlen] = torch.matmul(probs, v).transpose(0, 1).to(out.dtype)
        return out

"""``CpuOpsBackend``: LMDeploy's ``default`` ops backend plus torch-native paged attention.

Everything LMDeploy already implements in plain torch (activation, rotary, norm, linear, embedding)
comes from ``DefaultOpsBackend`` unchanged; attention and the step metadata it needs are added here,
and multinomial sampling is replaced (the default one draws zero-probability tokens in float16 and
ignores seeds: see sampling.py).
"""
from __future__ import annotations

from typing import cast

from lmdeploy.pytorch.backends.attention import AttentionMetadata, PagedAttentionBuildSpec
from lmdeploy.pytorch.backends.base import BuildSpec, ImplT
from lmdeploy.pytorch.backends.multinomial_sampling import MultinomialSamplingBuildSpec
from lmdeploy.pytorch.backends.default.op_backend import DefaultOpsBackend


class CpuOpsBackend(DefaultOpsBackend):
    """Ops for ``device_type='cpu'``."""

    @staticmethod
    def get_name() -> str:
        return 'cpu'

    @classmethod
    def build_op(cls, spec: BuildSpec[ImplT], *, enable_deterministic: bool = False) -> ImplT:
        if isinstance(spec, PagedAttentionBuildSpec):
            from .attention import CpuPagedAttentionImpl
            if spec.use_flash_mla or spec.learnable_sink or spec.alibi:
                raise RuntimeError('cpu backend: MLA, learnable sinks and ALiBi are not implemented')
            return cast(ImplT, CpuPagedAttentionImpl(
                spec.num_heads, spec.head_dim, scale=spec.scale, num_kv_heads=spec.num_kv_heads,
                v_head_size=spec.v_head_dim, sliding_window=spec.sliding_window,
                logit_softcapping=spec.logit_softcapping, causal=spec.causal))
        if isinstance(spec, MultinomialSamplingBuildSpec):
            from .sampling import CpuMultinomialSamplingImpl
            return cast(ImplT, CpuMultinomialSamplingImpl())
        return super().build_op(spec, enable_deterministic=enable_deterministic)

    @staticmethod
    def ccl_backend() -> str:
        """Tensor-parallel collectives on CPU tensors: gloo (LMDeploy's default is nccl)."""
        return 'gloo'

    @staticmethod
    def get_attention_metadata_cls():
        return AttentionMetadata

    @classmethod
    def get_cache_backend(cls):
        from lmdeploy.pytorch.backends.default.cache import DefaultCacheBackend
        return DefaultCacheBackend

    @classmethod
    def update_step_context(cls, step_context):
        """Attention metadata straight from the step: starts, lengths, block tables."""
        step_context.attn_metadata = AttentionMetadata(
            is_decoding=step_context.is_decoding,
            block_offsets=step_context.block_offsets,
            q_start_loc=step_context.q_start_loc,
            q_seqlens=step_context.q_seqlens,
            kv_seqlens=step_context.kv_seqlens,
            quant_policy=step_context.kv_quant_policy,
        )
        return step_context

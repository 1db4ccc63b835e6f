"""A random-weight EAGLE draft for a Llama-architecture target, for speculative decoding on CPU.

No trained draft ships with the embedded SmolLM2, and the verification path does not need one:
LMDeploy's rejection sampler keeps the target's distribution whatever the draft proposes (greedy:
exactly the target's tokens). A draft of random weights proposes mostly-rejected tokens, except
where the grammar's mask leaves one choice, so it exercises drafting, masking, acceptance and
rollback of every step. It proves the path, not a speed-up.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

ARCHITECTURE = "EagleLlamaForCausalLM"  # LMDeploy's EAGLE(1) draft for Llama targets (method 'eagle')


def random_eagle_draft(target_dir: str | Path, out_dir: str | Path, *, seed: int = 0, layers: int = 1) -> Path:
    """Write ``config.json`` + ``model.safetensors`` of an EAGLE draft shaped for ``target_dir``."""
    from safetensors.torch import save_file

    target = json.loads((Path(target_dir) / "config.json").read_text())
    if target.get("model_type") != "llama":
        raise ValueError(f"an EAGLE draft needs a Llama target, got {target.get('model_type')!r}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    # tie_word_embeddings=False: the draft has no lm_head of its own (LMDeploy 0.18's
    # EagleLlamaForCausalLM.update_weights would look for one); logits come from the target's head
    config = dict(target, architectures=[ARCHITECTURE], num_hidden_layers=layers, tie_word_embeddings=False)
    (out / "config.json").write_text(json.dumps(config, indent=1))

    hidden, inter, vocab = target["hidden_size"], target["intermediate_size"], target["vocab_size"]
    heads = target["num_attention_heads"]
    kv_heads = target.get("num_key_value_heads", heads)
    head_dim = target.get("head_dim", hidden // heads)
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen) * 0.02

    weights = {"embed_tokens.weight": rand(vocab, hidden), "fc.weight": rand(hidden, 2 * hidden)}
    for i in range(layers):
        p = f"layers.{i}."
        weights.update({
            p + "self_attn.q_proj.weight": rand(heads * head_dim, hidden),
            p + "self_attn.k_proj.weight": rand(kv_heads * head_dim, hidden),
            p + "self_attn.v_proj.weight": rand(kv_heads * head_dim, hidden),
            p + "self_attn.o_proj.weight": rand(hidden, heads * head_dim),
            p + "mlp.gate_proj.weight": rand(inter, hidden),
            p + "mlp.up_proj.weight": rand(inter, hidden),
            p + "mlp.down_proj.weight": rand(hidden, inter),
            p + "post_attention_layernorm.weight": torch.ones(hidden),
        })
        if i > 0:  # EAGLE's first layer has no input norm
            weights[p + "input_layernorm.weight"] = torch.ones(hidden)
    save_file(weights, str(out / "model.safetensors"))
    return out

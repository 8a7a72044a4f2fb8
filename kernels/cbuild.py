"""Building a C shared library on first use: the system compiler (``$CC``, else ``cc`` /
``gcc``), one cached ``.so`` per source, flags and compiler under ``~/.cache/specdec/kernels/``
(``$SPECDEC_KERNEL_CACHE`` to move it). The CPU kernels (kernels/skinny.py) and the compiled
host path of decoding (decoding/compiled.py) are built this way.
"""

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
import warnings
from pathlib import Path
from typing import Callable, Optional

# whether the host work that has a compiled twin (the step planner: decoding/compiled.py; the
# step's packing: models/packing.py) runs it where it builds (True) or its Python reference;
# SPECDEC_HOST=ref in the environment starts with the reference
_host = {"compiled": os.environ.get("SPECDEC_HOST", "").strip().lower() != "ref"}


def host_compiled() -> bool:
    """The switch between the compiled host path and its Python reference (see ``_host``)."""
    return _host["compiled"]


def set_host_compiled(on: bool) -> bool:
    """Set the switch; returns the previous setting."""
    before, _host["compiled"] = _host["compiled"], bool(on)
    return before


# whether the compiled host path's glue runs in its CPython extensions (decoding/cpu/glue.c,
# models/cpu/packext.c) where they build (True) or in Python around ctypes calls (False: for
# comparison and tests); one switch for both
_glue = {"on": True}


def host_glue() -> bool:
    """The switch between the host path's glue in C and in Python (see ``_glue``)."""
    return _glue["on"]


def set_host_glue(on: bool) -> bool:
    """Set the switch; returns the previous setting. Planners made before keep theirs."""
    before, _glue["on"] = _glue["on"], bool(on)
    return before


def cache_dir() -> Path:
    env = os.environ.get("SPECDEC_KERNEL_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "specdec" / "kernels"


def compiler() -> Optional[str]:
    for name in ([os.environ["CC"]] if os.environ.get("CC") else []) + ["cc", "gcc"]:
        path = shutil.which(name)
        if path:
            return path
    return None


def build(name: str, sources: list[Path], headers: list[Path], flags: list[str], libs: list[str]
          ) -> tuple[Path, str]:
    """The library ``name`` built from ``sources`` (``headers`` count in its hash only):
    (path of the .so, its tag: a hash of sources, flags and compiler). Built aside and renamed,
    so processes that build it at the same time never load a half-written file.
    RuntimeError when there is no compiler or it fails."""
    cc = compiler()
    if cc is None:
        raise RuntimeError("no C compiler found ($CC, cc, gcc)")
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    src = b"".join(f.read_bytes() for f in sources + headers)
    tag = hashlib.sha256(src + " ".join(flags + libs).encode() + version.encode()).hexdigest()[:16]
    out = cache_dir() / f"{name}-{tag}.so"
    if not out.is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
        os.close(fd)
        try:
            r = subprocess.run([cc, *flags, *map(str, sources), "-o", tmp, *libs], capture_output=True, text=True,
                               timeout=120)
            if r.returncode != 0:
                raise RuntimeError(f"{cc} failed on {', '.join(f.name for f in sources)}: {r.stderr.strip()[-2000:]}")
            os.replace(tmp, out)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    return out, tag


class OnDemand:
    """A library of portable C (no instruction-set flags) built and loaded on its first ``get``:
    ``declare(lib)`` sets its functions' types (and may raise RuntimeError to refuse it). Where
    it cannot build, ``get`` returns None, ``reason`` says why, and one warning says that
    ``fallback`` runs instead."""

    def __init__(self, name: str, sources: list[Path], flags: list[str], libs: list[str],
                 declare: Callable[[ctypes.CDLL], None], fallback: str, headers: Optional[list[Path]] = None):
        self.name, self.sources, self.flags, self.libs = name, sources, flags, libs
        self.headers = headers or []
        self.declare, self.fallback = declare, fallback
        self.lib: Optional[ctypes.CDLL] = None
        self.reason: Optional[str] = None
        self.tried = False
        self._lock = threading.Lock()

    def get(self) -> Optional[ctypes.CDLL]:
        if self.tried:
            return self.lib
        with self._lock:
            if not self.tried:
                try:
                    path, _ = build(self.name, self.sources, self.headers, self.flags, self.libs)
                    lib = ctypes.CDLL(str(path))
                    self.declare(lib)
                    self.lib = lib
                except (RuntimeError, OSError, subprocess.SubprocessError) as e:
                    self.reason = f"could not build {', '.join(f.name for f in self.sources)}: {e}"
                    warnings.warn(f"{self.reason}; {self.fallback}", RuntimeWarning, stacklevel=3)
                self.tried = True
        return self.lib


def python_include() -> Optional[str]:
    """The folder of this Python's ``Python.h``, or None where its headers are not installed."""
    import sysconfig

    inc = sysconfig.get_paths().get("include")
    return inc if inc and (Path(inc) / "Python.h").is_file() else None


class OnDemandModule:
    """A CPython extension module of portable C built and imported on its first ``get``
    (``PyInit_<name>`` in ``sources``; ``headers`` count in its hash). It serves the glue of a
    compiled host path: reading a step's Python objects in C costs a fraction of what building
    ctypes arguments from them does. Where it cannot build (no compiler, or this Python's
    headers are not installed), ``get`` returns None, ``reason`` says why, and one warning says
    that ``fallback`` runs instead."""

    def __init__(self, name: str, sources: list[Path], fallback: str, headers: Optional[list[Path]] = None):
        self.name, self.sources, self.headers, self.fallback = name, sources, headers or [], fallback
        self.module = None
        self.reason: Optional[str] = None
        self.tried = False
        self._lock = threading.Lock()

    def get(self):
        if self.tried:
            return self.module
        with self._lock:
            if not self.tried:
                try:
                    self.module = self._load()
                except (RuntimeError, OSError, ImportError, subprocess.SubprocessError) as e:
                    self.reason = f"could not build {', '.join(f.name for f in self.sources)}: {e}"
                    warnings.warn(f"{self.reason}; {self.fallback}", RuntimeWarning, stacklevel=3)
                self.tried = True
        return self.module

    def _load(self):
        import importlib.machinery
        import importlib.util
        import sys

        inc = python_include()
        if inc is None:
            raise RuntimeError("this Python's headers (Python.h) are not installed")
        flags = ["-O2", "-std=c11", "-shared", "-fPIC", f"-I{inc}",
                 f"-DSPECDEC_PY={sys.version_info[0]}{sys.version_info[1]:02d}"]
        path, _ = build(f"{self.name}-py{sys.version_info[0]}{sys.version_info[1]}", self.sources, self.headers,
                        flags, [])
        # the module's own name (PyInit_<name>), loaded from the cached file (dlopen takes any name)
        loader = importlib.machinery.ExtensionFileLoader(self.name, str(path))
        spec = importlib.util.spec_from_file_location(self.name, str(path), loader=loader)
        module = importlib.util.module_from_spec(spec)
        loader.exec_module(module)
        return module

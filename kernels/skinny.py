"""A hand-written x86 CPU kernel for ``x @ W.T + b`` when x has few rows (one decoding step),
and its torch reference.

Why: at 1-16 rows the products of a decoding step read every weight once and do little
arithmetic, and the BLAS kernels torch issues there run at a fraction of the machine's memory
bandwidth (MKL's GEMV at one row, oneDNN's packed GEMM tuned for many). ``cpu/skinny_gemm.c``
streams each weight row once, in nn.Linear's own layout (no second copy), keeps a tile of W
in L1 while every row of x passes over it, and splits W's rows between OpenMP threads (the
same OpenMP runtime as torch's, so the two share one thread pool).

Every output element is computed by the same operations whatever the number of rows and the
row's place among them, so a row's result does not depend on the step it is in, bit for bit
(tests/test_kernel_skinny.py checks it); BLAS kernels switch with M and differ by rounding.

It is built on first use with the system C compiler (``$CC``, else ``cc`` / ``gcc``) for
x86-64 CPUs with AVX2 and FMA, into ``~/.cache/specdec/kernels/`` (``$SPECDEC_KERNEL_CACHE``
to move it), keyed by the source, the flags and the compiler. Without a compiler or on
another CPU, ``available()`` is False with ``unavailable_reason()`` and models/tune.py does not
offer the form; ``SPECDEC_SKINNY=0`` turns it off. fp32 only.
"""

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Optional

import torch
import torch.nn.functional as F

SOURCE = Path(__file__).with_name("cpu") / "skinny_gemm.c"
FLAGS = ["-O3", "-std=c11", "-mavx2", "-mfma", "-fopenmp", "-shared", "-fPIC"]

_lock = threading.Lock()
_lib: Optional[ctypes.CDLL] = None
_tag: Optional[str] = None  # of the built library: source, flags, compiler
_reason: Optional[str] = None
_tried = False


def _cache_dir() -> Path:
    env = os.environ.get("SPECDEC_KERNEL_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "specdec" / "kernels"


def _compiler() -> Optional[str]:
    for name in ([os.environ["CC"]] if os.environ.get("CC") else []) + ["cc", "gcc"]:
        path = shutil.which(name)
        if path:
            return path
    return None


def _cpu_ok() -> Optional[str]:
    """None when this CPU runs the kernel, else why not."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return f"needs an x86-64 CPU, this is {platform.machine()}"
    if torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
        return f"needs AVX2 and FMA, torch reports {torch.backends.cpu.get_cpu_capability()}"
    return None


def _build() -> tuple[ctypes.CDLL, str]:
    cc = _compiler()
    if cc is None:
        raise RuntimeError("no C compiler found ($CC, cc, gcc)")
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    src = SOURCE.read_bytes()
    tag = hashlib.sha256(src + " ".join(FLAGS).encode() + version.encode()).hexdigest()[:16]
    out = _cache_dir() / f"skinny_gemm-{tag}.so"
    if not out.is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)  # built aside, renamed: safe for parallel builds
        os.close(fd)
        try:
            r = subprocess.run([cc, *FLAGS, str(SOURCE), "-o", tmp], capture_output=True, text=True, timeout=120)
            if r.returncode != 0:
                raise RuntimeError(f"{cc} failed on {SOURCE.name}: {r.stderr.strip()[-2000:]}")
            os.replace(tmp, out)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    lib = ctypes.CDLL(str(out))
    lib.skinny_linear.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 3 + [ctypes.c_int]
    lib.skinny_linear.restype = None
    return lib, tag


def _load() -> Optional[ctypes.CDLL]:
    global _lib, _reason, _tried, _tag
    if _tried:
        return _lib
    with _lock:
        if not _tried:
            if os.environ.get("SPECDEC_SKINNY", "1") == "0":
                _reason = "turned off by SPECDEC_SKINNY=0"
            else:
                _reason = _cpu_ok()
                if _reason is None:
                    try:
                        _lib, _tag = _build()
                    except (RuntimeError, OSError, subprocess.SubprocessError) as e:
                        _reason = f"could not build {SOURCE.name}: {e}"
            _tried = True
    return _lib


def available() -> bool:
    """Whether the kernel runs here (builds it on the first call)."""
    return _load() is not None


def build_tag() -> Optional[str]:
    """Hash of the built kernel's source, flags and compiler (None when unavailable): a tuning
    table measured with another build is measured again."""
    _load()
    return _tag


def unavailable_reason() -> Optional[str]:
    _load()
    return _reason


def skinny_linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
                  threads: Optional[int] = None) -> torch.Tensor:
    """x (M, K) @ weight (N, K).T + bias (N,) -> (M, N), fp32 CPU tensors, contiguous.
    ``threads``: OpenMP threads (default torch's)."""
    lib = _load()
    if lib is None:
        raise RuntimeError(f"the skinny CPU kernel is unavailable: {_reason}")
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1]:
        raise ValueError(f"x must be (M, K) and weight (N, K) with the same K, got x {tuple(x.shape)} "
                         f"and weight {tuple(weight.shape)}")
    for name, t in (("x", x), ("weight", weight), ("bias", bias)):
        if t is not None and (t.dtype != torch.float32 or t.device.type != "cpu" or not t.is_contiguous()):
            raise ValueError(f"{name} must be a contiguous float32 CPU tensor, got {t.dtype} on {t.device}"
                             f"{'' if t.is_contiguous() else ', not contiguous'}")
    if bias is not None and bias.shape != (weight.shape[0],):
        raise ValueError(f"bias must be ({weight.shape[0]},), got {tuple(bias.shape)}")
    if threads is None:
        threads = torch.get_num_threads()
    if threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    m, k = x.shape
    y = torch.empty(m, weight.shape[0], dtype=torch.float32)
    if m:
        lib.skinny_linear(x.data_ptr(), weight.data_ptr(), None if bias is None else bias.data_ptr(), y.data_ptr(),
                          m, weight.shape[0], k, threads)
    return y


def skinny_linear_ref(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The reference: the same product in float64, rounded to float32."""
    return F.linear(x.double(), weight.double(), None if bias is None else bias.double()).float()

"""The x86 CPU kernels of an fp32 decoding step (``kernels/cpu/*.c``), each beside its torch
reference: the matrix product for few rows (``skinny_linear``), attention of a sequence's rows
over its paged cache (``skinny_attention`` for a decoding step's few rows under any mask,
``prefill_attention`` for a prompt's many under the causal rule), RMSNorm, SiLU * up and RoPE, the whole layer stack
in one call (``layers_unchecked``, used by models/llama.py), the logits' argmax / top-k
(``argmax_rows``, ``topk_rows``), and the roofline probes (``fma_peak_gflops``,
``read_bandwidth_gbs``). One shared library holds them all, built here.

The product, why: at 1-16 rows the products of a decoding step read every weight once and do little
arithmetic, and the BLAS kernels torch issues there run at a fraction of the machine's memory
bandwidth (MKL's GEMV at one row, oneDNN's packed GEMM tuned for many). ``cpu/skinny_gemm.c``
streams each weight row once, in nn.Linear's own layout (no second copy), keeps a tile of W
in L1 while every row of x passes over it, and splits W's rows between OpenMP threads (the
same OpenMP runtime as torch's, so the two share one thread pool).

Every output element is computed by the same operations whatever the number of rows and the
row's place among them, so a row's result does not depend on the step it is in, bit for bit
(tests/test_kernel_skinny.py checks it); BLAS kernels switch with M and differ by rounding.

It is built on first use with the system C compiler (``$CC``, else ``cc`` / ``gcc``) into
``~/.cache/specdec/kernels/`` (``$SPECDEC_KERNEL_CACHE`` to move it), keyed by the source, the
flags and the compiler, for one of two instruction sets: ``avx2`` (AVX2 + FMA, 8-lane vectors)
or ``avx512`` (AVX-512 F/DQ/BW/VL: the products in 16-lane vectors with 32 registers; the other
kernels the same code). The CPU's flags (``/proc/cpuinfo``) choose the widest it runs;
``SPECDEC_CPU_ISA=avx2|avx512`` forces one, and ``use_isa`` switches in a running process (to
time both in one run). The two builds round differently (the products sum 8 or 16 lanes at a
time); each keeps a row's result independent of its step. Without a compiler or on another
CPU, ``available()`` is False with ``unavailable_reason()`` and models/tune.py does not offer
the form; ``SPECDEC_SKINNY=0`` turns it off. fp32 only here; the products with Q4_1 / Q8_0
weights (``cpu/quant_gemm.c``) are in the same library, launched by kernels/quant.py.

The library also measures the machine's roofline (``cpu/roofline.c``): the peak FMA rate at
256 and 512 bits, the int8 dot products' peak in the quantized products' form
(``int8_peak_gops``: VNNI, else maddubs + madd) and the memory read bandwidth, every thread at
once (``fma_peak_gflops``, ``read_bandwidth_gbs``; bench/model_speed.py reports steps against them).
"""

import contextlib
import ctypes
import os
import platform
import subprocess
import threading
from pathlib import Path
from typing import Optional

import torch
import torch.nn.functional as F

from kernels import cbuild

SOURCES = [Path(__file__).with_name("cpu") / f for f in ("skinny_gemm.c", "skinny_attention.c", "prefill_attention.c",
                                                                       "skinny_elementwise.c", "skinny_layers.c",
                                                                       "skinny_reduce.c", "roofline.c", "quant_gemm.c")]
# in the build hash, not on the command line
HEADERS = [Path(__file__).with_name("cpu") / f for f in ("skinny_common.h", "side_prefetch.h")]
# -ffp-contract=off: a product and a sum written apart stay apart (the RoPE kernel matches torch bit for bit)
FLAGS = ["-O3", "-std=c11", "-ffp-contract=off", "-fopenmp", "-shared", "-fPIC"]
LIBS = ["-lm"]
# the instruction sets the library is built for, narrowest first: compiler flags, and the CPU
# flags (/proc/cpuinfo) that running it needs
ISAS = {
    "avx2": (["-mavx2", "-mfma"], ("avx2", "fma")),
    "avx512": (["-mavx2", "-mfma", "-mavx512f", "-mavx512dq", "-mavx512bw", "-mavx512vl"],
               ("avx2", "fma", "avx512f", "avx512dq", "avx512bw", "avx512vl")),
}

_lock = threading.Lock()
# the active build (the chosen instruction set's): what every function here calls
_lib: Optional[ctypes.CDLL] = None
_tag: Optional[str] = None  # of the built library: instruction set, and a hash of source, flags, compiler
_isa: Optional[str] = None
_reason: Optional[str] = None
_tried = False
_built: dict = {}  # instruction set -> (library, tag), each built once per process


def cpu_flags() -> set[str]:
    """The CPU's feature flags as /proc/cpuinfo lists them (empty where there is none)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def cpu_isas() -> list[str]:
    """The instruction sets of ``ISAS`` this CPU runs, narrowest first (empty off x86-64)."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return []
    flags = cpu_flags()
    if not flags:  # no /proc/cpuinfo: what torch's own dispatch found
        cap = torch.backends.cpu.get_cpu_capability()
        return ["avx2", "avx512"] if cap == "AVX512" else ["avx2"] if cap == "AVX2" else []
    return [isa for isa, (_, need) in ISAS.items() if all(f in flags for f in need)]


def _chosen_isa() -> tuple[Optional[str], Optional[str]]:
    """(instruction set to build, None) or (None, why none): $SPECDEC_CPU_ISA, else the widest
    this CPU runs."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return None, f"needs an x86-64 CPU, this is {platform.machine()}"
    runs = cpu_isas()
    want = os.environ.get("SPECDEC_CPU_ISA", "").strip().lower()
    if want:
        if want not in ISAS:
            return None, f"SPECDEC_CPU_ISA must be one of {', '.join(ISAS)}, got {want!r}"
        if want not in runs:
            return None, f"SPECDEC_CPU_ISA={want}, but this CPU runs only {', '.join(runs) or 'neither'}"
        return want, None
    if not runs:
        return None, f"needs AVX2 and FMA, torch reports {torch.backends.cpu.get_cpu_capability()}"
    return runs[-1], None


def _extra_flags(isa: str) -> list[str]:
    """Optional extensions this CPU has: F16C for the quantized products' fp16 scales (else
    converted by their bits); with AVX-512, AVX512-BF16 for the LM head's screen (``head_topk``;
    without it the build has no screen and the head is multiplied out) and AVX512-VNNI for the
    quantized products' integer dot products (kernels/quant.py; without it maddubs + madd)."""
    flags = cpu_flags()
    extra = ["-mf16c"] if "f16c" in flags else []
    if isa == "avx512":
        extra += [f"-m{f.replace('_', '')}" for f in ("avx512_bf16", "avx512_vnni") if f in flags]
    return extra


def _build(isa: str) -> tuple[ctypes.CDLL, str]:
    if isa in _built:
        return _built[isa]
    path, tag = cbuild.build(f"skinny-{isa}", SOURCES, HEADERS, FLAGS + ISAS[isa][0] + _extra_flags(isa), LIBS)
    lib = ctypes.CDLL(str(path))
    _declare(lib)
    _built[isa] = (lib, f"{isa}-{tag}")
    return _built[isa]


def _declare(lib: ctypes.CDLL) -> None:
    lib.skinny_linear.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 3 + [ctypes.c_int]
    lib.skinny_linear.restype = None
    lib.skinny_attention.argtypes = ([ctypes.c_void_p, ctypes.c_int64] + [ctypes.c_int] * 4 + [ctypes.c_void_p] * 3
                                     + [ctypes.c_int, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int, ctypes.c_float,
                                        ctypes.c_void_p, ctypes.c_int])
    lib.skinny_attention.restype = ctypes.c_int
    lib.skinny_attention_kv16.argtypes = lib.skinny_attention.argtypes
    lib.skinny_attention_kv16.restype = ctypes.c_int
    # a batch's sequences in one call (the layer stack's; tests call it beside skinny_attention per sequence)
    lib.skinny_attention_seqs.argtypes = ([ctypes.c_int, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p]
                                          + [ctypes.c_int] * 3 + [ctypes.c_void_p] * 3
                                          + [ctypes.c_int] + [ctypes.c_void_p] * 3
                                          + [ctypes.c_float, ctypes.c_void_p, ctypes.c_int, ctypes.c_int])
    lib.skinny_attention_seqs.restype = ctypes.c_int
    lib.skinny_kv16_available.restype = ctypes.c_int
    lib.skinny_visibility.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    lib.skinny_visibility.restype = None
    lib.prefill_attention.argtypes = ([ctypes.c_void_p, ctypes.c_int64] + [ctypes.c_int] * 4 + [ctypes.c_void_p] * 3
                                      + [ctypes.c_int, ctypes.c_int64, ctypes.c_float, ctypes.c_void_p, ctypes.c_void_p,
                                         ctypes.c_int])
    lib.prefill_attention.restype = ctypes.c_int
    lib.prefill_attention_kv16.argtypes = lib.prefill_attention.argtypes
    lib.prefill_attention_kv16.restype = ctypes.c_int
    lib.prefill_attention_dim_multiple.argtypes = []
    lib.prefill_attention_dim_multiple.restype = ctypes.c_int
    lib.prefill_attention_work.argtypes = [ctypes.c_int64, ctypes.c_int, ctypes.c_int]
    lib.prefill_attention_work.restype = ctypes.c_int64
    lib.skinny_rms_norm.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int64] * 2 + [ctypes.c_float, ctypes.c_int]
    lib.skinny_rms_norm.restype = None
    lib.skinny_silu_mul.argtypes = [ctypes.c_void_p] * 2 + [ctypes.c_int64] * 2 + [ctypes.c_int]
    lib.skinny_silu_mul.restype = None
    lib.skinny_rope.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int64] * 4
    lib.skinny_rope.restype = None
    lib.skinny_layers.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
    lib.skinny_layers.restype = ctypes.c_int
    lib.skinny_argmax.argtypes = [ctypes.c_void_p] + [ctypes.c_int64] * 3 + [ctypes.c_void_p]
    lib.skinny_argmax.restype = None
    lib.skinny_topk.argtypes = [ctypes.c_void_p] + [ctypes.c_int64] * 3 + [ctypes.c_int, ctypes.c_void_p,
                                                                            ctypes.c_void_p]
    lib.skinny_topk.restype = ctypes.c_int64
    lib.skinny_head_topk.argtypes = [ctypes.c_void_p] * 9 + [ctypes.c_int64] * 3 + [ctypes.c_int] + \
        [ctypes.c_void_p] * 5 + [ctypes.c_int]
    lib.skinny_head_topk.restype = ctypes.c_int
    lib.skinny_head_available.argtypes = []
    lib.skinny_head_available.restype = ctypes.c_int
    lib.quant_linear.argtypes = ([ctypes.c_void_p, ctypes.c_int64, ctypes.c_int] + [ctypes.c_void_p] * 3
                                 + [ctypes.c_int64] * 3 + [ctypes.c_int])
    lib.quant_linear.restype = ctypes.c_int
    lib.quant_linear_topk.argtypes = lib.quant_linear.argtypes + [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
    lib.quant_linear_topk.restype = ctypes.c_int64
    lib.quant_rows.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p,
                               ctypes.c_void_p]
    lib.quant_rows.restype = None
    lib.quant_vnni.argtypes = []
    lib.quant_vnni.restype = ctypes.c_int
    lib.roofline_fma_peak.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int]
    lib.roofline_fma_peak.restype = ctypes.c_double
    lib.roofline_int8_peak.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int]
    lib.roofline_int8_peak.restype = ctypes.c_double
    lib.roofline_read_bandwidth.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_void_p]
    lib.roofline_read_bandwidth.restype = ctypes.c_double


def _load() -> Optional[ctypes.CDLL]:
    global _lib, _reason, _tried, _tag, _isa
    if _tried:
        return _lib
    with _lock:
        if not _tried:
            if os.environ.get("SPECDEC_SKINNY", "1") == "0":
                _reason = "turned off by SPECDEC_SKINNY=0"
            else:
                chosen, _reason = _chosen_isa()
                if chosen is not None:
                    try:
                        (_lib, _tag), _isa = _build(chosen), chosen
                    except (RuntimeError, OSError, subprocess.SubprocessError) as e:
                        _reason = f"could not build the CPU kernels ({chosen}): {e}"
            _tried = True
    return _lib


def isa() -> Optional[str]:
    """The instruction set of the active build (None when unavailable)."""
    return _isa if _load() is not None else None


def use_isa(name: str) -> Optional[str]:
    """Make ``name``'s build the active one (built on first use) and return the previous
    instruction set: for timing both builds in one process. A model tuned before keeps its
    product plans (measured with the other build): tune it again."""
    global _lib, _tag, _isa, _reason, _tried
    if name not in ISAS:
        raise ValueError(f"isa must be one of {', '.join(ISAS)}, got {name!r}")
    if name not in cpu_isas():
        raise ValueError(f"this CPU does not run {name} (it runs {', '.join(cpu_isas()) or 'neither'})")
    before = isa()
    built = _build(name)
    with _lock:
        (_lib, _tag), _isa, _reason, _tried = built, name, None, True
    return before


def fma_peak_gflops(bits: int, threads: Optional[int] = None, iters: int = 4_000_000) -> float:
    """The peak FMA rate (GFLOP/s, all ``threads`` at once, default torch's) at ``bits`` = 256 or
    512 (512 only where the CPU has AVX-512F): independent FMA chains on registers."""
    lib = _require()
    if bits not in (256, 512):
        raise ValueError(f"bits must be 256 or 512, got {bits!r}")
    if bits == 512 and "avx512f" not in cpu_flags():
        raise ValueError("this CPU has no 512-bit FMA (no avx512f)")
    if not isinstance(iters, int) or iters < 1:
        raise ValueError(f"iters must be an int >= 1, got {iters!r}")
    return lib.roofline_fma_peak(bits, iters, _threads(threads))


# the quantized products' integer dot products (cpu/quant_gemm.c), as cpu/roofline.c measures
# them: name -> (its code there, the CPU flags it needs)
INT8_PEAKS = {"maddubs256": (0, ("avx2",)), "maddubs512": (1, ("avx512f", "avx512bw")),
              "vnni512": (2, ("avx512f", "avx512_vnni"))}


def int8_peak_gops(kind: str, threads: Optional[int] = None, iters: int = 4_000_000) -> float:
    """The peak rate of int8 dot products (GOP/s, 2 per u8 x s8 product, all ``threads`` at once)
    in the form ``kind`` of ``INT8_PEAKS``: "vnni512" (vpdpbusd), "maddubs512" / "maddubs256"
    (maddubs + madd + add, the kernel's form without VNNI); independent chains on registers."""
    lib = _require()
    if kind not in INT8_PEAKS:
        raise ValueError(f"kind must be one of {', '.join(INT8_PEAKS)}, got {kind!r}")
    code, need = INT8_PEAKS[kind]
    missing = [f for f in need if f not in cpu_flags()]
    if missing:
        raise ValueError(f"this CPU cannot run {kind} (no {', '.join(missing)})")
    if not isinstance(iters, int) or iters < 1:
        raise ValueError(f"iters must be an int >= 1, got {iters!r}")
    return lib.roofline_int8_peak(code, iters, _threads(threads))


def int8_kind() -> Optional[str]:
    """The form of ``INT8_PEAKS`` the active build's quantized products take (None when the
    kernels are unavailable)."""
    lib = _load()
    if lib is None:
        return None
    return "vnni512" if lib.quant_vnni() == 1 else "maddubs512" if _isa == "avx512" else "maddubs256"


def _threads(threads: Optional[int]) -> int:
    """``threads``, or torch's thread count for None; a clear error for anything else below 1."""
    if threads is None:
        return torch.get_num_threads()
    if not isinstance(threads, int) or isinstance(threads, bool) or threads < 1:
        raise ValueError(f"threads must be None or an int >= 1, got {threads!r}")
    return threads


def read_bandwidth_gbs(buffer: torch.Tensor, threads: Optional[int] = None) -> float:
    """Memory read bandwidth (GB/s, all ``threads`` at once) summing ``buffer`` (a contiguous
    fp32 CPU tensor, much larger than the caches)."""
    lib = _require()
    _check_f32("buffer", buffer)
    if buffer.numel() < 1024:
        raise ValueError(f"buffer must hold at least 1024 floats (far more than the caches to mean anything), "
                         f"got {buffer.numel()}")
    return lib.roofline_read_bandwidth(buffer.data_ptr(), buffer.numel(), _threads(threads), None)


def _require() -> ctypes.CDLL:
    lib = _load()
    if lib is None:
        raise RuntimeError(f"the skinny CPU kernels are unavailable: {_reason}")
    return lib


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
    lib = _require()
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


MAX_GROUP = 16  # query heads per kv head the attention kernel takes
KV_DTYPES = (torch.float32, torch.float16)  # the caches the attention kernels and the layer stack read


def kv16_available() -> bool:
    """Whether the active build reads fp16 KV caches (it needs F16C; every AVX2 CPU we know has it)."""
    lib = _load()
    if lib is None:
        return False
    got = _kv16.get(id(lib))  # asked every step of an fp16 cache: one ctypes call per build, not per step
    if got is None:
        got = _kv16[id(lib)] = bool(lib.skinny_kv16_available())
    return got


_kv16: dict[int, bool] = {}


def _check_paged(q, k_cache, v_cache, multiple: int, max_dim: Optional[int], max_group: int) -> tuple[int, ...]:
    """The attention kernels' shared checks of q (T, H, D) and a layer's paged caches; -> (T, H, D)."""
    if q.dim() != 3 or k_cache.dim() != 4 or v_cache.shape != k_cache.shape:
        raise ValueError(f"q must be (T, H, D) and k_cache, v_cache the same (num_blocks, block_size, KV, D), got "
                         f"q {tuple(q.shape)}, k_cache {tuple(k_cache.shape)}, v_cache {tuple(v_cache.shape)}")
    t, h, d = q.shape
    kv, dk = k_cache.shape[2], k_cache.shape[3]
    if d != dk or d % multiple or (max_dim is not None and d > max_dim) or h % kv or h // kv > max_group:
        raise ValueError(f"head_dim must match ({d} vs {dk}) and be a multiple of {multiple}"
                         f"{'' if max_dim is None else f' and at most {max_dim}'}, heads a multiple of kv heads "
                         f"with at most {max_group} per kv head; got H={h}, KV={kv}")
    if q.dtype != torch.float32 or q.device.type != "cpu":
        raise ValueError(f"q must be a float32 CPU tensor, got {q.dtype} on {q.device}")
    kinds = KV_DTYPES if kv16_available() else (torch.float32,)
    for name, x in (("k_cache", k_cache), ("v_cache", v_cache)):
        if x.dtype not in kinds or x.dtype != k_cache.dtype or x.device.type != "cpu":
            raise ValueError(f"{name} must be a {' or '.join(map(str, kinds))} CPU tensor (k_cache's dtype), got "
                             f"{x.dtype} on {x.device}")
    if q.stride(2) != 1 or q.stride(1) != d or not k_cache.is_contiguous() or not v_cache.is_contiguous():
        raise ValueError("q's heads and dims and the caches must be contiguous")
    return t, h, d


def _check_blocks(block_ids: torch.Tensor, length: int, k_cache: torch.Tensor) -> None:
    nb, bs = k_cache.shape[0], k_cache.shape[1]
    n_blk = -(-length // bs)
    if (block_ids.dtype != torch.int32 or block_ids.dim() != 1 or not block_ids.is_contiguous()
            or block_ids.numel() < n_blk):
        raise ValueError(f"block_ids must be a contiguous int32 vector of at least {n_blk} blocks, got "
                         f"{block_ids.dtype} {tuple(block_ids.shape)}")
    used = block_ids[:n_blk]
    if int(used.min()) < 0 or int(used.max()) >= nb:
        raise ValueError(f"block_ids must lie in [0, {nb}) (num_blocks), got {int(used.min())}..{int(used.max())}")


def _check_threads(threads: Optional[int]) -> None:
    if threads is not None and threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")


def skinny_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_ids: torch.Tensor,
                     length: int, mask: Optional[torch.Tensor] = None, causal: bool = False,
                     scale: Optional[float] = None, threads: Optional[int] = None) -> torch.Tensor:
    """Attention of one sequence's T step rows over its first ``length`` keys in a layer's
    paged cache, fp32 CPU: q (T, H, D) (rows may be strided, heads and dims contiguous),
    k_cache / v_cache (num_blocks, block_size, KV, D) contiguous, block_ids (>= ceil(length /
    block_size),) int32 physical blocks, mask (T, length) bool visibility (None: all visible,
    or with ``causal`` row t sees keys j <= t + length - T). -> (T, H, D). A row with no
    visible key gets zeros. The reference: ``kernels.tree_attention.tree_attention_ref``."""
    _require()
    t, h, d = _check_paged(q, k_cache, v_cache, 8, None, MAX_GROUP)
    if length < 1:
        raise ValueError(f"length must be >= 1, got {length}")
    _check_blocks(block_ids, length, k_cache)
    if mask is not None and (mask.dtype != torch.bool or mask.shape != (t, length) or not mask.is_contiguous()):
        raise ValueError(f"mask must be a contiguous bool ({t}, {length}) tensor, got {mask.dtype} {tuple(mask.shape)}")
    _check_threads(threads)
    return attention_unchecked(q, k_cache, v_cache, block_ids, length, mask, causal,
                               d ** -0.5 if scale is None else scale,
                               threads)


def visibility(words: torch.Tensor, context: int) -> Optional[torch.Tensor]:
    """A tree step's (T, context + T) bool visibility of one sequence from its (T, n_words) int32
    mask words (kernels/mask.py): every committed key, then the step's keys its words set;
    ``torch.ones`` with ``unpack_mask`` beside the context, in one C call (cpu/skinny_attention.c).
    None where the library is not built or the words are not contiguous int32 CPU rows (the
    caller unpacks them with torch)."""
    if isinstance(context, bool) or not isinstance(context, int) or context < 0:
        raise ValueError(f"context must be an int >= 0 (the committed keys before the step's), got {context!r}")
    lib = _lib or _load()
    if (lib is None or words.dim() != 2 or words.dtype != torch.int32 or words.device.type != "cpu"
            or not words.is_contiguous()):
        return None
    t = words.shape[0]
    if t > 32 * words.shape[1]:
        raise ValueError(f"words must hold a bit per row: {t} rows need >= {-(-t // 32)} words, got {words.shape[1]}")
    out = torch.empty(t, context + t, dtype=torch.bool)
    lib.skinny_visibility(words.data_ptr(), words.shape[1], t, context, out.data_ptr())
    return out


def attention_unchecked(q, k_cache, v_cache, block_ids, length, mask, causal, scale, threads=None) -> torch.Tensor:
    """``skinny_attention`` without the checks, for callers that built the arguments (kernels/torch_plan.py)."""
    t, h, d = q.shape
    lib = _lib or _require()
    out = torch.empty(t, h, d, dtype=torch.float32)
    fn = lib.skinny_attention if k_cache.dtype == torch.float32 else lib.skinny_attention_kv16
    rc = fn(q.data_ptr(), q.stride(0), t, h, k_cache.shape[2], d, k_cache.data_ptr(), v_cache.data_ptr(),
            block_ids.data_ptr(), k_cache.shape[1], length, None if mask is None else mask.data_ptr(), int(causal),
            scale, out.data_ptr(), threads or torch.get_num_threads())
    if rc == -2:
        raise ValueError(f"skinny_attention refused its shape or cache ({k_cache.dtype}; T={t}, length={length})")
    if rc != 0:
        raise MemoryError(f"skinny_attention could not allocate its buffers (T={t}, length={length})")
    return out


MAX_PREFILL_GROUP = 32  # query heads per kv head the prefill kernel takes
MAX_PREFILL_DIM = 256  # and head dims


def prefill_dim_multiple() -> int:
    """The prefill kernel takes head dims that are a multiple of this (64 with AVX-512, 32
    with AVX2: a value tile is 4 vectors of dims); 0 without the kernels."""
    lib = _load()
    return 0 if lib is None else _dim_multiple.setdefault(_tag, lib.prefill_attention_dim_multiple())


_dim_multiple: dict = {}  # per build


def prefill_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_ids: torch.Tensor,
                      length: int, scale: Optional[float] = None, threads: Optional[int] = None) -> torch.Tensor:
    """Causal attention of one sequence's T rows over its first ``length`` >= T keys in a
    layer's paged cache (a prompt, or a chunk of one, after a committed prefix of length - T
    keys): row t sees keys j <= t + length - T. fp32 CPU; q (T, H, D) (rows may be strided,
    heads and dims contiguous), k_cache / v_cache (num_blocks, block_size, KV, D) contiguous,
    block_ids int32 physical blocks. -> (T, H, D). Blocked like FlashAttention
    (kernels/cpu/prefill_attention.c); a row's result does not depend on T, the thread count or
    its place among the rows. The reference: ``kernels.tree_attention.tree_attention_ref``."""
    _require()
    t, h, d = _check_paged(q, k_cache, v_cache, prefill_dim_multiple(), MAX_PREFILL_DIM, MAX_PREFILL_GROUP)
    if t < 1 or length < t:
        raise ValueError(f"length must be >= T >= 1 (the rows are the last T of the length keys), got T={t}, "
                         f"length={length}")
    _check_blocks(block_ids, length, k_cache)
    _check_threads(threads)
    if scale is not None and not 0 < scale < float("inf"):  # the kernel's exponents are <= 0 only for scale > 0
        raise ValueError(f"scale must be a finite number > 0, got {scale}")
    return prefill_unchecked(q, k_cache, v_cache, block_ids, length, d ** -0.5 if scale is None else scale, threads)


_work = threading.local()  # the prefill kernel's packed keys and values, grown as needed, per thread


def prefill_unchecked(q, k_cache, v_cache, block_ids, length, scale, threads=None) -> torch.Tensor:
    """``prefill_attention`` without the checks, for callers that built the arguments (kernels/torch_plan.py)."""
    t, h, d = q.shape
    kv = k_cache.shape[2]
    lib = _lib or _require()
    need = lib.prefill_attention_work(length, kv, d)
    work = getattr(_work, "buf", None)
    if work is None or work.numel() < need:
        work = _work.buf = torch.empty(need, dtype=torch.float32)
    out = torch.empty(t, h, d, dtype=torch.float32)
    fn = lib.prefill_attention if k_cache.dtype == torch.float32 else lib.prefill_attention_kv16
    rc = fn(q.data_ptr(), q.stride(0), t, h, kv, d, k_cache.data_ptr(), v_cache.data_ptr(), block_ids.data_ptr(),
            k_cache.shape[1], length, scale, out.data_ptr(), work.data_ptr(), threads or torch.get_num_threads())
    if rc != 0:
        raise ValueError(f"prefill_attention refused its shape (T={t}, H={h}, KV={kv}, D={d}, length={length})")
    return out


def _check_f32(name: str, t: torch.Tensor) -> None:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a contiguous float32 CPU tensor, got {type(t).__name__} {t!r:.40}")
    if t.dtype != torch.float32 or t.device.type != "cpu" or not t.is_contiguous():
        raise ValueError(f"{name} must be a contiguous float32 CPU tensor, got {t.dtype} on {t.device}"
                         f"{'' if t.is_contiguous() else ', not contiguous'}")


def _elem_threads(threads) -> int:
    if threads is None:
        return torch.get_num_threads()
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads must be an int >= 1 (None: torch's), got {threads!r}")
    return threads


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, threads: Optional[int] = None) -> torch.Tensor:
    """x (rows, n) / sqrt(mean(x^2) + eps) * weight (n,), fp32 CPU, one call; the rows shared
    between ``threads`` (None: torch's) where there are enough of them, the same numbers. The
    reference: ``torch.nn.functional.rms_norm``."""
    _require()
    _check_f32("x", x)
    _check_f32("weight", weight)
    if x.dim() != 2 or weight.shape != (x.shape[1],):
        raise ValueError(f"x must be (rows, n) and weight (n,), got {tuple(x.shape)} and {tuple(weight.shape)}")
    if not eps >= 0:
        raise ValueError(f"eps must be >= 0, got {eps}")
    return rms_norm_unchecked(x, weight, eps, _elem_threads(threads))


def rms_norm_unchecked(x: torch.Tensor, weight: torch.Tensor, eps: float, threads: Optional[int] = None
                       ) -> torch.Tensor:
    out = torch.empty_like(x)
    _lib.skinny_rms_norm(x.data_ptr(), weight.data_ptr(), out.data_ptr(), x.shape[0], x.shape[1], eps,
                         threads or torch.get_num_threads())
    return out


def silu_mul(gate_up: torch.Tensor, threads: Optional[int] = None) -> torch.Tensor:
    """gate_up (rows, 2n) -> silu(gate) * up (rows, n), fp32 CPU, one call; the rows shared between
    ``threads`` (None: torch's) where there are enough of them, the same numbers. The reference:
    ``F.silu(g) * u`` for ``g, u = gate_up.chunk(2, -1)``."""
    _require()
    _check_f32("gate_up", gate_up)
    if gate_up.dim() != 2 or gate_up.shape[1] % 2:
        raise ValueError(f"gate_up must be (rows, 2n), got {tuple(gate_up.shape)}")
    return silu_mul_unchecked(gate_up, _elem_threads(threads))


def silu_mul_unchecked(gate_up: torch.Tensor, threads: Optional[int] = None) -> torch.Tensor:
    rows, n2 = gate_up.shape
    out = torch.empty(rows, n2 // 2, dtype=torch.float32)
    _lib.skinny_silu_mul(gate_up.data_ptr(), out.data_ptr(), rows, n2 // 2, threads or torch.get_num_threads())
    return out


def rope_(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, heads: int) -> torch.Tensor:
    """Rotary embedding in place on the first ``heads`` heads of every row of x (rows, >= heads
    * D), fp32 CPU, rows may be strided; cos / signed sin (rows, D) contiguous as
    ``models.llama.rope_tables`` makes them, D a multiple of 16. Bit for bit the result of
    ``models.llama.apply_rope`` (the reference). Returns x."""
    _require()
    if x.dim() != 2 or cos.dim() != 2 or sin.shape != cos.shape or cos.shape[0] != x.shape[0]:
        raise ValueError(f"x must be (rows, n) and cos, sin (rows, D), got x {tuple(x.shape)}, cos {tuple(cos.shape)}, "
                         f"sin {tuple(sin.shape)}")
    d = cos.shape[1]
    if d % 16 or heads < 0 or heads * d > x.shape[1]:
        raise ValueError(f"D must be a multiple of 16 and heads * D at most the row ({x.shape[1]}), got D={d}, "
                         f"heads={heads}")
    _check_f32("cos", cos)
    _check_f32("sin", sin)
    if x.dtype != torch.float32 or x.device.type != "cpu" or x.stride(1) != 1:
        raise ValueError(f"x must be a float32 CPU tensor with contiguous rows, got {x.dtype} on {x.device}")
    return rope_unchecked(x, cos, sin, heads)


def rope_unchecked(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, heads: int) -> torch.Tensor:
    _lib.skinny_rope(x.data_ptr(), cos.data_ptr(), sin.data_ptr(), x.shape[0], x.stride(0), heads, cos.shape[1])
    return x


# ---- the whole stack of decoder layers in one call (cpu/skinny_layers.c) ------------------------
class LayerPtrs(ctypes.Structure):
    """One layer's weights and cache pools, as ``skinny_layer`` in cpu/skinny_layers.c: ``fmt``
    per product (qkv, o, gate_up, down) 0 for an fp32 weight, else kernels/quant.py's
    ``FORMATS`` code of its packed panels."""
    _fields_ = [(n, ctypes.c_void_p) for n in ("attn_norm", "wqkv", "bqkv", "wo", "mlp_norm", "w_gate_up", "w_down",
                                                "k_cache", "v_cache")] + [("fmt", ctypes.c_int32 * 4)]


class StepArgs(ctypes.Structure):
    """The step, as ``skinny_step`` in cpu/skinny_layers.c."""
    _fields_ = ([(n, ctypes.c_int) for n in ("T", "d", "H", "KV", "D", "I", "n_seq", "block_size", "threads")]
                + [("eps", ctypes.c_float), ("scale", ctypes.c_float)]
                + [(n, ctypes.c_void_p) for n in ("cos", "sin", "slots", "seq_start", "seq_len", "seq_blocks",
                                                  "seq_mask")]
                + [("kv_half", ctypes.c_int), ("positions", ctypes.c_void_p), ("final_norm", ctypes.c_void_p),
                   ("out_rows", ctypes.c_void_p), ("n_out", ctypes.c_int64), ("out", ctypes.c_void_p),
                   ("side", ctypes.c_int), ("seq_causal", ctypes.c_void_p), ("tokens", ctypes.c_void_p),
                   ("embed", ctypes.c_void_p), ("vocab", ctypes.c_int64)])


def layers_unchecked(h: torch.Tensor, layers, n_layers: int, step: StepArgs) -> torch.Tensor:
    """h (T, d) fp32 contiguous through ``n_layers`` layers in place (``layers``: a ctypes array
    of LayerPtrs). The caller (models/llama.py) built the arguments and keeps their tensors alive."""
    rc = _lib.skinny_layers(h.data_ptr(), ctypes.addressof(layers), n_layers, ctypes.byref(step))
    if rc == -3:  # step.tokens: torch's embedding would have raised the same
        raise IndexError(f"a token id of the step is outside the vocabulary (0 .. {step.vocab - 1})")
    if rc != 0:
        raise MemoryError(f"skinny_layers could not allocate its buffers (T={step.T})")
    return h


# The side stream (cpu/side_prefetch.h) pays where a step's bytes do not stay in the last-level
# cache between steps: on the 2-core EPYC (32 MB L3, 100 MB of weights a step) it took a one-token
# step's attention from 1.8 to 0.7 ms a forward (bench/results/2026-11-27-cpu-side-prefetch/
# NOTES.md); on an Emerald Rapids, whose 300 MB L3 holds the default model's weights and its keys
# and values up to its 8,192-token context, the forward was 5-23% faster without it at one token and
# 2-12% at 8, from 512 to 8,000 keys (bench/results/2026-11-28-cpu-side-off/NOTES.md).


def cache_bytes(folder: Path = Path("/sys/devices/system/cpu/cpu0/cache")) -> Optional[int]:
    """The largest data or unified cache listed in ``folder`` (Linux sysfs: ``index*/type`` and
    ``size`` such as ``32768K``), or None where none is readable (another OS)."""
    sizes = []
    for d in folder.glob("index*"):
        try:
            if (d / "type").read_text().strip() == "Instruction":
                continue
            text = (d / "size").read_text().strip().upper()
            sizes.append(int(text.rstrip("KMG")) * {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1))
        except (OSError, ValueError):
            continue
    return max(sizes) if sizes else None


_llc: list = []  # CPU 0's last-level cache in bytes (or None), read on first use


def _side_forced() -> Optional[bool]:
    """``SPECDEC_SIDE_PREFETCH``: True / False where it forces the side stream, None unset."""
    want = os.environ.get("SPECDEC_SIDE_PREFETCH", "")
    if want in ("0", "1"):
        return want == "1"
    if want:
        raise ValueError(f"SPECDEC_SIDE_PREFETCH must be 0 or 1 (or unset: by the cache size), got {want!r}")
    return None


def _last_level_cache() -> Optional[int]:
    if not _llc:
        _llc.append(cache_bytes())
    return _llc[0]


def side_stream(step_bytes: int) -> bool:
    """Whether a layer stack requests each next layer's keys and values while its products
    stream (``skinny_step.side``): where ``step_bytes`` (the weights a step reads, with its keys
    and values) exceed the last-level cache, or where no cache size is known.
    ``SPECDEC_SIDE_PREFETCH=1`` / ``0`` forces it on / off. It changes no number, only where the
    keys and values come from."""
    forced = _side_forced()
    if forced is not None:
        return forced
    llc = _last_level_cache()
    return llc is None or step_bytes > llc


def side_stream_rule() -> str:
    """``side_stream``'s rule on this machine, in words (the bench's header)."""
    forced = _side_forced()
    if forced is not None:
        return f"{'on' if forced else 'off'} (SPECDEC_SIDE_PREFETCH={int(forced)})"
    llc = _last_level_cache()
    return ("on: no last-level cache size known" if llc is None else
            f"on where a step's weights, keys and values exceed the {llc / 2 ** 20:.0f} MB last-level cache, "
            "off where they fit")


STACK_PHASES = ("norm", "qkv", "rope_kv", "attention", "o", "gate_up", "silu", "down", "add")  # cpu/skinny_layers.c


@contextlib.contextmanager
def stack_profile():
    """Time the phases of every whole-stack call (``layers_unchecked``) made inside the block:
    yields a dict, filled on exit, of seconds summed per phase of ``STACK_PHASES`` (products,
    attention, elementwise ops) over all layers and calls. Off, the stack pays one branch per
    phase; on, two clock reads."""
    lib = _require()
    on = ctypes.c_int.in_dll(lib, "skinny_profile_on")
    acc = (ctypes.c_double * len(STACK_PHASES)).in_dll(lib, "skinny_profile")
    for i in range(len(STACK_PHASES)):
        acc[i] = 0.0
    out: dict = {}
    on.value = 1
    try:
        yield out
    finally:
        on.value = 0
        out.update({name: acc[i] for i, name in enumerate(STACK_PHASES)})


# ---- per-row argmax and top-k of a step's logits (cpu/skinny_reduce.c; kernels/rows.py decides) --
MAX_TOPK = 64  # largest k the top-k kernel takes


def rows_kernel(x: torch.Tensor) -> Optional[ctypes.CDLL]:
    """The library when x is a CPU fp32 (rows, n >= 1) tensor with contiguous rows, else None."""
    if x.dim() != 2 or x.dtype != torch.float32 or x.device.type != "cpu" or x.shape[1] < 1 or x.shape[0] < 1:
        return None
    if x.stride(1) != 1 and x.shape[1] > 1:
        return None
    return _lib or _load()


def argmax_unchecked(lib: ctypes.CDLL, x: torch.Tensor) -> list[int]:
    """Every row's argmax from the kernel; -1 for a row holding a NaN (``rows_kernel(x)`` gave lib)."""
    out = torch.empty(x.shape[0], dtype=torch.int64)
    lib.skinny_argmax(x.data_ptr(), x.shape[0], x.shape[1], x.stride(0), out.data_ptr())
    return out.tolist()


def topk_unchecked(lib: ctypes.CDLL, x: torch.Tensor, k: int) -> tuple[list[list[int]], list[int]]:
    """The kernel's top-k of every row (k <= MAX_TOPK), and the rows it left to torch (holding a NaN)."""
    idx = torch.empty(x.shape[0], k, dtype=torch.int64)
    bad = torch.empty(x.shape[0], dtype=torch.int64)
    n_bad = lib.skinny_topk(x.data_ptr(), x.shape[0], x.shape[1], x.stride(0), k, idx.data_ptr(), bad.data_ptr())
    return idx.tolist(), bad[:n_bad].tolist()


# ---- the LM head's greedy top-k, screened in bf16 (cpu/skinny_gemm.c, skinny_head_topk) ---------
class HeadScreen:
    """What the screen keeps of an LM head weight W (N, K), fp32 CPU: its bf16 copy (rounded to
    nearest even) and per row the norms of the bound, |W - bf16(W)|, |bf16(W)| and |W| (half
    the head's bytes again). ``stale()``: W was written or moved since (build it again)."""

    def __init__(self, weight: torch.Tensor):
        _check_f32("weight", weight)
        if weight.dim() != 2 or weight.shape[0] < 1 or weight.shape[1] < 1:
            raise ValueError(f"weight must be (N, K) with N, K >= 1, got {tuple(weight.shape)}")
        w = weight.detach()
        self.weight = w
        self.key = (w.data_ptr(), w._version, tuple(w.shape))
        self.wb = w.to(torch.bfloat16)
        e, wbn, wfn = (torch.empty(w.shape[0], dtype=torch.float32) for _ in range(3))
        for a in range(0, w.shape[0], 4096):  # in float64, a slice at a time (a full copy would be 4x W)
            wd, wbd = w[a:a + 4096].double(), self.wb[a:a + 4096].double()
            e[a:a + 4096], wbn[a:a + 4096], wfn[a:a + 4096] = (wd - wbd).norm(dim=1), wbd.norm(dim=1), wd.norm(dim=1)
        if not bool(torch.isfinite(wfn).all()):
            raise ValueError("weight must be finite for the screen")
        self.e, self.wbn, self.wfn = e, wbn, wfn

    def stale(self) -> bool:
        w = self.weight
        return self.key != (w.data_ptr(), w._version, tuple(w.shape))


def head_available() -> bool:
    """Whether the active build has the LM head's screen (AVX512-BF16: Zen 4, Sapphire Rapids)."""
    lib = _load()
    return lib is not None and lib.skinny_head_available() == 1


def head_topk(h: torch.Tensor, screen: HeadScreen, k: int, threads: Optional[int] = None,
              candidates: Optional[list] = None) -> tuple[torch.Tensor, list[int]]:
    """The top-k token ids of each row of ``h @ W.T`` (h (M, K) fp32, W = ``screen.weight``),
    largest first, equal logits in index order, exactly as ``head_topk_ref`` (the top-k of
    ``skinny_linear(h, W)``) without computing the logits: screened in bf16, and only the few
    tokens the screen's bound cannot rule out computed in fp32. Returns (idx (M, k) int64, the
    rows it left to the caller: a row whose screen is not finite). ``candidates``: filled with
    each row's count of exactly computed tokens."""
    lib = _require()
    if not head_available():
        raise RuntimeError("the LM head screen needs a build with AVX512-BF16 (head_available() is False)")
    _check_f32("h", h)
    n, kd = screen.weight.shape
    if h.dim() != 2 or h.shape[1] != kd:
        raise ValueError(f"h must be (M, {kd}), got {tuple(h.shape)}")
    if not isinstance(k, int) or not 1 <= k <= min(MAX_TOPK, n):
        raise ValueError(f"k must be in [1, {min(MAX_TOPK, n)}], got {k!r}")
    if screen.stale():
        raise ValueError("screen is stale: its weight was written or moved since it was built")
    threads = _threads(threads)
    m = h.shape[0]
    idx = torch.empty(m, k, dtype=torch.int64)
    if m == 0:
        return idx, []
    hb = h.to(torch.bfloat16)
    hd = h.double()
    hn, dn = hd.norm(dim=1).float(), (hd - hb.double()).norm(dim=1).float()
    z = torch.empty(m, n, dtype=torch.float32)
    cand = torch.empty(min(threads, m), n, dtype=torch.int64)
    bad = torch.zeros(m, dtype=torch.int64)
    n_cand = torch.zeros(m, dtype=torch.int64)
    lib.skinny_head_topk(h.data_ptr(), hb.data_ptr(), screen.weight.data_ptr(), screen.wb.data_ptr(),
                         hn.data_ptr(), dn.data_ptr(), screen.e.data_ptr(), screen.wbn.data_ptr(),
                         screen.wfn.data_ptr(), m, n, kd, k, z.data_ptr(), cand.data_ptr(), idx.data_ptr(),
                         bad.data_ptr(), n_cand.data_ptr(), threads)
    if candidates is not None:
        candidates.extend(n_cand.tolist())
    return idx, [r for r, b in enumerate(bad.tolist()) if b]


def head_topk_ref(h: torch.Tensor, weight: torch.Tensor, k: int) -> list[list[int]]:
    """The reference: the top-k of the logits ``skinny_linear(h, weight)`` multiplied out, largest
    first, equal values in index order."""
    logits = skinny_linear(h, weight)
    vals, ids = torch.sort(logits, dim=1, descending=True, stable=True)
    return ids[:, :k].tolist()

"""Two builds of kernels/cpu side by side in one model_speed run (run from the repository root):

    python bench/results/2026-11-26-cpu-attention-ranges/ab_forward.py OLD_DIR NEW_DIR -- \
        --batch 1 --step-batch 1 --step-tokens 1,4,8,16 --context 1500 --reps 9 --out OUT

OLD_DIR and NEW_DIR each hold a copy of kernels/cpu. Both are built with the AVX-512 build's
flags; model_speed's ``--isa avx2,avx512`` then times them back to back at every point, so in
its tables the rows labelled ``avx2`` are OLD and those labelled ``avx512`` are NEW.
"""
import ctypes
import os
import subprocess
import sys

sys.path.insert(0, ".")
from kernels import skinny  # noqa: E402

i = sys.argv.index("--")
old_dir, new_dir, rest = sys.argv[1], sys.argv[2], sys.argv[i + 1:]


def build(d: str, tag: str) -> ctypes.CDLL:
    out = f"/tmp/ab_forward_{tag}.so"
    subprocess.run(["gcc", *skinny.FLAGS, *skinny.ISAS["avx512"][0],
                    *[os.path.join(d, f.name) for f in skinny.SOURCES], "-o", out, "-lm"], check=True)
    lib = ctypes.CDLL(out)
    skinny._declare(lib)
    return lib


skinny._built["avx2"] = (build(old_dir, "old"), "OLD")
skinny._built["avx512"] = (build(new_dir, "new"), "NEW")
from bench import model_speed  # noqa: E402

model_speed.main(rest + ["--isa", "avx2,avx512"])

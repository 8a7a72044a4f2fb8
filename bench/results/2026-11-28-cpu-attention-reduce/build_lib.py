"""Builds the CPU library (kernels/cpu at a commit) as kernels/skinny.py builds it for this CPU's widest
instruction set: python build_lib.py COMMIT OUT.so (run from the repository root)."""
import subprocess
import sys
import tempfile
from pathlib import Path

from kernels import skinny

commit, out = sys.argv[1], Path(sys.argv[2]).resolve()
isa = skinny.cpu_isas()[-1]
with tempfile.TemporaryDirectory() as tmp:
    for f in skinny.SOURCES + skinny.HEADERS:
        rel = f.relative_to(Path.cwd()) if f.is_absolute() else f
        (Path(tmp) / f.name).write_bytes(subprocess.run(["git", "show", f"{commit}:{rel}"], check=True,
                                                         capture_output=True).stdout)
    cmd = ["gcc", *skinny.FLAGS, *skinny.ISAS[isa][0], *skinny._extra_flags(isa), f"-I{tmp}",
           *[str(Path(tmp) / f.name) for f in skinny.SOURCES], "-o", str(out), *skinny.LIBS]
    subprocess.run(cmd, check=True)
print(f"{commit} -> {out} ({isa})")

"""What this machine is and where its caches live: the one home for both, so that the modules
that key caches by device (models/cost.py, models/tune.py) and the ones that find files
(models/loader.py, models/fetch.py) import it instead of each other."""

import os
import platform
import tempfile
from pathlib import Path
from typing import Optional

import torch

# dequantised GGUF weights, fetched models, tuning tables and step-cost curves (each in its folder)
DEFAULT_CACHE_DIR = Path.home() / ".cache" / "specdec"


def device_name(device: torch.device) -> str:
    """The device as caches key it: the GPU's name, or the CPU's model name and core count."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"cpu {cpu} x{os.cpu_count()}"


def describe_cpu(cpuinfo: str, l3_kib: Optional[int]) -> str:
    """The CPU as results should name it (CPUs differ in what a step costs: vector units, caches):
    ``cpuinfo``'s model name (else the platform's), its family and model numbers where it gives
    them, and the L3 in KiB (None: unknown)."""
    name = family = model = None
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if key == "model name" and name is None:
            name = value
        elif key == "cpu family" and family is None:
            family = value
        elif key == "model" and model is None:
            model = value
    parts = [name or platform.processor() or platform.machine()]
    if family is not None and model is not None:
        parts.append(f"family {family} model {model}")
    if l3_kib:
        parts.append(f"L3 {l3_kib // 1024} MiB" if l3_kib >= 1024 else f"L3 {l3_kib} KiB")
    return ", ".join(parts)


def cpu_model() -> str:
    """``describe_cpu`` of this machine (/proc/cpuinfo and the L3 of cpu0 in sysfs, where Linux
    has them)."""
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
    except OSError:
        cpuinfo = ""
    l3 = None
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            if (index / "level").read_text().strip() == "3":
                size = (index / "size").read_text().strip()
                l3 = int(size[:-1]) * (1024 if size.endswith("M") else 1) if size[-1] in "KM" else int(size) // 1024
        except (OSError, ValueError, IndexError):
            pass
    return describe_cpu(cpuinfo, l3)


def write_whole(path: Path | str, text: str) -> None:
    """``path`` holds ``text`` whole or what it held before: written to a temporary file of this
    process's own beside it, then renamed, so that another process reading the cache (or
    writing it too: two runs tuning at once) never reads half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)

"""What this machine is and where its caches live: the one home for both, so that the modules
that key caches by device (models/cost.py, models/tune.py) and the ones that find files
(models/loader.py, models/fetch.py) import it instead of each other."""

import os
import platform
import tempfile
from pathlib import Path

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

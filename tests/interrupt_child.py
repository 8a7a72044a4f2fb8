"""A child process for tests/test_interrupt.py: ``python -m decoding`` or bench/run.py as they
run from the shell, with one hold point. At the point, the child prints ``@hold POINT`` on
stderr and waits there for the test's signal, so that the signal lands inside that phase
every time instead of wherever a sleep of the test's would put it.

    python tests/interrupt_child.py POINT decoding|bench ARGS...

POINT: ``load`` (the model load begins), ``prefill:N`` (the N-th prefill of the process
begins), ``decode:N:K`` (the K-th decoding step after the N-th prefill), ``batch:N`` (bench:
the N-th batch begins, the ones before it finished and written). The hold wraps the project's
own functions in this child only; nothing in the library reads it.
"""

import importlib
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

HOLD_S = 120  # a test that never signals fails on its own timeout, not on this


def hold(point: str) -> None:
    print(f"@hold {point}", file=sys.stderr, flush=True)
    end = time.monotonic() + HOLD_S
    while time.monotonic() < end:
        time.sleep(0.05)  # the signal's handler raises here
    print(f"no signal came at {point}", file=sys.stderr, flush=True)
    sys.exit(3)


def install(point: str) -> None:
    kind, *nums = point.split(":")
    n = [int(x) for x in nums]
    count = {"prefill": 0, "decode": 0, "batch": 0}
    if kind == "load":
        import models.loader as loader

        real_load = loader.load_model

        def load_model(*a, **k):
            hold(point)
            return real_load(*a, **k)
        loader.load_model = load_model
        return
    g = importlib.import_module("decoding.generate")  # (decoding.generate, the attribute, is the function)

    real_prefill, real_step = g._Batch.prefill, g.decode_step

    def prefill(self, *a, **k):
        count["prefill"] += 1
        count["decode"] = 0
        if kind == "prefill" and count["prefill"] == n[0]:
            hold(point)
        return real_prefill(self, *a, **k)

    def decode_step(*a, **k):
        count["decode"] += 1
        if kind == "decode" and count["prefill"] == n[0] and count["decode"] == n[1]:
            hold(point)
        return real_step(*a, **k)
    g._Batch.prefill, g.decode_step = prefill, decode_step
    if kind == "batch":
        from bench.loop import Bench

        real_rounds = Bench._rounds

        def rounds(self, *a, **k):
            count["batch"] += 1
            if count["batch"] == n[0]:
                hold(point)
            return real_rounds(self, *a, **k)
        Bench._rounds = rounds


if __name__ == "__main__":
    point, target, argv = sys.argv[1], sys.argv[2], sys.argv[3:]
    if target == "bench":
        import bench.run as run  # (without a GPU it switches the Triton interpreter on first, as the script does)

        install(point)
        sys.argv = ["bench/run.py"] + argv
        run.entry()
    else:
        import decoding.cli as cli

        install(point)
        sys.argv = ["python -m decoding"] + argv
        cli.entry()

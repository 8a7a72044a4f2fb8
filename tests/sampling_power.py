"""Measures the sampling-exactness tests' error rates (tests/test_verify_exact.py): how often a
run fails an exact verifier (false failures) and how often it catches a 3% total-variation
shift of each kind, and each mutant verifier, over many seeds.

    PYTHONPATH=. python tests/sampling_power.py [--samples N] [--null-runs R] [--runs R] [--mutant-runs R]

The null and shift runs draw N sequences from the law itself (the target, or the target
shifted) and apply the test's own functions; a mutant's runs generate with the mutant verifier
(real seeded generators), as the test does. One thread: it runs for minutes on a shared machine.
"""

import argparse
import math
import sys
import time
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sampling_stats import (MUTANTS, SETTINGS, World, apply_mutant, conditionals, exactness_pvalues,  # noqa: E402
                            rejects, run_sampled, sample_law, shift_conditional, shift_joint, target_joint,
                            tv_distance)
from test_sampling_reference import reference_probs  # noqa: E402
from test_verify_exact import N_SAMPLES, NOMINAL_ALPHA, WORLD_SEED  # noqa: E402

TV = 0.03
SHIFTS = [(f"token {d} conditional, {shape}", d, shape) for d in (1, 3, 5) for shape in ("cell", "top", "spread")] \
    + [("joint, one cell", 0, "cell"), ("joint, spread over all cells", 0, "spread")]


def rate(hits: int, runs: int) -> str:
    """The rate with a 95% Wilson interval."""
    p, z = hits / runs, 1.96
    centre = (p + z * z / (2 * runs)) / (1 + z * z / runs)
    half = z * math.sqrt(p * (1 - p) / runs + z * z / (4 * runs * runs)) / (1 + z * z / runs)
    return f"{hits}/{runs} = {p:.4f} (95% CI {max(0.0, centre - half):.4f} .. {min(1.0, centre + half):.4f})"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=N_SAMPLES)
    ap.add_argument("--null-runs", type=int, default=20_000)
    ap.add_argument("--runs", type=int, default=1000)
    ap.add_argument("--mutant-runs", type=int, default=20)
    ap.add_argument("--alphas", default=str(NOMINAL_ALPHA),
                    help="comma list of the run's significance levels to report (one measurement serves all)")
    args = ap.parse_args()
    alphas = [float(a) for a in args.alphas.split(",")]

    def scaled(pvalues: dict) -> float:  # a run rejects at alpha when this is below alpha
        return min(pvalues.values()) * len(pvalues)

    def report(prefix: str, values: list[float], runs: int) -> str:
        return "; ".join(f"alpha {a:g}: {prefix}{rate(sum(v < a for v in values), runs)}" for a in alphas)
    torch.set_num_threads(1)
    world = World(WORLD_SEED)
    for name, sp in SETTINGS.items():
        target = target_joint(world, sp, reference_probs)
        conds = conditionals(target)
        gen = torch.Generator().manual_seed(0)
        t = time.time()
        null = [scaled(exactness_pvalues(sample_law(target, args.samples, gen), target, conds))
                for _ in range(args.null_runs)]
        print(f"[{name}] N={args.samples}: false failures {report('', null, args.null_runs)} "
              f"({time.time() - t:.0f} s)")
        for label, depth, shape in SHIFTS:
            law = shift_conditional(target, depth, TV, shape) if depth else shift_joint(target, TV, shape)
            hits = [scaled(exactness_pvalues(sample_law(law, args.samples, gen), target, conds))
                    for _ in range(args.runs)]
            print(f"[{name}]   {label} (TV {tv_distance(law, target):.4f}): detected {report('', hits, args.runs)}")
        sys.stdout.flush()
    for label in MUTANTS if args.mutant_runs > 0 else ():
        with pytest.MonkeyPatch.context() as mp:
            kind, sp = apply_mutant(mp, label)
            target = target_joint(world, sp, reference_probs)
            conds = conditionals(target)
            hits = sum(rejects(exactness_pvalues(run_sampled(kind, world, sp, args.samples, 1000 + s), target, conds),
                               alphas[0]) for s in range(args.mutant_runs))
        print(f"mutant {label!r} ({kind}): detected {rate(hits, args.mutant_runs)}")
        sys.stdout.flush()


if __name__ == "__main__":
    main()

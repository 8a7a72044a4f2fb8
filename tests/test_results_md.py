"""bench/RESULTS.md and the README's headline table are generated from results files: the
committed text must be what ``bench/results_md.py`` writes, so neither can drift from the data."""

from pathlib import Path

from bench import results_md

ROOT = Path(__file__).resolve().parents[1]


def test_results_md_is_what_the_script_writes():
    assert (ROOT / "bench" / "RESULTS.md").read_text() == results_md.render(), \
        "bench/RESULTS.md is stale or edited by hand: run python bench/results_md.py"


def test_every_run_is_a_results_file_under_bench_results():
    for rel, note in results_md.RUNS:
        assert rel.startswith("bench/results/") and (ROOT / rel).is_file() and note



def test_readme_headline_is_the_first_run():
    assert results_md.headline() in (ROOT / "README.md").read_text(), \
        "the README's headline table differs from python -c 'from bench.results_md import headline; print(headline())'"

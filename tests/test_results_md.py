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


def test_a_batched_run_without_decoding_times_says_so(monkeypatch):
    """A batched run's records from before decode_s: time_s is a share of the batch's wall time and
    ttft_s the batch's prefill, so their difference is no decoding time (it was printed, negative);
    the section says there is none. With decode_s, its ms per token and speedups."""
    def rec(method, decode_s=None):
        r = {"method": method, "task": "code", "new_tokens": 11, "forwards": 10, "time_s": 0.5, "ttft_s": 2.0,
             "identical_to_ar": True, "step_tokens": 10}
        return r if decode_s is None else dict(r, decode_s=decode_s)

    head = {"dtype": "float32", "kernel": "torch", "batch_size": 4}
    runs = {"old": {"header": head, "records": [rec("ar"), rec("pld")]},
            "new": {"header": head, "records": [rec("ar", 0.2), rec("pld", 0.1)]}}
    monkeypatch.setattr(results_md, "load", lambda rel: runs[rel])
    old = "\n".join(results_md.run_section("old", "note"))
    assert "No decoding times after the first token" in old
    assert "| ar | 22.0 | 1.00 | - | - |" in old
    new = "\n".join(results_md.run_section("new", "note"))
    assert "No decoding times" not in new and "| pld | 22.0 | 1.00 | 2.00 | 10.00 |" in new

"""bench/run.py end to end on a user's prompt file: every method's records, transformers beside
them, results.json / results.md / chart.png, and a malformed file rejected with its line."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FIELDS = ("task", "method", "prompt_tokens", "new_tokens", "forwards", "tau", "tok_s", "identical_to_ar",
          "output_ids")


def test_user_prompt_file_with_compare_hf(tmp_path, capsys):
    from bench.run import main

    prompts = tmp_path / "mine.jsonl"
    prompts.write_text(
        json.dumps({"task": "qa", "prompt": "Read: The cat sat on the mat. The cat is black. "
                                            "Question: What colour is the cat?"}) + "\n"
        + json.dumps({"task": "chat", "messages": [{"role": "user", "content": "Name three primary colours."}]})
        + "\n" + json.dumps({"task": "qa", "prompt": "word " * 9000}) + "\n")  # longer than the context
    out = tmp_path / "out"
    rc = main(["--prompts", str(prompts), "--methods", "pld,lookahead+pld", "--max-new-tokens", "12",
               "--compare-hf", "--out", str(out)])
    assert rc == 0
    err = capsys.readouterr().err
    assert "exceeds the model context of 8192 tokens; skipped" in err  # the long record, named; the rest ran
    data = json.loads((out / "results.json").read_text())
    assert len(data["header"]["skipped"]) == 1
    assert {"device", "dtype", "kernel", "model", "versions"} <= set(data["header"])
    recs = data["records"]
    methods = ("ar", "pld", "lookahead+pld", "hf", "hf-pld")
    assert sorted((r["task"], r["method"]) for r in recs) == sorted((t, m) for t in ("qa", "chat") for m in methods)
    for r in recs:
        assert all(f in r for f in FIELDS), r.keys()
        assert r["new_tokens"] == len(r["output_ids"]) and 0 < r["new_tokens"] <= 12
        assert r["forwards"] >= 1 and r["tau"] == pytest.approx(r["new_tokens"] / r["forwards"])
        assert r["tok_s"] > 0
        # greedy: every method (ours lossless, transformers' the same model) gives AR's tokens
        assert r["identical_to_ar"] is True, (r["method"], r["task"])
    md = (out / "results.md").read_text()
    assert "hf-pld" in md and "lookahead+pld" in md
    assert (out / "chart.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_malformed_prompt_file_rejected_with_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"task": "qa", "prompt": "fine"}) + "\n" + '{"task": "qa", "prompt": ""}\n')
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "run.py"), "--prompts", str(bad),
                           "--out", str(tmp_path / "o")], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert "line 2" in proc.stderr and "error:" in proc.stderr, proc.stderr
    assert not (tmp_path / "o").exists()


def test_report_tau_ratio_to_hf_pld_is_a_mean_over_tasks():
    from bench.report import markdown, summarize

    def rec(method, task, new, fwd, secs):
        return {"method": method, "task": task, "new_tokens": new, "forwards": fwd, "time_s": secs,
                "identical_to_ar": True, "step_tokens": None}

    records = [rec("ar", "a", 10, 10, 1.0), rec("hf-pld", "a", 10, 5, 1.0), rec("pld", "a", 10, 5, 0.5),
               rec("ar", "b", 30, 30, 3.0), rec("hf-pld", "b", 30, 10, 1.0), rec("pld", "b", 30, 5, 1.0)]
    s = summarize(records)
    assert s[("pld", "a")]["speedup"] == pytest.approx(2.0) and s[("pld", "b")]["tau"] == pytest.approx(6.0)
    assert s[("pld", "all")]["tau"] == pytest.approx(40 / 10)  # pooled over prompts
    md = markdown(records, {}, ["ar", "pld", "hf-pld"], ["a", "b"])
    # per task 2/2 = 1.00 and 6/3 = 2.00; the mean over tasks 1.50 (not the pooled 4 / 2.67)
    assert "| pld | 1.00 | 2.00 | 1.50 |" in md

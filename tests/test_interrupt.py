"""SIGINT and SIGTERM sent to real child processes of ``python -m decoding`` and bench/run.py
on the default model, at the model load, in a prefill, in the decoding steps and (bench)
between batches: the exit status is the shell's (130, 143), no traceback, what was streamed
stays on stdout with its stats line, and the benchmark's results.json / results.md hold every
batch the progress bar counted as finished, the header marked ``interrupted``, no file half
written. Each child holds at its point (tests/interrupt_child.py) until the signal comes."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHILD = ROOT / "tests" / "interrupt_child.py"
WAIT_S = 240  # for the hold point: a first load of the default model packs its weights


def interrupt_at(point: str, target: str, argv: list[str], sig: int, tmp_path: Path) -> tuple[int, str, str]:
    """Run the child, send ``sig`` once it holds at ``point``; (exit status, stdout, stderr)."""
    out, err = tmp_path / "stdout", tmp_path / "stderr"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    with out.open("wb") as fo, err.open("wb") as fe:
        proc = subprocess.Popen([sys.executable, str(CHILD), point, target] + argv, cwd=ROOT, env=env,
                                stdout=fo, stderr=fe)
        try:
            end = time.monotonic() + WAIT_S
            while f"@hold {point}" not in err.read_text(errors="replace"):
                assert proc.poll() is None, f"the child ended before {point}:\n{err.read_text()}"
                assert time.monotonic() < end, f"no hold at {point} in {WAIT_S} s"
                time.sleep(0.05)
            proc.send_signal(sig)
            rc = proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return rc, out.read_text(), err.read_text()


def no_traceback(err: str) -> None:
    assert "Traceback" not in err, err


# ---------------------------------------------------------------- python -m decoding

CLI = ["Write a haiku about caches.", "--method", "pld", "--max-new-tokens", "32", "--no-plan"]


def test_cli_ctrl_c_while_decoding_keeps_the_text_and_prints_its_stats(tmp_path):
    rc, out, err = interrupt_at("decode:1:4", "decoding", CLI, signal.SIGINT, tmp_path)
    assert rc == 130
    no_traceback(err)
    assert out.strip()  # the text streamed before Ctrl-C stays
    m = re.search(r"\[pld\] (\d+) tokens in .* finish: interrupted \(SIGINT\)", err)
    assert m, err
    assert int(m.group(1)) >= 4  # the prefill's token and three steps' (the fourth step never ran)
    assert "tokens gained per step -> steps: " in err


@pytest.mark.parametrize("point, says", [("prefill:1", "[pld] interrupted (SIGINT) before the first token"),
                                         ("load", "interrupted (SIGINT) before generating: nothing was streamed")])
def test_cli_ctrl_c_before_the_first_token(tmp_path, point, says):
    rc, out, err = interrupt_at(point, "decoding", CLI, signal.SIGINT, tmp_path)
    assert rc == 130
    no_traceback(err)
    assert out == ""
    assert says in err


# ---------------------------------------------------------------- bench/run.py

PROMPTS = [{"task": "qa", "prompt": "Read: The cat sat on the mat. The cat is black. Question: What colour is it?"},
           {"task": "qa", "prompt": "Name three primary colours."}]


def bench_args(tmp_path: Path) -> list[str]:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    # two batches of one prompt, ar and pld on each; without the planner's step-cost measurement
    return ["--prompts", str(prompts), "--methods", "pld", "--max-new-tokens", "16", "--no-plan",
            "--out", str(tmp_path / "out")]


def finished_turns(err: str) -> int:
    """Prompt turns the progress bar counted as finished before the hold (tqdm's "k/2")."""
    before = err.split("@hold")[0]
    counts = re.findall(r"(\d+)/2 \[", before)
    return int(counts[-1]) if counts else 0


# The warm-up runs ar and pld once (prefills 1, 2), the first batch ar and pld (3, 4): prefill 5
# and the decoding after it are the second batch's, and so is the second call of the rounds.
@pytest.mark.parametrize("point, sig", [("batch:2", signal.SIGTERM), ("prefill:5", signal.SIGINT),
                                        ("decode:6:3", signal.SIGTERM), ("load", signal.SIGINT)],
                         ids=["between-batches-SIGTERM", "prefill-SIGINT", "decoding-SIGTERM", "load-SIGINT"])
def test_bench_keeps_every_finished_batch(tmp_path, point, sig):
    rc, out, err = interrupt_at(point, "bench", bench_args(tmp_path), sig, tmp_path)
    name = signal.Signals(sig).name
    assert rc == 128 + sig  # 130 for SIGINT, 143 for SIGTERM
    no_traceback(err)
    done = finished_turns(err)
    assert done == (0 if point == "load" else 1)
    res = tmp_path / "out"
    data = json.loads((res / "results.json").read_text())
    assert data["header"]["interrupted"] == name
    assert data["header"]["incomplete"] == f"interrupted by {name} after {done} of 2 prompt turns"
    recs = data["records"]
    assert sorted(r["method"] for r in recs) == sorted(["ar", "pld"] * done)
    assert all(r["turn"] == 1 and r["new_tokens"] == len(r["output_ids"]) > 0 for r in recs)
    assert len({r["conversation"] for r in recs}) == done
    md = (res / "results.md").read_text()
    assert f"- **interrupted**: {name}" in md
    if done:
        assert "| pld | qa | 1 |" in md
    assert sorted(p.name for p in res.iterdir()) == ["results.json", "results.md"]  # no temporary file left
    last = err.strip().splitlines()[-1]
    assert last == (f"interrupted ({name}): the {2 * done} records of the {done} of 2 prompt turns finished are in "
                    f"{res / 'results.json'} and {res / 'results.md'}")

"""bench/run.py end to end on a user's prompt file and on a Spec-Bench question file: every
method's records, transformers beside them, results.json / results.md / chart.png /
accept_hist.png / answers files, repeats, and malformed files rejected with their line."""

import json
import statistics
import subprocess
import sys
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

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
    assert data["header"]["cuda graphs"] == "off"  # said either way (on: what the graphs did)
    assert data["header"]["exact"].startswith("off")  # which path computed the products and attention
    origin = data["header"]["step_cost_curve"]["origin"]  # where the planner's curve came from
    assert origin == "measured" or origin.startswith(("cache (checked now: 1 tokens", "measured again (")), origin
    assert data["header"]["step cost"].endswith(origin)
    loads = data["header"]["loads"]  # each model's load time and memory peak
    assert set(loads) == {"target", "hf target"} and all(x["s"] > 0 and x["peak_mem_mib"] > 0 for x in loads.values())
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


def test_a_run_that_fails_keeps_the_batches_it_finished(tmp_path, monkeypatch, capsys):
    """results.json is written after every batch: a failure in the second batch leaves the
    first batch's records (every method's) readable, the header saying where and why it stopped."""
    from bench.loop import Bench
    from bench.report import main as report
    from bench.run import main

    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"task": "qa", "prompt": "Name a colour."}) + "\n"
                       + json.dumps({"task": "qa", "prompt": "Name a fruit."}) + "\n")
    out = tmp_path / "out"
    real, during = Bench._rounds, []

    def rounds(self, *a, **k):
        if (out / "results.json").exists():  # the second batch: the first one is on disk already
            during.append(json.loads((out / "results.json").read_text()))
            raise RuntimeError("the machine fell over")
        return real(self, *a, **k)

    monkeypatch.setattr(Bench, "_rounds", rounds)
    with pytest.raises(RuntimeError, match="the machine fell over"):
        main(["--prompts", str(prompts), "--methods", "pld", "--max-new-tokens", "4", "--no-plan", "--out", str(out)])
    assert during[0]["header"]["incomplete"] == ("1 of 2 prompt turns measured when this was written (the run "
                                                 "went on)")
    data = json.loads((out / "results.json").read_text())
    assert sorted((r["conversation"], r["method"]) for r in data["records"]) == [("p-1", "ar"), ("p-1", "pld")]
    assert data["header"]["incomplete"] == ("the run stopped after 1 of 2 prompt turns: RuntimeError: the machine "
                                            "fell over")
    assert all(r["new_tokens"] == 4 and r["identical_to_ar"] for r in data["records"])
    assert f"the 2 records measured before it are in {out / 'results.json'}" in capsys.readouterr().err
    report([str(out / "results.json")])  # and the report renders what was kept
    assert "| pld |" in (out / "results.md").read_text()


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



def test_report_decode_speedup_leaves_out_the_prefill():
    """After the first token: (new tokens - 1) over (time - TTFT) per method, over ar's; a batched
    run's from each record's decode_s (its share of the batch's decoding time), none without it."""
    from bench.report import markdown, summarize

    def rec(method, new, secs, ttft):
        return {"method": method, "task": "a", "new_tokens": new, "forwards": new, "time_s": secs,
                "ttft_s": ttft, "identical_to_ar": True, "step_tokens": None}

    # the same 2 s prefill: 1.5x faster overall, 3x faster after the first token
    records = [rec("ar", 101, 5.0, 2.0), rec("pld", 101, 3.0, 2.0 - 1e-9)]
    s = summarize(records)
    assert s[("pld", "a")]["speedup"] == pytest.approx(5 / 3)
    assert s[("pld", "a")]["decode_speedup"] == pytest.approx(3.0)
    assert s[("ar", "a")]["decode_tok_s"] == pytest.approx(100 / 3)
    assert "| pld | 3.00 |" in markdown(records, {"batch_size": 1}, ["ar", "pld"], ["a"])
    no_ttft = [dict(r, ttft_s=None) for r in records]
    speedup = summarize(no_ttft)[("pld", "a")]["decode_speedup"]
    assert speedup != speedup  # nan
    # batched: time_s is a share of the batch's wall time and ttft_s the batch's prefill, so without
    # decode_s there is no decoding time (it was a negative one); with it, its numbers
    batched = summarize(records, batch_size=4)[("pld", "a")]
    assert batched["decode_tok_s"] != batched["decode_tok_s"] and batched["decode_speedup"] != batched["decode_speedup"]
    timed = [dict(records[0], decode_s=4.0), dict(records[1], decode_s=1.0)]
    assert summarize(timed, batch_size=4)[("pld", "a")]["decode_speedup"] == pytest.approx(4.0)
    assert summarize(timed)[("ar", "a")]["decode_tok_s"] == pytest.approx(25.0)  # decode_s first at batch 1 too
    md = markdown(timed, {"batch_size": 4}, ["ar", "pld"], ["a"])
    assert "a batch's decoding time after its prefill" in md and "| pld | 4.00 |" in md


def test_a_batch_decoding_time_is_shared_by_the_tokens_decoded(monkeypatch):
    """measure: each repeat's decoding time is its wall time after the last sequence's first token
    (None where one had none); a record's decode_s is its share of the batch's, by the tokens it
    decoded after its first; merge keeps every round's."""
    from bench import measure as bm
    from bench.loop import Bench

    now = iter([0.0, 1.0, 1.5, 4.0,   # repeat 1: start, first tokens at 1.0 and 1.5, end at 4.0
                10.0, 11.0, 12.0])    # repeat 2: start, sequence 0's first token, end (1 never had one)
    monkeypatch.setattr(bm.time, "perf_counter", lambda: next(now))
    firsts = [[0, 1], [0]]

    def call(clock):
        for i in firsts.pop(0):
            clock(i, [7])
        return [{"output_ids": [1] * 5}, {"output_ids": [1] * 3}], {}

    mem = SimpleNamespace(cuda=False, start=lambda: None, stop=lambda: (1.0, 0.0))
    m = bm.measure(call, 2, 2, mem)
    assert m.decode_secs == [2.5, None] and m.secs == [4.0, 2.0]
    assert bm.merge([m, bm.Measured(m.outputs, [3.0], [0.5, 0.5], 1.0, 0.0, {}, [1.0])]).decode_secs == [2.5, None, 1.0]
    b = Bench.__new__(Bench)
    b.sp, b.text = SimpleNamespace(greedy=True), lambda ids: ""
    conv = {"rec": {"id": "q", "question_id": 1, "task": "code", "next_turns": []}, "turn": 1}
    for o in m.outputs:
        o.update(forwards=1, step_tokens=None, accept_lengths=[], finish_reason="length", stats=None)
    one = bm.Measured(m.outputs, [4.0], [1.0, 1.5], 1.0, 0.0, {}, [2.5])
    recs = [b._record(conv, "ar", [1], one, j, [1] * 5) for j in (0, 1)]
    assert [r["decode_s"] for r in recs] == [pytest.approx(2.5 * 4 / 6), pytest.approx(2.5 * 2 / 6)]
    assert b._record(conv, "ar", [1], m, 0, [1] * 5)["decode_s"] is None  # a repeat without it

def test_report_speedup_pairs_the_rounds(tmp_path):
    """With repeats, speedup is the median over rounds of the ratio within a round (the rounds
    are interleaved), not the ratio of the medians, with its min-max in the table and the chart."""
    from bench.report import chart, markdown, summarize

    def rec(method, runs):
        return {"method": method, "task": "a", "new_tokens": 12, "forwards": 12, "time_s": statistics.median(runs),
                "time_s_runs": runs, "identical_to_ar": True, "step_tokens": None}

    # per round 1 / 0.9, 2 / 1, 4 / 3: median 4 / 3 (the ratio of medians would be 2)
    records = [rec("ar", [1.0, 2.0, 4.0]), rec("pld", [0.9, 1.0, 3.0])]
    x = summarize(records)[("pld", "a")]
    assert x["speedup"] == pytest.approx(4 / 3)
    assert (x["speedup_min"], x["speedup_max"]) == (pytest.approx(1 / 0.9), pytest.approx(2.0))
    assert x["tok_s"] == pytest.approx(12.0)  # tokens/s stays the median of its own runs
    assert "| 12.0 | 4.0-13.3 | 1.33 | 1.11-2.00 |" in markdown(records, {}, ["ar", "pld"], ["a"])
    one = [dict(r, time_s_runs=r["time_s_runs"][:1], time_s=r["time_s_runs"][0]) for r in records]
    y = summarize(one)[("pld", "a")]
    assert y["speedup"] == pytest.approx(1 / 0.9) and y["speedup_min"] is None
    assert chart(records, ["ar", "pld"], ["a"], tmp_path / "c.png").is_file()


# ----------------------------------------------------------------------------- Spec-Bench files, repeats, answers

QUESTIONS = [
    {"question_id": 81, "category": "writing",
     "turns": ["Write one sentence about Hawaii.", "Now rewrite your sentence so that it starts with 'Aloha'."]},
    {"question_id": "qa-1", "category": "qa", "reference": ["black"],
     "turns": ["Read: The cat sat on the mat. The cat is black. Question: What colour is the cat?"]},
]


@pytest.fixture(scope="module")
def specbench_run(tmp_path_factory):
    """One small run on a Spec-Bench question file (a 2-turn and a 1-turn question), two
    repeats; shared by the tests below."""
    from bench.run import main

    d = tmp_path_factory.mktemp("specbench")
    q = d / "question.jsonl"
    q.write_text("".join(json.dumps(x) + "\n" for x in QUESTIONS))
    out = d / "out"
    assert main(["--prompts", str(q), "--methods", "pld", "--max-new-tokens", "8", "--repeats", "2",
                 "--out", str(out)]) == 0
    return out, json.loads((out / "results.json").read_text())


def _chat_ids(tok, messages):
    return tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)


def test_specbench_two_turns_each_after_its_own_answer(specbench_run, smol):
    out, data = specbench_run
    _, tok = smol
    recs = {(r["conversation"], r["turn"], r["method"]): r for r in data["records"]}
    assert sorted(recs) == sorted((c, t, m) for c, t in (("81", 1), ("81", 2), ("qa-1", 1)) for m in ("ar", "pld"))
    assert {r["task"] for r in data["records"]} == {"writing", "qa"}  # category -> task
    for m in ("ar", "pld"):
        first, second = recs[("81", 1, m)], recs[("81", 2, m)]
        assert second["id"] == "81-turn2" and second["question_id"] == 81
        turns = QUESTIONS[0]["turns"]
        assert second["messages"] == [{"role": "user", "content": turns[0]},
                                      {"role": "assistant", "content": first["text"]},
                                      {"role": "user", "content": turns[1]}]
        # the prompt the model got is those messages, chat-formatted
        assert second["prompt_tokens"] == len(_chat_ids(tok, second["messages"]))
        assert first["prompt_tokens"] == len(_chat_ids(tok, second["messages"][:1]))


def test_specbench_answers_files(specbench_run):
    out, data = specbench_run
    for m in ("ar", "pld"):
        lines = [json.loads(x) for x in (out / f"answers_{m}.jsonl").read_text().splitlines()]
        assert [a["question_id"] for a in sorted(lines, key=lambda a: str(a["question_id"]))] == [81, "qa-1"]
        for a in lines:
            assert {"question_id", "category", "answer_id", "model_id", "choices", "tstamp"} <= set(a)
            assert a["model_id"] == f"smollm2-{m}" and a["tstamp"] > 0
            recs = sorted((r for r in data["records"] if r["method"] == m and r["question_id"] == a["question_id"]),
                          key=lambda r: r["turn"])
            assert a["category"] == recs[0]["task"]
            (c,) = a["choices"]
            assert c["index"] == 0 and c["turns"] == [r["text"] for r in recs]
            assert c["new_tokens"] == [r["new_tokens"] for r in recs]
            assert c["wall_time"] == [r["time_s"] for r in recs] and all(t > 0 for t in c["wall_time"])
            assert c["decoding_steps"] == [r["forwards"] for r in recs]
            # every turn's steps, concatenated; each turn's first token came from its prefill
            assert c["accept_lengths"] == [n for r in recs for n in r["accept_lengths"]]
            assert sum(c["accept_lengths"]) == sum(r["new_tokens"] - 1 for r in recs)
        assert len(next(a for a in lines if a["question_id"] == 81)["choices"][0]["turns"]) == 2


def test_repeats_give_median_and_spread(specbench_run):
    out, data = specbench_run
    assert data["header"]["repeats"].startswith("2 ") and "incomplete" not in data["header"]  # it finished
    for r in data["records"]:
        assert r["repeats"] == 2 and len(r["time_s_runs"]) == 2 and len(r["tok_s_runs"]) == 2
        assert r["tok_s"] == pytest.approx(statistics.median(r["tok_s_runs"]))
        assert r["tok_s_min"] == min(r["tok_s_runs"]) and r["tok_s_max"] == max(r["tok_s_runs"])
        assert r["time_s"] == pytest.approx(statistics.median(r["time_s_runs"]))
    md = (out / "results.md").read_text()
    assert "| tokens/s | min-max |" in md
    row = next(line for line in md.splitlines() if line.startswith("| pld | all |"))
    lo, hi = (float(x) for x in row.split("|")[7].strip().split("-"))
    assert 0 < lo <= hi


def test_results_hold_text_ttft_memory_and_step_sizes(specbench_run, smol):
    out, data = specbench_run
    _, tok = smol
    eos = set(smol[0].cfg.eos_token_ids)
    assert "VmHWM" in data["header"]["memory"] or "max_memory_allocated" in data["header"]["memory"] \
        or "ru_maxrss" in data["header"]["memory"]
    for r in data["records"]:
        ids = r["output_ids"]
        assert r["text"] == tok.decode([t for t in ids if t not in eos], skip_special_tokens=True)
        assert r["text"] and not any(t in eos for t in ids[:-1])
        assert 0 < r["ttft_s"] < max(r["time_s_runs"])  # batch 1: time_s is the whole call
        assert r["peak_mem_mib"] > 100 and 0 <= r["peak_mem_rise_mib"] <= r["peak_mem_mib"]
        assert len(r["accept_lengths"]) == r["forwards"]
        assert {str(k): v for k, v in Counter(r["accept_lengths"]).items()} == r["stats"]["accepted_hist"]
    md = (out / "results.md").read_text()
    assert "| TTFT ms | peak MiB (+run) |" in md
    assert (out / "accept_hist.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_results_split_each_batchs_steps_into_phases(specbench_run):
    """The batch's step phases sit on its first record (ours only), count its forwards, and the
    report's table is their mean per step over the records."""
    from bench.report import phase_summary
    from decoding.stats import PHASES

    out, data = specbench_run
    for r in data["records"]:
        ph = r["step_phases"]
        assert set(ph["ms"]) == set(PHASES) and ph["steps"] == r["forwards"]  # batch 1: its own forwards
        assert all(v >= 0 for v in ph["ms"].values()) and ph["ms"]["forward"] > 0
    got = phase_summary(data["records"])
    pld = [r["step_phases"] for r in data["records"] if r["method"] == "pld"]
    steps = sum(p["steps"] for p in pld)
    assert got["pld"]["steps"] == steps
    assert got["pld"]["propose"] == pytest.approx(sum(p["ms"]["propose"] for p in pld) / steps)
    assert got["pld"]["host"] == pytest.approx(sum(got["pld"][p] for p in PHASES if p != "forward"))
    md = (out / "results.md").read_text()
    assert "### where a decoding step's time goes" in md
    assert next(line for line in md.splitlines() if line.startswith("| pld | " + str(steps) + " | "))
    # the step planner's table sets the measured forward beside the curve's prediction
    row = next(line for line in md.splitlines() if line.startswith("| pld | ") and line.count("|") == 9)
    assert row.split("|")[6].strip() == f"{got['pld']['forward']:.1f}"


def test_a_run_replays_the_step_cost_curve_of_another(specbench_run, tmp_path):
    """Every planned run writes OUT/step_cost.json; --step-cost FILE --fixed-plan plans another
    run with exactly that curve, says so in the header and writes the same curve again."""
    from bench.run import main
    from models.cost import load_step_cost

    out, data = specbench_run
    saved = out / "step_cost.json"
    assert load_step_cost(saved).ms == data["header"]["step_cost_curve"]["ms"]
    q = tmp_path / "question.jsonl"
    q.write_text(json.dumps(QUESTIONS[1]) + "\n")
    assert main(["--prompts", str(q), "--methods", "pld", "--max-new-tokens", "8", "--step-cost", str(saved),
                 "--fixed-plan", "--out", str(tmp_path / "o")]) == 0
    head = json.loads((tmp_path / "o" / "results.json").read_text())["header"]
    assert head["step_cost_curve"]["origin"] == f"file {saved}" and head["step cost"].endswith(f"file {saved}")
    assert str(saved) in head["step planner"] and "fixed" in head["step planner"]
    assert load_step_cost(tmp_path / "o" / "step_cost.json") == load_step_cost(saved)


def test_malformed_specbench_record_rejected_with_line_and_field(tmp_path):
    bad = tmp_path / "question.jsonl"
    bad.write_text(json.dumps(QUESTIONS[0]) + "\n" + json.dumps({"question_id": 2, "category": "qa", "turns": "hi"})
                   + "\n")
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "run.py"), "--prompts", str(bad),
                           "--out", str(tmp_path / "o")], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert "line 2" in proc.stderr and "'turns'" in proc.stderr and "error:" in proc.stderr, proc.stderr
    assert not (tmp_path / "o").exists()


def test_next_turn_sees_each_methods_own_answer():
    """Under sampling the methods answer differently: each one's next turn carries its own
    answer (checked on the loop alone, with stand-in models)."""
    from bench.loop import Bench
    from bench.measure import Measured

    asked = []

    def timed(name, prompts, max_new, repeats):
        asked.append((name, prompts))
        return [(Measured([{"output_ids": [ord(c) for c in name.upper()], "forwards": 1, "stats": None,
                            "step_tokens": None, "finish_reason": "length", "accept_lengths": []}],
                          [1.0], [0.1], 1.0, 0.0), 0) for _ in prompts]

    b = Bench.__new__(Bench)
    b.args = SimpleNamespace(max_new_tokens=4, batch_size=1, repeats=1)
    b.methods, b.hf_methods, b.skipped, b.sp = ["ar", "pld"], set(), [], SimpleNamespace(greedy=False)
    b.model = SimpleNamespace(cfg=SimpleNamespace(max_position_embeddings=10_000))
    b.encode = lambda msgs: [ord(c) for c in json.dumps(msgs)]
    b.text = lambda ids: "".join(map(chr, ids))
    b.timed = timed
    recs = b.run([{"id": "q", "question_id": 1, "task": "chat", "messages": [{"role": "user", "content": "one"}],
                   "next_turns": ["two", "three"]}])
    assert [(r["method"], r["turn"]) for r in recs] == [("ar", 1), ("pld", 1), ("ar", 2), ("pld", 2), ("ar", 3),
                                                         ("pld", 3)]
    last = {r["method"]: r["messages"] for r in recs if r["turn"] == 3}
    for m in ("ar", "pld"):
        assert [x["content"] for x in last[m]] == ["one", m.upper(), "two", m.upper(), "three"]
    assert ("pld", [b.encode(last["pld"])]) in asked and ("ar", [b.encode(last["ar"])]) in asked
    assert all(r["identical_to_ar"] is None for r in recs)


def test_repeats_run_in_interleaved_rounds():
    """--repeats N: N rounds, each running every method once (one repeat per call), each round
    starting one method later; a record holds every round's time and the first round's output."""
    from bench.loop import Bench
    from bench.measure import Measured

    asked = []

    def timed(name, prompts, max_new, repeats):
        asked.append((name, repeats))
        k = sum(1 for n, _ in asked[3:] if n == name)  # this method's round (after the 3 warm-up calls)
        return [(Measured([{"output_ids": [1, 2, k], "forwards": 2, "stats": None, "step_tokens": None,
                            "finish_reason": "length", "accept_lengths": []}],
                          [float(10 * k)], [0.1 * k], 100.0 + k, float(k)), 0) for _ in prompts]

    b = Bench.__new__(Bench)
    b.args = SimpleNamespace(max_new_tokens=3, batch_size=1, repeats=3)
    b.methods, b.hf_methods, b.skipped, b.sp = ["ar", "pld", "jacobi"], set(), [], SimpleNamespace(greedy=True)
    b.model = SimpleNamespace(cfg=SimpleNamespace(max_position_embeddings=10_000))
    b.encode = lambda msgs: [ord(c) for c in json.dumps(msgs)]
    b.text = lambda ids: "".join(map(chr, ids))
    b.timed = timed
    recs = b.run([{"id": "q", "question_id": 1, "task": "code", "messages": [{"role": "user", "content": "x"}],
                   "next_turns": []}])
    assert asked[3:] == [("ar", 1), ("pld", 1), ("jacobi", 1), ("pld", 1), ("jacobi", 1), ("ar", 1),
                         ("jacobi", 1), ("ar", 1), ("pld", 1)]
    assert [r["method"] for r in recs] == ["ar", "pld", "jacobi"]
    for r in recs:
        assert r["repeats"] == 3 and r["time_s_runs"] == [10.0, 20.0, 30.0] and r["time_s"] == 20.0
        assert r["output_ids"] == [1, 2, 1] and r["identical_to_ar"] is True
        assert r["ttft_s"] == pytest.approx(0.2) and r["peak_mem_mib"] == 103.0 and r["peak_mem_rise_mib"] == 3.0


def test_shared_store_sees_earlier_batches_never_its_own_rounds():
    """--shared-store: suffix and hybrid draft from one store per method for the whole run; a
    batch's finished sequences go in after its last round (the first round's), so no round of
    a prompt sees its own output, later batches see it once, other methods get no store."""
    from bench.loop import Bench, HeldStore
    from bench.measure import Measured

    seen = []

    def timed(name, prompts, max_new, repeats):  # stands in for the real one's store handling
        store = b._held_store(name)
        seen.append((name, None if store is None else len(store.store.trie.text)))
        if store is not None:
            assert isinstance(store, HeldStore)
            for p in prompts:
                store.add(p[:3] + [len(seen)])  # what generate's proposer would finish
            b.finished[name] = store.pending
        return [(Measured([{"output_ids": [1, 2], "forwards": 2, "stats": None, "step_tokens": None,
                            "finish_reason": "length", "accept_lengths": []}], [1.0], [0.1], 1.0, 0.0), 0)
                for _ in prompts]

    b = Bench.__new__(Bench)
    b.args = SimpleNamespace(max_new_tokens=2, batch_size=1, repeats=2, shared_store=True)
    b.methods, b.hf_methods, b.skipped, b.sp = ["ar", "suffix"], set(), [], SimpleNamespace(greedy=True)
    b.model = SimpleNamespace(cfg=SimpleNamespace(max_position_embeddings=10_000))
    b.encode = lambda msgs: [ord(c) for c in json.dumps(msgs)]
    b.text = lambda ids: "".join(map(chr, ids))
    b.stores, b.finished, b.timed = {}, {}, timed
    b.run([{"id": f"q{i}", "question_id": i, "task": "code", "messages": [{"role": "user", "content": f"x{i}"}],
            "next_turns": []} for i in range(2)])
    # the warm-up (2 calls), then two batches of two rounds each; each sequence adds 4 tokens and a separator
    assert seen == [("ar", None), ("suffix", 0), ("ar", None), ("suffix", 0), ("suffix", 0), ("ar", None),
                    ("ar", None), ("suffix", 5), ("suffix", 5), ("ar", None)]
    # the first batch's first round's sequence (the 4th call), once; the second batch's after it
    first = b.encode([{"role": "user", "content": "x0"}])[:3] + [4]
    assert b.stores["suffix"].trie.text[:5] == first + [-1] and len(b.stores["suffix"].trie.text) == 10
    b.args.shared_store = False
    assert b._held_store("suffix") is None


def test_merge_rejects_no_rounds():
    from bench.measure import merge

    with pytest.raises(ValueError, match="rounds is empty"):
        merge([])


def test_sampled_runs_say_n_a_for_identical():
    from bench.report import markdown

    recs = [{"method": m, "task": "a", "new_tokens": 4, "forwards": 4, "time_s": 1.0, "identical_to_ar": None,
             "step_tokens": None} for m in ("ar", "pld")]
    md = markdown(recs, {}, ["ar", "pld"], ["a"])
    rows = [line for line in md.splitlines() if line.startswith(("| ar | a |", "| pld | a |"))]
    assert len(rows) == 2 and all(line.endswith("| n/a |") for line in rows)


# ----------------------------------------------------------------------------- transformers baselines


def test_hf_generate_takes_the_sampling_and_pld_knobs_and_an_assistant(monkeypatch):
    from bench.hf_compare import hf_generate
    from decoding.sampling import SamplingParams
    from tests.helpers import tiny_hf_model

    model = tiny_hf_model()
    prompt = [5, 6, 7, 8, 5, 6, 7]
    greedy = hf_generate(model, prompt, "hf", 8, ())
    steps = []
    assisted = hf_generate(model, prompt, "hf-assisted", 8, (), assistant=tiny_hf_model(),
                           on_tokens=lambda i, t: steps.append(t))
    assert assisted["output_ids"] == greedy["output_ids"]  # greedy assisted generation is lossless
    assert [t for s in steps for t in s] == assisted["output_ids"] and assisted["forwards"] < greedy["forwards"]
    sp = SamplingParams(temperature=1.0, top_k=20, top_p=0.9, seed=3)
    a, b = (hf_generate(model, prompt, "hf", 8, (), sampling=sp)["output_ids"] for _ in range(2))
    c = hf_generate(model, prompt, "hf", 8, (), sampling=SamplingParams(temperature=1.0, seed=4))["output_ids"]
    assert a == b and a != c  # the seed is honoured
    seen = {}
    real = model.generate
    monkeypatch.setattr(model, "generate", lambda ids, **kw: (seen.update(kw), real(ids, **kw))[1])
    hf_generate(model, prompt, "hf-pld", 4, (), sampling=sp, pld=(2, 5))
    assert (seen["prompt_lookup_num_tokens"], seen["max_matching_ngram_size"]) == (5, 2)
    assert (seen["do_sample"], seen["temperature"], seen["top_k"], seen["top_p"]) == (True, 1.0, 20, 0.9)


def _fake_bench(device: str, graphs: bool):
    """A stand-in for Bench's state: what its warm-up reads and calls, recorded."""
    calls = []
    fake = SimpleNamespace(
        args=SimpleNamespace(device=device, cuda_graphs=graphs, max_new_tokens=10, batch_size=2),
        methods=["ar", "pld", "hybrid"], graph_warm_up=None,
        encode=lambda msgs: [0] * len(msgs[0]["content"]),
        timed=lambda name, prompts, new, repeats: calls.append((name, [len(p) for p in prompts], new, repeats)),
        tok=SimpleNamespace(encode=lambda text: [0] * len(text)),
        model=SimpleNamespace(cfg=SimpleNamespace(max_position_embeddings=100)))
    return fake, calls


RECORDS = [{"messages": [{"role": "user", "content": "x" * 30}], "next_turns": ["y" * 5]},
           {"messages": [{"role": "user", "content": "x" * 12}], "next_turns": []},
           {"messages": [{"role": "user", "content": "x" * 50}], "next_turns": []}]


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_warm_up_runs_every_method_and_on_a_gpu_the_longest_prefill(device, monkeypatch):
    """Before anything is timed: every method on the shortest prompt; on a GPU also ar on the
    longest and on a batch of the longest (Triton compiles a long prefill's kernels on first
    use) and a K/V-moving commit; graphs only when asked."""
    from bench.loop import Bench
    from models.runner import ModelRunner

    from decoding import prompt_lookup

    fake, calls = _fake_bench(device, graphs=False)
    host = prompt_lookup.HOST_SEARCH_TOKENS
    timed = fake.timed
    searched = []  # the host-search threshold each warm-up call ran under

    def record(name, prompts, new, repeats):
        searched.append(prompt_lookup.HOST_SEARCH_TOKENS)
        timed(name, prompts, new, repeats)
    fake.timed = record
    fake._warm_up_graphs = lambda records: pytest.fail("graphs warmed up without --cuda-graphs")
    runner = SimpleNamespace(warm_up_commit=lambda: calls.append("commit"))
    monkeypatch.setattr(ModelRunner, "for_batch", staticmethod(lambda model, prompts, new: runner))
    Bench._warm_up(fake, RECORDS)
    want = [(m, [12], 4, 1) for m in fake.methods] + (
        [("ar", [50], 2, 1), ("ar", [30, 50], 2, 1), "commit"] if device == "cuda" else [])
    assert calls == want
    # on a GPU the methods' warm-up runs the n-gram search on the device (its kernel compiles there)
    assert searched[:3] == [0 if device == "cuda" else host] * 3 and prompt_lookup.HOST_SEARCH_TOKENS == host
    calls.clear()
    Bench._warm_up(fake, [])
    assert calls == []


def test_graph_warm_up_sizes_the_runner_for_the_longest_conversation(monkeypatch):
    """The shared runner is sized for the longest conversation: its first prompt plus, per later
    turn, an answer of --max-new-tokens, the question and 16 template tokens, within the context."""
    from bench.loop import Bench
    from models.runner import ModelRunner

    fake, calls = _fake_bench("cuda", graphs=True)
    seen = []

    def warm(model, batch, longest, new):
        seen.append((batch, longest, new))
        return dict(captured=18, seconds=1.5, cache_tokens=4096, failed=None)
    monkeypatch.setattr(ModelRunner, "warm_up_shared", staticmethod(warm))
    monkeypatch.setattr(ModelRunner, "for_batch", staticmethod(
        lambda model, prompts, new: SimpleNamespace(warm_up_commit=lambda: calls.append("commit"))))
    fake._warm_up_graphs = lambda records: Bench._warm_up_graphs(fake, records)
    Bench._warm_up(fake, RECORDS)
    assert seen == [(2, 61, 10)]  # 30 + (10 + 5 + 16): the two-turn conversation outgrows the 50-token prompt
    assert fake.graph_warm_up["captured"] == 18 and calls[-3:] == [("ar", [50], 2, 1), ("ar", [30, 50], 2, 1),
                                                                   "commit"]
    seen.clear()
    Bench._warm_up_graphs(fake, RECORDS[:1] + [{"messages": [{"role": "user", "content": "x" * 40}],
                                                "next_turns": ["q" * 20, "q" * 20]}])
    assert seen == [(2, 90, 10)]  # 40 + 2 x (10 + 20 + 16) = 132, capped at the context 100 - 10


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the no-GPU path")
def test_run_switches_the_triton_interpreter_on_before_the_kernels_are_defined():
    """Without a GPU, importing bench/run.py turns TRITON_INTERPRET on before any project module
    defines a kernel (`--kernel triton` on a CPU died with '0 active drivers' when the flags'
    module had imported the kernels first). In a fresh process without the variable."""
    import os

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    code = ("import sys; sys.argv = ['run.py']; sys.path.insert(0, 'bench'); import run; "
            "from kernels import kv_ops; print(type(kv_ops._kv_store_kernel).__name__)")
    out = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[1], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "InterpretedFunction"


def test_compare_vllm_records_and_report_with_a_fake_vllm(tmp_path, monkeypatch, capsys):
    """--compare-vllm: each vLLM method's records in our format beside ours, identity against
    vLLM plain and our ar, the header's load lines and the report's comparison; the vLLM child is
    faked (tests/test_vllm.py runs the real one), a missing venv is a warning and the rest runs."""
    import bench.vllm_compare as vc
    from bench.run import main

    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"task": "qa", "prompt": "Name a colour."}) + "\n")
    monkeypatch.setenv("SPECDEC_VLLM_VENV", str(tmp_path / "no-venv"))
    out = tmp_path / "missing"
    assert main(["--prompts", str(prompts), "--methods", "pld", "--max-new-tokens", "4", "--no-plan",
                 "--compare-vllm", "--out", str(out)]) == 0
    assert "make vllm" in capsys.readouterr().err
    data = json.loads((out / "results.json").read_text())
    assert data["header"]["vllm"].startswith("not run: --compare-vllm needs vLLM")
    assert sorted(r["method"] for r in data["records"]) == ["ar", "pld"]

    calls = []

    def fake_run(method, ps, max_new, threads, *, model, k, pld, python, timeout_s=3600):
        calls.append((method, threads, k))
        ar = [r for r in json.loads((out / "results.json").read_text())["records"] if r["method"] == "ar"]
        ids = ar[0]["output_ids"] if method != "vllm-suffix" else [0] * max_new  # one engine disagrees
        fw = len(ids) - 1 if method == "vllm" else 2
        return {"load": {"s": 1.5, "peak_mem_mib": 900, "rise_mib": 400}, "engine": "vllm-cpu (fake)",
                "records": [{"output_ids": ids, "forwards": fw, "time_s": 0.1 * (fw + 1), "ttft_s": 0.05,
                             "accept_lengths": [1] * fw, "finish_reason": "length", "peak_mem_mib": 950,
                             "peak_mem_rise_mib": 10} for _ in ps]}

    monkeypatch.setattr(vc, "vllm_python", lambda venv=None: Path(sys.executable))
    monkeypatch.setattr(vc, "run_method", fake_run)
    out = tmp_path / "out"
    assert main(["--prompts", str(prompts), "--methods", "pld", "--max-new-tokens", "4", "--no-plan",
                 "--compare-vllm", "--out", str(out)]) == 0
    data = json.loads((out / "results.json").read_text())
    assert [c[0] for c in calls] == list(vc.VLLM_METHODS) and calls[0][2] == 10  # --pld's draft length
    recs = {r["method"]: r for r in data["records"]}
    assert set(recs) == {"ar", "pld", *vc.VLLM_METHODS}
    assert recs["vllm-specdec"]["identical_to_vllm"] is True and recs["vllm-suffix"]["identical_to_vllm"] is False
    assert recs["vllm-specdec"]["tau"] == pytest.approx(4 / 2)
    assert set(data["header"]["vllm_loads"]) == set(vc.VLLM_METHODS)
    assert "vllm-ngram 1.5 s, peak 900 MiB" in data["header"]["vllm loads"]
    assert data["header"]["suffix store"].startswith("shared by the run's prompts")  # like vLLM's suffix method
    md = (out / "results.md").read_text()
    assert "### vLLM on the same prompts" in md and "our drafter inside vLLM: tau" in md
    assert "our ar: tokens/s" in md and "our best speculative method (pld)" in md


def test_shared_store_flag(tmp_path):
    from bench.run import parse_args

    assert parse_args(["--out", str(tmp_path)]).shared_store is False
    assert parse_args(["--shared-store", "--out", str(tmp_path)]).shared_store is True
    assert parse_args(["--compare-vllm", "--out", str(tmp_path)]).shared_store is True
    # like for like on the weights too: vLLM runs the dequantised fp32 ones
    assert parse_args(["--compare-vllm", "--out", str(tmp_path)]).weights == "fp32"
    assert parse_args(["--compare-vllm", "--weights", "native", "--out", str(tmp_path)]).weights == "native"
    assert parse_args(["--out", str(tmp_path)]).weights is None


@pytest.mark.parametrize("flags, message", [
    (["--temperature", "0.7"], "compares greedy outputs"),
    (["--batch-size", "2"], "one prompt at a time"),
])
def test_compare_vllm_flags_checked_before_loading(flags, message, capsys):
    from bench.run import main

    with pytest.raises(SystemExit):
        main(["--methods", "pld", "--compare-vllm"] + flags)
    assert message in capsys.readouterr().err


def test_batch_size_groups_the_prompts_of_one_task():
    """--batch-size 2: each timed call decodes at most 2 prompts, all of one task, every prompt
    once per method."""
    from bench.loop import Bench
    from bench.measure import Measured

    asked = []

    def timed(name, prompts, max_new, repeats):
        if max_new == 5:  # not the warm-up's short calls
            asked.append((name, [p[-1] for p in prompts]))
        return [(Measured([{"output_ids": [1], "forwards": 1, "stats": None, "step_tokens": None,
                            "finish_reason": "length", "accept_lengths": []}] * len(prompts),
                          [1.0], [0.1] * len(prompts), 1.0, 0.0), i) for i in range(len(prompts))]

    b = Bench.__new__(Bench)
    b.args = SimpleNamespace(max_new_tokens=5, batch_size=2, repeats=1)
    b.methods, b.hf_methods, b.skipped, b.sp = ["ar", "pld"], set(), [], SimpleNamespace(greedy=True)
    b.model = SimpleNamespace(cfg=SimpleNamespace(max_position_embeddings=10_000))
    b.encode = lambda msgs: [len(msgs[0]["content"])]  # a prompt's last id tells which record it is
    b.text = lambda ids: "x"
    b.timed = timed
    recs = [{"id": str(n), "question_id": n, "task": task, "messages": [{"role": "user", "content": "q" * n}],
             "next_turns": []} for n, task in ((1, "code"), (2, "qa"), (3, "code"), (4, "code"))]
    out = b.run(recs)
    assert len(out) == 8 and all(r["identical_to_ar"] for r in out)
    for m in ("ar", "pld"):
        batches = [p for name, p in asked if name == m]
        assert batches == [[1, 3], [4], [2]]  # code's three prompts in batches of 2, then qa's


def test_the_header_says_whether_the_host_glue_ran_in_c(monkeypatch):
    from bench.run import _host_path
    from decoding import compiled
    from models import packing

    monkeypatch.setattr(compiled.cbuild, "_host", {"compiled": True})
    if not compiled.available() or compiled.EXT.get() is None or packing.EXT.get() is None:
        pytest.skip("the compiled host path or its extensions did not build here")
    assert _host_path().endswith("their glue in C (CPython extensions)")
    monkeypatch.setattr(packing.cbuild, "_glue", {"on": False})
    assert _host_path().endswith("their glue in Python (switched off)")
    monkeypatch.setattr(compiled.cbuild, "_host", {"compiled": False})
    assert _host_path() == "reference (switched to it)"


def test_a_cpu_is_named_by_its_model_family_and_l3():
    """Results of two CPUs say which is which (bench headers, RESULTS.md's sections): the first
    processor's model name, family and model numbers, and the L3."""
    from bench.measure import env_cpu_name
    from models.machine import describe_cpu
    info = ("processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 207\n"
            "model name\t: Intel(R) Xeon(R) Processor\n\nprocessor\t: 1\ncpu family\t: 7\nmodel\t\t: 1\n"
            "model name\t: another\n")
    assert describe_cpu(info, 307200) == "Intel(R) Xeon(R) Processor, family 6 model 207, L3 300 MiB"
    assert describe_cpu(info, 512) == "Intel(R) Xeon(R) Processor, family 6 model 207, L3 512 KiB"
    assert describe_cpu("model name : X\n", None) == "X"
    name = env_cpu_name()
    assert name.startswith("CPU (") and name.endswith(" threads)")

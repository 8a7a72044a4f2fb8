"""bench/llamacpp_compare.py without llama.cpp: the request, the records made from llama-server's
answers, the report's section, the server's life (started, asked, always stopped) with a fake
llama-server, and bench/run.py --compare-llamacpp wired end to end with it. The real llama-server:
tests/test_llamacpp.py (marker ``llamacpp``, ``make test-llamacpp``)."""

import json
import os
import stat
import sys
import time
from pathlib import Path

import pytest

from bench import llamacpp_compare as lc

HELP = ("--repack, -nr, --no-repack              whether to enable weight repacking (default: enabled)\n"
        "----- speculative -----\n"
        "--spec-type [none|draft-simple|draft-eagle3|ngram-simple|ngram-map-k|ngram-map-k4v|ngram-mod|ngram-cache]\n"
        "                                        comma-separated list of types of speculative decoding\n")

# A stand-in for llama-server: --help and --version as the real one prints them, else an HTTP
# server on --port whose /health is 503 for its first call, and whose /completion answers
# n_predict tokens counting up from 100 with timings (and draft counts with --spec-type).
FAKE_SERVER = r'''
import json, sys, time
from http.server import BaseHTTPRequestHandler, HTTPServer

argv = sys.argv[1:]
if "--help" in argv:
    print(HELP)
    sys.exit(0)
if "--version" in argv:
    print("version: 1 (fake)")
    sys.exit(0)
if "--fail" in argv:
    print("error: the model file is not a GGUF", flush=True)
    sys.exit(3)
port = int(argv[argv.index("--port") + 1])
spec = argv[argv.index("--spec-type") + 1] if "--spec-type" in argv else None
with open(LOG, "a") as f:
    f.write(json.dumps(argv) + "\n")
if SIGILL and "--no-repack" not in argv:  # as llama.cpp's AMX products on a CPU that refuses them
    import os, signal
    os.kill(os.getpid(), signal.SIGILL)
calls = {"health": 0}

class H(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def send(self, code, obj):
        body = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        calls["health"] += 1
        self.send(503 if calls["health"] == 1 else 200, {"status": "ok"})

    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if "--die-on-request" in argv:  # as a product that dies at the first batched step
            import os, signal
            os.kill(os.getpid(), signal.SIGILL)
        n = req["n_predict"]
        t = {"prompt_n": len(req["prompt"]), "prompt_ms": 2.0 * len(req["prompt"]), "predicted_n": n,
             "predicted_ms": 10.0 * (n - 1)}
        if spec:
            t.update(draft_n=n, draft_n_accepted=n // 2)
        self.send(200, {"content": "x" * n, "tokens": list(range(100, 100 + n)), "timings": t,
                        "stop_type": "limit", "request": req})

HTTPServer(("127.0.0.1", port), H).serve_forever()
'''

FAKE_BENCH = r'''
import json, os, signal, sys
if SIGILL and "--repack" not in sys.argv:
    os.kill(os.getpid(), signal.SIGILL)
print(json.dumps([{"avg_ts": 50.5, "stddev_ts": 1.25, "model_type": "fake 135M", "build_commit": "abc",
                   "build_number": 1}]))
'''


def fake_build(folder: Path, sigill: bool = False, help_text: str = HELP) -> Path:
    """folder/bin/llama-server and llama-bench as executable Python scripts (with ``sigill``, each
    dies of SIGILL unless its repacking is off); returns the server's argv log (one line per
    server started)."""
    (folder / "bin").mkdir(parents=True)
    log = folder / "argv.log"
    for name, body in (("llama-server", FAKE_SERVER), ("llama-bench", FAKE_BENCH)):
        p = folder / "bin" / name
        p.write_text(f"#!{sys.executable}\nHELP = {help_text!r}\nLOG = {str(log)!r}\nSIGILL = {sigill!r}\n{body}")
        p.chmod(p.stat().st_mode | stat.S_IXUSR)
    return log


def test_spec_types_offered_from_help():
    real = "--spec-type none,draft-simple,ngram-simple,ngram-mod   comma-separated list of types\n"
    assert lc.spec_types_offered(real) == ["none", "draft-simple", "ngram-simple", "ngram-mod"]
    assert lc.spec_types_offered(HELP) == ["none", "draft-simple", "draft-eagle3", "ngram-simple", "ngram-map-k",
                                           "ngram-map-k4v", "ngram-mod", "ngram-cache"]
    assert lc.spec_types_offered("--threads N\n") == []


def test_request_is_greedy_over_token_ids_without_prompt_cache():
    body = lc.request_body([1, 2, 3], 64)
    assert body["prompt"] == [1, 2, 3] and body["n_predict"] == 64
    assert body["temperature"] == 0 and body["top_k"] == 1 and body["ignore_eos"] is False
    assert body["cache_prompt"] is False and body["return_tokens"] is True and body["stream"] is False


def test_context_size_holds_the_longest_prompt_its_tokens_and_a_draft():
    assert lc.context_size([[0] * 10, [0] * 700], 128) == 1280  # 700 + 128 + 256 = 1084 -> 5 blocks of 256
    assert lc.context_size([[0]], 1) % 256 == 0


AR = {"id": "qa-1#1", "conversation": "qa-1", "question_id": "qa-1", "turn": 1, "task": "qa",
      "output_ids": [5, 6, 7, 8, 2]}


def answer(tokens, prompt_ms=200.0, predicted_ms=80.0, **draft):
    return {"content": "text", "tokens": tokens, "stop_type": "eos", "wall_s": 0.31,
            "timings": {"prompt_n": 100, "prompt_ms": prompt_ms, "predicted_n": len(tokens),
                        "predicted_ms": predicted_ms, **draft}}


def test_record_of_plain_decoding():
    r = lc.record(AR, list(range(100)), [answer([5, 6, 7, 8, 2])], "llamacpp", None)
    assert r["method"] == "llamacpp" and r["new_tokens"] == 5 and r["prompt_tokens"] == 100
    assert r["forwards"] == 4 and r["tau"] == pytest.approx(5 / 4)  # one forward per token after the first
    assert r["ttft_s"] == pytest.approx(0.2) and r["time_s"] == pytest.approx(0.28)
    assert r["tok_s"] == pytest.approx(5 / 0.28)
    assert r["decode_tok_s"] == pytest.approx(4 / 0.08)  # llama.cpp's predicted_per_second
    assert r["prefill_tok_s"] == pytest.approx(100 / 0.2)
    assert r["identical_to_ar"] is True and r["identical_to_llamacpp"] is None
    assert r["finish_reason"] == "eos" and r["wall_s"] == 0.31 and r["output_ids"] == [5, 6, 7, 8, 2]
    for k in ("id", "conversation", "question_id", "turn", "task"):
        assert r[k] == AR[k]


def test_record_of_speculation_counts_forwards_from_accepted_drafts():
    toks = [5, 6, 7, 9, 1, 1, 1, 1, 1, 1, 1]
    r = lc.record(AR, [0] * 100, [answer(toks, draft_n=12, draft_n_accepted=6)], "llamacpp-ngram-mod",
                  [5, 6, 7, 9, 1, 1, 1, 1, 1, 1, 1])
    assert r["forwards"] == 11 - 1 - 6 and r["tau"] == pytest.approx(11 / 4)
    assert r["stats"]["draft_tokens"] == 12 and r["stats"]["draft_accepted"] == 6
    assert r["identical_to_ar"] is False and r["identical_to_llamacpp"] is True
    assert r["same_prefix_as_ar"] == 3  # 5, 6, 7 then 9 against 8
    with pytest.raises(ValueError, match="predicted_n 12 but returned 11"):
        bad = answer(toks)
        bad["timings"]["predicted_n"] = 12
        lc.record(AR, [0], [answer(toks), bad], "llamacpp", None)


def test_methods_are_plain_and_the_offered_ngram_types_with_defaults_and_sized_as_pld():
    got = lc.methods(["none", "ngram-simple", "ngram-mod", "ngram-cache"], (2, 7))
    assert got == {"llamacpp": (), "llamacpp-ngram-simple": ("--spec-type", "ngram-simple"),
                   "llamacpp-ngram-simple-n2k7": ("--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "2",
                                                  "--spec-ngram-simple-size-m", "7"),
                   "llamacpp-ngram-mod": ("--spec-type", "ngram-mod")}
    assert lc.methods([], (3, 10)) == {"llamacpp": ()}


def test_record_of_rounds_takes_median_times_and_says_whether_the_rounds_agree():
    runs = [answer([5, 6, 7, 8, 2], prompt_ms=p, predicted_ms=d) for p, d in ((200, 80), (260, 40), (300, 120))]
    r = lc.record(AR, [0] * 100, runs, "llamacpp", None)
    assert r["repeats"] == 3 and r["time_s_runs"] == pytest.approx([0.28, 0.3, 0.42])
    assert r["time_s"] == pytest.approx(0.3) and r["ttft_s"] == pytest.approx(0.26)
    assert r["decode_tok_s"] == pytest.approx(4 / 0.08)  # the median time after the first token
    assert r["tok_s_runs"] == pytest.approx([5 / 0.28, 5 / 0.3, 5 / 0.42]) and r["tok_s"] == pytest.approx(5 / 0.3)
    assert r["rounds_agree"] is True and len(r["stats"]["timings"]) == 3
    runs[1] = answer([5, 6, 7, 9, 2])
    assert lc.record(AR, [0] * 100, runs, "llamacpp", None)["rounds_agree"] is False


def test_missing_build_names_make_llamacpp(tmp_path):
    with pytest.raises(ValueError, match="make llamacpp"):
        lc.binary("llama-server", tmp_path)


def test_server_answers_and_is_always_stopped(tmp_path):
    log = fake_build(tmp_path)
    exe = tmp_path / "bin" / "llama-server"
    with lc.Server(exe, tmp_path / "m.gguf", 3, 512, ("--spec-type", "ngram-mod"), ready_s=30) as s:
        pid = s.proc.pid
        out = s.complete([1, 2, 3], 4)
        assert out["tokens"] == [100, 101, 102, 103] and out["wall_s"] > 0
        assert out["request"] == lc.request_body([1, 2, 3], 4)
    assert s.proc.poll() is not None  # stopped on leaving
    argv = json.loads(log.read_text().splitlines()[0])
    for flag, value in (("--host", "127.0.0.1"), ("--threads", "3"), ("--threads-batch", "3"), ("--parallel", "1"),
                        ("--ctx-size", "512"), ("--spec-type", "ngram-mod")):
        assert argv[argv.index(flag) + 1] == value
    with pytest.raises(RuntimeError, match="boom"):
        with lc.Server(exe, tmp_path / "m.gguf", 1, 512) as s:
            pid = s.proc.pid
            raise RuntimeError("boom")
    assert s.proc.poll() is not None
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_server_that_fails_or_never_listens_is_a_clear_error(tmp_path):
    fake_build(tmp_path)
    exe = tmp_path / "bin" / "llama-server"
    with pytest.raises(RuntimeError, match=r"exited \(code 3\) before it was ready[\s\S]*not a GGUF"):
        with lc.Server(exe, tmp_path / "m.gguf", 1, 512, ("--fail",)):
            pass
    silent = tmp_path / "silent"
    silent.write_text(f"#!{sys.executable}\nimport time\nprint('loading', flush=True)\ntime.sleep(60)\n")
    silent.chmod(0o755)
    t = time.perf_counter()
    with pytest.raises(RuntimeError, match=r"not ready after 1 s[\s\S]*loading") as e:
        with lc.Server(silent, tmp_path / "m.gguf", 1, 512, ready_s=1):
            pass
    assert time.perf_counter() - t < 20, e


def test_a_server_dead_during_a_request_is_named_with_its_signal(tmp_path):
    """A server that dies while it answers: ServerDied with its exit status (-SIGILL), not a
    timeout, so compare() can tell a refused instruction from a slow server."""
    import signal

    fake_build(tmp_path)
    exe = tmp_path / "bin" / "llama-server"
    with pytest.raises(lc.ServerDied, match="exited \\(code -4\\) during a request") as e:
        with lc.Server(exe, tmp_path / "m.gguf", 1, 512, ("--die-on-request",), ready_s=30) as s:
            s.complete([1, 2, 3], 4)
    assert e.value.returncode == -signal.SIGILL and lc.died_of_sigill(e.value)


def rec(method, new, secs, ttft, ident=True, prompt=100, **extra):
    return {"id": "a#1", "method": method, "task": "a", "turn": 1, "new_tokens": new, "forwards": new - 1,
            "time_s": secs, "ttft_s": ttft, "prompt_tokens": prompt, "identical_to_ar": ident,
            "step_tokens": None, **extra}


def test_report_section_puts_decode_and_prefill_apart():
    from bench.report import llamacpp_section, markdown

    records = [rec("ar", 101, 3.0, 1.0), rec("suffix", 101, 2.0, 1.0),
               rec("llamacpp", 101, 1.5, 0.5, ident=False, identical_to_llamacpp=True,
                   stats={"draft_tokens": 0, "draft_accepted": 0}),
               rec("llamacpp-ngram-mod", 101, 1.25, 0.5, ident=False, identical_to_llamacpp=True,
                   stats={"draft_tokens": 40, "draft_accepted": 30}, same_prefix_as_ar=12)]
    methods = ["ar", "suffix", "llamacpp", "llamacpp-ngram-mod"]
    lines = llamacpp_section(records, methods)
    text = "\n".join(lines)
    assert lines[0] == "### llama.cpp on the same prompts"
    # decode: 100 tokens over the time after the first; prefill: 100 prompt tokens over TTFT
    assert "| ar | 50.0 | 0.50 | 100 | 1000 | 33.7 |" in text
    assert "| llamacpp | 100.0 | 1.00 | 200 | 500 |" in text
    assert "| llamacpp-ngram-mod | 133.3 | 1.33 | 200 | 500 |" in text and "| 30 / 40 | 100% | 0% | 12.0 |" in text
    assert "- our ar: decode tokens/s 0.50x llama.cpp plain, prefill 0.50x" in text
    assert "- llama.cpp's best speculation (llamacpp-ngram-mod): decode tokens/s 1.33x llama.cpp plain" in text
    assert "- our best speculative method (suffix): decode tokens/s 0.75x llama.cpp's best (llamacpp-ngram-mod)" in text
    assert text in markdown(records, {"batch_size": 1}, methods, ["a"])
    assert llamacpp_section(records[:2], methods[:2]) == []


@pytest.mark.parametrize("flags, message", [
    (["--temperature", "0.7"], "compares greedy outputs"),
    (["--batch-size", "2"], "one prompt at a time"),
    (["--device", "cuda"], "--device cpu"),
])
def test_compare_llamacpp_flags_checked_before_loading(flags, message, capsys):
    from bench.run import main

    with pytest.raises(SystemExit):
        main(["--methods", "pld", "--compare-llamacpp"] + flags)
    assert message in capsys.readouterr().err


def test_compare_llamacpp_in_bench_run_with_a_fake_server(tmp_path, monkeypatch, capsys):
    """bench/run.py --compare-llamacpp: without the build a warning naming `make llamacpp` and
    the rest runs; with a (fake) build, llama.cpp plain and every n-gram type the server offers
    on the first turns, their records beside ours, the header's lines and results.md's section."""
    from bench.run import main

    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"task": "qa", "prompt": "Name a colour."}) + "\n")
    monkeypatch.setenv("SPECDEC_LLAMACPP_DIR", str(tmp_path / "no-build"))
    out = tmp_path / "missing"
    assert main(["--prompts", str(prompts), "--methods", "pld", "--max-new-tokens", "4", "--no-plan",
                 "--compare-llamacpp", "--out", str(out)]) == 0
    assert "make llamacpp" in capsys.readouterr().err
    data = json.loads((out / "results.json").read_text())
    assert data["header"]["llamacpp"].startswith("not run: --compare-llamacpp needs llama.cpp's llama-server")
    assert sorted(r["method"] for r in data["records"]) == ["ar", "pld"]

    log = fake_build(tmp_path / "build")
    monkeypatch.setenv("SPECDEC_LLAMACPP_DIR", str(tmp_path / "build"))
    out = tmp_path / "out"
    assert main(["--prompts", str(prompts), "--methods", "pld", "--max-new-tokens", "4", "--no-plan",
                 "--compare-llamacpp", "--out", str(out)]) == 0
    data = json.loads((out / "results.json").read_text())
    recs = {r["method"]: r for r in data["records"]}
    spec = ["llamacpp-ngram-simple", "llamacpp-ngram-simple-n3k10", "llamacpp-ngram-map-k",
            "llamacpp-ngram-map-k-n3k10", "llamacpp-ngram-mod"]
    assert list(recs) == ["ar", "pld", "llamacpp", *spec]
    import torch
    servers = [json.loads(line) for line in log.read_text().splitlines()]
    assert [a[a.index("--spec-type") + 1] if "--spec-type" in a else None for a in servers] == \
        [None, "ngram-simple", "ngram-simple", "ngram-map-k", "ngram-map-k", "ngram-mod"]
    assert servers[2][-4:] == ["--spec-ngram-simple-size-n", "3", "--spec-ngram-simple-size-m", "10"]  # --pld 3,10
    assert all(a[a.index("--threads") + 1] == str(torch.get_num_threads()) for a in servers)
    assert recs["llamacpp"]["prompt_tokens"] == recs["ar"]["prompt_tokens"]
    assert recs["llamacpp"]["output_ids"] == [100, 101, 102, 103] and recs["llamacpp"]["identical_to_ar"] is False
    assert recs["llamacpp-ngram-mod"]["identical_to_llamacpp"] is True
    assert recs["llamacpp-ngram-mod"]["forwards"] == 4 - 1 - 2
    head = data["header"]
    assert head["llamacpp"].startswith("version: 1 (fake); llama-server") and "failed" not in head["llamacpp"]
    assert set(head["llamacpp_loads"]) == {"llamacpp", *spec}
    assert "tg4 50.5 tokens/s (+- 1.2, fake 135M, build abc (1))" in head["llamacpp bench"]
    md = (out / "results.md").read_text()
    assert "### llama.cpp on the same prompts" in md and "our ar: decode tokens/s" in md
    assert (out / "answers_llamacpp-ngram-mod.jsonl").is_file()


def test_compare_runs_interleaved_rounds_with_a_fresh_server_each(tmp_path, monkeypatch):
    """--repeats 2: every llama.cpp method in each round, the second round one method later, a
    server per method and round; records carry both rounds' times."""
    from types import SimpleNamespace

    log = fake_build(tmp_path / "build")
    monkeypatch.setenv("SPECDEC_LLAMACPP_DIR", str(tmp_path / "build"))
    model = tmp_path / "m.gguf"
    model.write_bytes(b"")
    args = SimpleNamespace(model=str(model), max_new_tokens=5, pld_nk=(3, 10), repeats=2)
    bench = SimpleNamespace(args=args, encode=lambda messages: [1, 2, 3], text=lambda ids: f"{len(ids)} tokens")
    ar = dict(AR, method="ar", output_ids=[100, 101, 102, 103, 104])
    head = {}
    recs = lc.compare(bench, [{"id": AR["conversation"], "messages": []}], [ar], head)
    methods = list(lc.methods(lc.spec_types_offered(HELP), (3, 10)))
    assert [r["method"] for r in recs] == methods
    flags = lc.methods(lc.spec_types_offered(HELP), (3, 10))
    servers = [json.loads(line) for line in log.read_text().splitlines()]
    started = [next(m for m, f in reversed(flags.items()) if a[len(a) - len(f):] == list(f)) for a in servers]
    assert started == methods + methods[1:] + methods[:1]
    assert all(r["repeats"] == 2 and len(r["time_s_runs"]) == 2 and r["rounds_agree"] for r in recs)
    assert recs[0]["identical_to_ar"] is True and recs[0]["text"] == "5 tokens"
    assert "median of 2 interleaved rounds" in head["llamacpp"] and "failed" not in head["llamacpp"]


def test_a_server_dead_of_sigill_runs_every_method_again_without_repacking(tmp_path, monkeypatch):
    """A llama-server that dies of SIGILL with its defaults (llama.cpp's AMX products on a CPU that
    refuses them): every method again from the start with --no-repack, llama-bench with --repack 0,
    the header saying so; a server without that flag: every method failed, with its exit code (llama-bench
    dead of SIGILL is retried with --repack 0 all the same)."""
    from types import SimpleNamespace

    model = tmp_path / "m.gguf"
    model.write_bytes(b"")
    args = SimpleNamespace(model=str(model), max_new_tokens=5, pld_nk=(3, 10), repeats=1)
    bench = SimpleNamespace(args=args, encode=lambda messages: [1, 2, 3], text=lambda ids: f"{len(ids)} tokens")
    ar = dict(AR, method="ar", output_ids=[100, 101, 102, 103, 104])
    methods = list(lc.methods(lc.spec_types_offered(HELP), (3, 10)))

    log = fake_build(tmp_path / "build", sigill=True)
    monkeypatch.setenv("SPECDEC_LLAMACPP_DIR", str(tmp_path / "build"))
    head = {}
    recs = lc.compare(bench, [{"id": AR["conversation"], "messages": []}], [ar], head)
    assert [r["method"] for r in recs] == methods
    servers = [json.loads(line) for line in log.read_text().splitlines()]
    assert "--no-repack" not in servers[0] and len(servers) == 1 + len(methods)  # the first died
    assert all(a[-1] == "--no-repack" for a in servers[1:])
    assert "with --no-repack: with its defaults llama-server died of SIGILL" in head["llamacpp"]
    assert "failed" not in head["llamacpp"]
    assert head["llamacpp bench"].startswith("llama-bench -t ") and " --repack 0: tg5 50.5 tokens/s" in \
        head["llamacpp bench"]

    fake_build(tmp_path / "old", sigill=True, help_text=HELP.split("\n", 1)[1])  # no --no-repack offered
    monkeypatch.setenv("SPECDEC_LLAMACPP_DIR", str(tmp_path / "old"))
    head = {}
    assert lc.compare(bench, [{"id": AR["conversation"], "messages": []}], [ar], head) == []
    assert "--no-repack" not in head["llamacpp"].split("; failed: ")[0]
    assert head["llamacpp"].count("exited (code -4) before it was ready") == len(methods)
    assert " --repack 0: tg5 50.5 tokens/s" in head["llamacpp bench"]  # llama-bench retried on its own

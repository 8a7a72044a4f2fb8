"""llama.cpp on the same prompts (``bench/run.py --compare-llamacpp``): llama-server's plain greedy
decoding and its n-gram speculation (``--spec-type``), beside our methods.

``make llamacpp`` builds ``llama-server`` and ``llama-bench`` into ``.llamacpp/bin`` (native CPU
flags). Each llama.cpp method gets its own ``llama-server`` process on the same GGUF file as our
run: one slot, our torch thread count for both its generation and its batch (prefill) threads,
bound to 127.0.0.1 on a free port, stopped when the method is done (on an error or Ctrl-C too).
The prompts go to its ``/completion`` endpoint as token ids, the ids our methods decoded (no second
chat template or tokenizer decides anything), greedy, the same new-token limit, stopping at EOS as
ours do, and without the server's prompt cache (each prompt's prefill is timed in full, as ours).
With ``--repeats N`` every method runs in each of N interleaved rounds, each round one method later,
a fresh server each time; a record's times are the medians over the rounds.

Times are the server's own (the response's ``timings``), not the HTTP round trip (kept as
``wall_s``): ``prompt_ms`` runs from the request's start to the first token (our TTFT),
``predicted_ms`` from the first token to the last, over which llama.cpp counts ``predicted_n - 1``
tokens (its ``predicted_per_second``): the same as our speedup after the first token.
llama-server does not report its forwards; with speculation every verification step brings one
token more than it accepted, so the forwards after the prefill are ``predicted_n - 1 -
draft_n_accepted`` (where a stop falls inside a step's accepted drafts, those past it count as
accepted all the same: the forwards then come out short by at most that step's draft).

Where llama-server dies of SIGILL with its defaults (an instruction the CPU refuses: its AMX products
on an Emerald Rapids VM, bench/results/2026-11-28-cpu-emr-llamacpp), every method runs again from
the start with its weight repacking off (``--no-repack``, which also keeps it off the AMX kernels),
and llama-bench with ``--repack 0``; the header says so. Other failures are reported as they are.

llama.cpp computes on the GGUF's weights as stored (quantised blocks), ours on weights
dequantised to the run's dtype (and llama.cpp rounds the activations to 8 bits for its quantised
products): outputs may differ, ``identical_to_ar`` says which, ``same_prefix_as_ar`` for how many
tokens they agree first.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parent.parent
DEFAULT_DIR = REPO / ".llamacpp"
PLAIN = "llamacpp"
# llama-server's draft-free speculation, those this build offers run (llama-server --help)
SPEC_TYPES = ("ngram-simple", "ngram-map-k", "ngram-mod")
# the two whose lookup and draft lengths are knobs also run with --pld's N and K: llama.cpp's defaults
# (a 12-token lookup, 48-token drafts) rarely match in a short answer
SIZED = {"ngram-simple": "--spec-ngram-simple", "ngram-map-k": "--spec-ngram-map-k"}
# what a server started with after one died of SIGILL with its defaults (llama-server / llama-bench)
NO_REPACK = ("--no-repack",)
BENCH_NO_REPACK = ("--repack", "0")
READY_S = 120.0  # a 135M-7B GGUF loads in seconds; a server not ready by then is reported with its log
REQUEST_S = 900.0


def methods(offered: list[str], pld: tuple[int, int]) -> dict[str, tuple[str, ...]]:
    """llama.cpp's methods, name -> llama-server flags: plain, then each n-gram type the build
    offers with llama.cpp's defaults and, where sized, with lookup length N and draft length K
    (``--pld N,K``, as our pld: ``llamacpp-ngram-simple-n3k10``)."""
    out: dict[str, tuple[str, ...]] = {PLAIN: ()}
    n, k = pld
    for t in SPEC_TYPES:
        if t not in offered:
            continue
        out[f"{PLAIN}-{t}"] = ("--spec-type", t)
        if t in SIZED:
            sized = (f"{SIZED[t]}-size-n", str(n), f"{SIZED[t]}-size-m", str(k))
            out[f"{PLAIN}-{t}-n{n}k{k}"] = ("--spec-type", t, *sized)
    return out


def binary(name: str, folder: Optional[Path] = None) -> Path:
    """``folder/bin/name`` (default ``.llamacpp``, or the folder SPECDEC_LLAMACPP_DIR names);
    ValueError saying how to build it when it is missing."""
    folder = Path(folder or os.environ.get("SPECDEC_LLAMACPP_DIR") or DEFAULT_DIR)
    path = folder / "bin" / name
    if not path.is_file() or not os.access(path, os.X_OK):
        raise ValueError(f"--compare-llamacpp needs llama.cpp's {name}, not found at {path}: build it with "
                         f"`make llamacpp` (a CMake build of two targets; or point SPECDEC_LLAMACPP_DIR at a "
                         f"folder with bin/{name})")
    return path


def spec_types_offered(help_text: str) -> list[str]:
    """The ``--spec-type`` names a ``llama-server --help`` lists (its line reads
    ``--spec-type [none|draft-simple|...|ngram-mod|...]``)."""
    m = re.search(r"--spec-type\s+\[?([a-z0-9|,\-]+)", help_text)
    return re.split(r"[|,]", m.group(1)) if m else []


def free_port() -> int:
    """A port nothing listens on now (the OS picks it); the server binds it a moment later."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def context_size(prompts: list[list[int]], max_new_tokens: int) -> int:
    """Room for the longest prompt, its new tokens and a draft past the end, in 256-token blocks."""
    need = max(len(p) for p in prompts) + max_new_tokens + 256
    return -(-need // 256) * 256


def request_body(ids: list[int], max_new_tokens: int) -> dict:
    """One greedy completion of the token ids, its tokens returned, no prompt cache."""
    return {"prompt": ids, "n_predict": max_new_tokens, "temperature": 0.0, "top_k": 1, "ignore_eos": False,
            "cache_prompt": False, "return_tokens": True, "stream": False}


def peak_rss_mib(pid: int) -> Optional[float]:
    """A process's resident-set high-water mark (``VmHWM``), where /proc has it."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


class ServerDied(RuntimeError):
    """llama-server (or llama-bench) ended by itself; ``returncode`` is its exit status, negative:
    the signal that ended it."""

    def __init__(self, message: str, returncode: int):
        super().__init__(message)
        self.returncode = returncode


def died_of_sigill(e: BaseException) -> bool:
    return isinstance(e, ServerDied) and e.returncode == -signal.SIGILL


class Server:
    """One ``llama-server`` process: ``with Server(...) as s: s.complete(ids, n)``. Started on
    enter (waits, at most ``ready_s``, for its /health), terminated on exit whatever happened.
    Errors raise RuntimeError with the end of the server's log."""

    def __init__(self, exe: Path, model: Path, threads: int, ctx: int, flags: tuple[str, ...] = (),
                 ready_s: float = READY_S, request_s: float = REQUEST_S):
        self.port = free_port()
        self.cmd = [str(exe), "-m", str(model), "--host", "127.0.0.1", "--port", str(self.port),
                    "--threads", str(threads), "--threads-batch", str(threads), "--parallel", "1",
                    "--ctx-size", str(ctx), *flags]
        self.ready_s, self.request_s = ready_s, request_s
        self.proc: Optional[subprocess.Popen] = None
        self.load_s = float("nan")
        self._log = tempfile.NamedTemporaryFile("w+", prefix="llama-server-", suffix=".log", delete=False)

    def log_tail(self, lines: int = 25) -> str:
        try:
            return "\n".join(Path(self._log.name).read_text(errors="replace").strip().splitlines()[-lines:])
        except OSError:
            return ""

    def __enter__(self) -> "Server":
        t = time.perf_counter()
        # its own process group: a Ctrl-C in the terminal reaches us, and we stop it (in __exit__)
        self.proc = subprocess.Popen(self.cmd, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True)
        try:
            self._wait_ready(t)
        except BaseException:
            self.close()
            raise
        self.load_s = time.perf_counter() - t
        return self

    def _wait_ready(self, t0: float) -> None:
        while True:
            if self.proc.poll() is not None:
                raise ServerDied(f"llama-server exited (code {self.proc.returncode}) before it was ready; "
                                 f"command: {' '.join(self.cmd)}\n{self.log_tail()}", self.proc.returncode)
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=5) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass  # not listening yet (or 503 while it loads the model)
            if time.perf_counter() - t0 > self.ready_s:
                raise RuntimeError(f"llama-server was not ready after {self.ready_s:.0f} s; command: "
                                   f"{' '.join(self.cmd)}\n{self.log_tail()}")
            time.sleep(0.1)

    def complete(self, ids: list[int], max_new_tokens: int) -> dict:
        """The server's JSON answer to one completion of ``ids``, with ``wall_s`` (the round trip)."""
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/completion", method="POST",
                                     data=json.dumps(request_body(ids, max_new_tokens)).encode(),
                                     headers={"Content-Type": "application/json"})
        t = time.perf_counter()
        try:
            with urllib.request.urlopen(req, timeout=self.request_s) as r:
                out = json.loads(r.read())
        except urllib.error.HTTPError as e:
            raise RuntimeError(f"llama-server answered {e.code}: {e.read()[:2000].decode(errors='replace')}") from None
        except (urllib.error.URLError, OSError) as e:
            try:  # a server that died drops its connections as it goes: let it be reaped first
                self.proc.wait(timeout=1)
            except subprocess.TimeoutExpired:
                pass
            if self.proc.poll() is not None:
                raise ServerDied(f"llama-server exited (code {self.proc.returncode}) during a request ({e}); its "
                                 f"log:\n{self.log_tail()}", self.proc.returncode) from None
            raise RuntimeError(f"llama-server did not answer within {self.request_s:.0f} s ({e}); its log:\n"
                               f"{self.log_tail()}") from None
        out["wall_s"] = time.perf_counter() - t
        return out

    def peak_rss_mib(self) -> Optional[float]:
        return peak_rss_mib(self.proc.pid) if self.proc is not None and self.proc.poll() is None else None

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self._log.close()

    def __exit__(self, *exc) -> None:
        self.close()
        Path(self._log.name).unlink(missing_ok=True)


def run_method(flags: tuple[str, ...], prompts: list[list[int]], max_new_tokens: int, threads: int, *,
               model: Path, exe: Path) -> dict:
    """One llama.cpp method (its llama-server ``flags``) on the prompts, one server: ``{"load":
    {...}, "responses": [...]}``; an untimed warm-up request first (the shortest prompt, 4 tokens)."""
    with Server(exe, model, threads, context_size(prompts, max_new_tokens), flags) as server:
        server.complete(min(prompts, key=len), 4)
        responses = [server.complete(p, max_new_tokens) for p in prompts]
        peak = server.peak_rss_mib()
    return {"load": {"s": round(server.load_s, 2), "peak_mem_mib": None if peak is None else round(peak)},
            "responses": responses}


def common_prefix(a: list[int], b: list[int]) -> int:
    """How many tokens two outputs share before the first that differs."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def record(ar: dict, prompt: list[int], responses: list[dict], method: str, plain: Optional[list[int]]) -> dict:
    """llama-server's answers to one prompt, one per round, as a record in our format beside our
    ar's record of the same prompt turn (``ar``); ``plain``: llama.cpp plain's tokens for it, when
    run. Tokens and draft counts are the first round's (``rounds_agree`` says whether every round
    gave its tokens); times are medians over the rounds, with each round's in ``time_s_runs``."""
    for g in responses:
        if g["timings"]["predicted_n"] != len(g["tokens"]):
            raise ValueError(f"{method}: llama-server reported predicted_n {g['timings']['predicted_n']} but "
                             f"returned {len(g['tokens'])} tokens")
    first, timings = responses[0], [g["timings"] for g in responses]
    t, ids = first["timings"], list(first["tokens"])
    n = len(ids)
    accepted = t.get("draft_n_accepted", 0)
    forwards = max(n - 1 - accepted, min(n - 1, 1))
    ttft = statistics.median(x["prompt_ms"] / 1e3 for x in timings)
    after = statistics.median(x["predicted_ms"] / 1e3 for x in timings)
    secs_runs = [(x["prompt_ms"] + x["predicted_ms"]) / 1e3 for x in timings]
    rate_runs = [x["predicted_n"] / s if s > 0 else float("nan") for x, s in zip(timings, secs_runs)]
    secs = statistics.median(secs_runs)
    return {
        "id": ar["id"], "conversation": ar["conversation"], "question_id": ar["question_id"], "turn": ar["turn"],
        "task": ar["task"], "method": method, "prompt_tokens": len(prompt), "new_tokens": n, "forwards": forwards,
        "tau": n / max(forwards, 1), "time_s": secs, "tok_s": statistics.median(rate_runs),
        "repeats": len(responses), "time_s_runs": secs_runs, "tok_s_runs": rate_runs, "tok_s_min": min(rate_runs),
        "tok_s_max": max(rate_runs), "ttft_s": ttft,
        "prefill_tok_s": t["prompt_n"] / ttft if ttft > 0 else float("nan"),
        "decode_tok_s": (n - 1) / after if n > 1 and after > 0 else float("nan"),
        "wall_s": statistics.median(g.get("wall_s") or float("nan") for g in responses),
        "peak_mem_mib": None, "peak_mem_rise_mib": None, "step_tokens": None,
        "accept_lengths": None, "identical_to_ar": ids == ar["output_ids"],
        "same_prefix_as_ar": common_prefix(ids, ar["output_ids"]),
        "identical_to_llamacpp": (ids == plain) if plain is not None else None,
        "rounds_agree": all(list(g["tokens"]) == ids for g in responses),
        "finish_reason": ("eos" if first.get("stop_type") == "eos" else
                          "length" if first.get("stop_type") == "limit" else first.get("stop_type")),
        "stats": {"timings": timings, "draft_tokens": t.get("draft_n", 0), "draft_accepted": accepted},
        "plan": None, "text": first.get("content", ""), "output_ids": ids}


def llama_bench(model: Path, threads: int, n_gen: int = 128, exe: Optional[Path] = None,
                timeout_s: float = 600, flags: tuple[str, ...] = ()) -> dict:
    """llama-bench's own tg``n_gen`` (no prompt) on the threads: its JSON result."""
    exe = exe or binary("llama-bench")
    proc = subprocess.run([str(exe), "-m", str(model), "-t", str(threads), "-p", "0", "-n", str(n_gen), "-o", "json",
                           *flags], capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode != 0:
        raise ServerDied(f"llama-bench failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}", proc.returncode)
    return json.loads(proc.stdout)[0]


def version(exe: Path) -> str:
    proc = subprocess.run([str(exe), "--version"], capture_output=True, text=True, timeout=60)
    return " ".join((proc.stdout + proc.stderr).split()) or f"{exe.name} (no version)"


# ---- the parent: bench/run.py --compare-llamacpp --------------------------------------------------

def check_args(args) -> None:
    """What --compare-llamacpp can compare, before any model loads (ValueError naming the flag)."""
    if args.temperature != 0:
        raise ValueError(f"--compare-llamacpp compares greedy outputs: drop --temperature {args.temperature}")
    if args.batch_size != 1:
        raise ValueError(f"--compare-llamacpp runs llama-server one prompt at a time, as ours at --batch-size 1; got "
                         f"--batch-size {args.batch_size}")
    if getattr(args, "emulate_cost", None) is not None:
        raise ValueError("--emulate-cost pads this project's forwards only, not llama.cpp's: drop --compare-llamacpp")
    if not args.device.startswith("cpu"):
        raise ValueError(f"--compare-llamacpp runs the CPU build of llama.cpp (make llamacpp): --device cpu, got "
                         f"--device {args.device}")


def run_rounds(names: dict[str, tuple[str, ...]], extra: tuple[str, ...], prompts: list[list[int]], args,
               threads: int, model: Path, exe: Path, retry_sigill: bool
               ) -> tuple[dict[str, list[dict]], list[str], bool]:
    """Every method (``names``: its flags, then ``extra``) in ``args.repeats`` interleaved rounds, each
    starting one method later, as ours (bench/loop.py): per method run_method's answer in each
    round, the failures, and whether it stopped at a server dead of SIGILL (only with
    ``retry_sigill``; else that is a failure like another)."""
    runs: dict[str, list[dict]] = {m: [] for m in names}
    failed: list[str] = []
    for i in range(args.repeats):
        order = list(names)[i % len(names):] + list(names)[:i % len(names)]
        for method in order:
            if any(f.startswith(f"{method}: ") for f in failed):
                continue
            print(f"llama.cpp: {method} on {len(prompts)} prompts ({threads} threads)"
                  + (f", round {i + 1} of {args.repeats}" if args.repeats > 1 else "")
                  + (f", {' '.join(extra)}" if extra else ""), flush=True)
            try:
                runs[method].append(run_method(names[method] + extra, prompts, args.max_new_tokens, threads,
                                               model=model, exe=exe))
            except (RuntimeError, ValueError, KeyError) as e:
                if retry_sigill and died_of_sigill(e):
                    return runs, failed, True
                failed.append(f"{method}: {type(e).__name__}: {e}")
                print(f"error: {failed[-1]}", file=sys.stderr)
    return runs, failed, False


def compare(bench, records: list[dict], results: list[dict], head: dict) -> list[dict]:
    """llama.cpp plain and each of its n-gram speculation types on the first turns our methods
    ran (a later turn follows each method's own answer), one server each; records in our
    format with ``identical_to_llamacpp`` (against llama.cpp plain) beside ``identical_to_ar``.
    A missing build or a failed method is reported in the header and leaves the rest as it is."""
    import torch

    from models.loader import resolve_model_path

    args = bench.args
    try:
        exe = binary("llama-server")
        model = resolve_model_path(args.model)
        if model.suffix != ".gguf":
            raise ValueError(f"--compare-llamacpp runs llama.cpp on a GGUF file; --model {args.model} is {model}")
    except ValueError as e:
        head["llamacpp"] = f"not run: {e}"
        print(f"warning: {e}", file=sys.stderr)
        return []
    firsts = [r for r in results if r["method"] == "ar" and r["turn"] == 1]
    first_messages = {rec["id"]: rec["messages"] for rec in records}
    prompts = [bench.encode(first_messages[r["conversation"]]) for r in firsts]  # the ids our methods decoded
    threads = torch.get_num_threads()
    try:
        help_text = subprocess.run([str(exe), "--help"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired) as e:
        help_text = ""
        print(f"warning: llama-server --help failed ({e}): plain only", file=sys.stderr)
    offered = spec_types_offered(help_text)
    spec = [s for s in SPEC_TYPES if s in offered]
    names = methods(offered, args.pld_nk)
    extra: tuple[str, ...] = ()
    runs, failed, sigill = run_rounds(names, extra, prompts, args, threads, model, exe,
                                      retry_sigill=NO_REPACK[0] in help_text)
    if sigill:  # every method again, with the repacking (and the AMX kernels) off
        extra = NO_REPACK
        print(f"warning: llama-server died of SIGILL with its defaults; every llama.cpp method again with "
              f"{' '.join(extra)}", file=sys.stderr)
        runs, failed, _ = run_rounds(names, extra, prompts, args, threads, model, exe, retry_sigill=False)
    out, loads = [], {}
    plain: dict[str, list[int]] = {}
    for method in names:
        if not runs[method] or any(f.startswith(f"{method}: ") for f in failed):
            continue
        try:
            recs = [record(r, p, [g["responses"][j] for g in runs[method]], method, plain.get(r["conversation"]))
                    for j, (r, p) in enumerate(zip(firsts, prompts))]
        except (ValueError, KeyError) as e:
            failed.append(f"{method}: {type(e).__name__}: {e}")
            print(f"error: {failed[-1]}", file=sys.stderr)
            continue
        loads[method] = runs[method][0]["load"]
        for r in recs:
            if method == PLAIN:
                plain[r["conversation"]] = r["output_ids"]
                r["identical_to_llamacpp"] = True
            r["text"] = bench.text(r["output_ids"])  # decoded as ours are (the server's text keeps no final EOS)
        out += recs
    head["llamacpp"] = (f"{version(exe)}; llama-server, {threads} threads (generation and batch), one slot, no "
                        f"prompt cache, {model.name} as stored; {len(prompts)} first turns, one prompt at a time, each "
                        f"method in its own server (bench/llamacpp_compare.py); speculation: --spec-type "
                        f"{', '.join(spec) or '(none offered)'} with llama.cpp's defaults, and "
                        f"{' and '.join(t for t in spec if t in SIZED) or '-'} with lookup {args.pld_nk[0]} and draft "
                        f"{args.pld_nk[1]} tokens (-n{args.pld_nk[0]}k{args.pld_nk[1]}, --pld's); ngram-mod keeps its "
                        f"n-gram pool across the requests of a server (a fresh server per method and round); times: "
                        f"the server's timings, "
                        + (f"median of {args.repeats} interleaved rounds" if args.repeats > 1 else "run once")
                        + (f"; with {' '.join(extra)}: with its defaults llama-server died of SIGILL (an instruction "
                           f"this CPU refused, in its repacked products)" if extra else "")
                        + (f"; failed: {'; '.join(failed)}" if failed else ""))
    head["llamacpp loads"] = "; ".join(f"{m} {x['s']:.1f} s, peak {x['peak_mem_mib']} MiB" for m, x in loads.items())
    head["llamacpp_loads"] = loads
    bench_flags = BENCH_NO_REPACK if extra else ()
    try:
        try:
            b = llama_bench(model, threads, args.max_new_tokens, flags=bench_flags)
        except ServerDied as e:
            if not died_of_sigill(e) or bench_flags:
                raise
            bench_flags = BENCH_NO_REPACK
            b = llama_bench(model, threads, args.max_new_tokens, flags=bench_flags)
        head["llamacpp bench"] = (f"llama-bench -t {threads} -p 0 -n {args.max_new_tokens}"
                                  + "".join(f" {f}" for f in bench_flags) + f": tg{args.max_new_tokens} "
                                  f"{b['avg_ts']:.1f} tokens/s (+- {b['stddev_ts']:.1f}, {b.get('model_type', '')}, "
                                  f"build {b.get('build_commit', '?')} ({b.get('build_number', '?')}))")
    except (ValueError, RuntimeError, OSError, subprocess.TimeoutExpired, KeyError, IndexError) as e:
        head["llamacpp bench"] = f"not run: {e}"
    return out

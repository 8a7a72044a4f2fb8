"""bench/RESULTS.md, generated from the results files chosen in ``RUNS``: the current numbers
only, one section per (device, model), one set of tables per run.

    python bench/results_md.py           # rewrite bench/RESULTS.md
    python bench/results_md.py --check   # exit 1 when the committed file differs (tests/test_results_md.py)

To publish a new run, copy its OUT/results.json (and results.md) under bench/results/<date>-<device>/,
point ``RUNS`` at it and run this script. Runs taken out of ``RUNS`` stay under bench/results/ as
history. The README's headline table is ``headline()`` of the first run (the test checks that too).
"""

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.report import _fmt, decode_seconds, llamacpp_section, phase_summary, summarize, vllm_section  # noqa: E402

OUT = ROOT / "bench" / "RESULTS.md"

# (results.json relative to the repository, what a reader must know about that run)
RUNS = [
    ("bench/results/2026-11-26-h200-phases/results.json",
     "The session's last GPU run, two interleaved rounds. No transformers rows here: see the earlier H200 run "
     "below. In bf16 a verification step of many rows rounds differently from a one-row step, so few outputs "
     "equal `ar`'s; the fp32 run below is the losslessness check. What the run directory holds: its NOTES.md."),
    ("bench/results/2026-11-26-h200-phases/fp32/results.json",
     "The same code in fp32, one round: every method's greedy output is identical to `ar`'s."),
    ("bench/results/2026-11-26-h200-phases/batch4/results.json",
     "Batches of 4 prompts of one task (--batch-size 4 --limit 4), bf16, one round. pld and lookahead+pld paid "
     "a Triton compile of the n-gram kernel inside their summarization steps (fixed since in the warm-up, not "
     "re-run). The same command with the code before this session's fixes: results/2026-11-26-h200-phases/"
     "batch4-before/."),
    ("bench/results/2026-11-26-h200/results.json",
     "The speedups of the whole turn (first table) are distorted on summarization and qa: a Triton compile of "
     "the long prefill landed inside `ar`'s timed run (the warm-up prefills the longest prompt since; not run "
     "again). Read the speedup after the first token. In bf16 a verification step of many rows rounds "
     "differently from a one-row step, so few outputs equal `ar`'s; the fp32 run below is the losslessness "
     "check."),
    ("bench/results/2026-11-26-h200/fp32/results.json",
     "The same command in fp32: every method's greedy output is identical to `ar`'s. The whole-turn speedups "
     "carry the same prefill-compile distortion as the bf16 run."),
    ("bench/results/2026-11-26-cpu-roofline-bound/real/results.json",
     "Four prompts per task, one round, fp32, the AVX-512 build: this machine, run back to back with the next "
     "run. Every output identical to `ar`'s. Texts and token ids removed from the JSON."),
    ("bench/results/2026-11-26-cpu-roofline-bound/roofline/results.json",
     "The same command with every forward of up to 64 step tokens played at this machine's measured roofline "
     "(--emulate-cost with the curve of bench/roofline_curve.py at 30 GB/s, x 2.2 so that it stays slower than "
     "the machine; the planner plans with it). The host's work keeps its real time, a smaller share than beside "
     "forwards at the real floor, so these speedups are an upper bound for kernels at the roofline: hybrid 2.13x "
     "after the first token, against 1.69x in the run above. The run's NOTES.md has the curve and the batch-8 "
     "pair (batch8-real/, batch8-roofline/: 0.98-1.02x and 1.08-1.13x `ar`)."),
    ("bench/results/2026-11-26-cpu-roofline-fast/roofline50/results.json",
     "The roofline bound in the host's other memory state: the same methods on the same prompts with every "
     "forward of up to 64 step tokens played at the roofline of 50 GB/s (x 2.35). The floor is flat only to 8 "
     "tokens there; with the host's measured ms per step beside forwards at the floor itself hybrid would reach "
     "1.96x `ar` after the first token (2.02x as run), 2.08x in the 30 GB/s state (the run above: 2.13x as run). "
     "Every output identical to `ar`'s. The run's NOTES.md has the arithmetic and where tree attention's time goes."),
    ("bench/results/2026-11-26-cpu-limit4/results.json",
     "The command issue 34 names (--compare-hf --limit 4 --repeats 2): four prompts per task, two interleaved "
     "rounds, fp32, the AVX-512 build, after this session's forward changes (every decoding step of up to 64 "
     "rows on the one-call C stack, attention prefetch). Every output identical to `ar`'s. Texts and token ids "
     "removed from the JSON."),
    ("bench/results/2026-11-26-cpu/results.json",
     "The project's 2-core CPU (AMD EPYC, Zen 4), fp32, the AVX-512 build of the C kernels, two prompts per "
     "task, one round (no --repeats: each speedup is one run's ratio, so read differences under about 10% "
     "as noise). The product-form table was re-tuned on the quiet machine just before (a table tuned under "
     "load had halved `ar`'s speed in an earlier run that day)."),
    ("bench/results/2026-11-28-cpu-emr-llamacpp/run/results.json",
     "The Emerald Rapids beside llama.cpp (b11434, native build) on the same file, prompts and 2 threads, one "
     "round. llama.cpp ran with its repacking off (LLAMA_ARG_REPACK=0): its AMX products died of SIGILL on this "
     "machine, and that setting turns them off. Its plain decoding ran at 47 tok/s in the server here, 104 in "
     "llama-bench at short context; read the ratios as one run's on a drifting VM. Texts, token ids and answers "
     "removed; the run directory's NOTES.md has the details."),
    ("bench/results/2026-11-28-cpu-llamacpp-sigill/run/results.json",
     "The Emerald Rapids beside llama.cpp again, this time with no setting of ours: its first server died of "
     "SIGILL in its warm-up (its repacked AMX products), and the bench ran every llama.cpp method again with "
     "--no-repack (llama-bench with --repack 0), as its header says. Five first turns, one round on a drifting "
     "VM. Texts, token ids and answers removed; the run directory's NOTES.md has the details."),
    ("bench/results/2026-11-29-cpu-six-row-tiles/compare-hf-after-2/results.json",
     "Two prompts per task beside transformers, the default native weights, the second of two rounds alternated "
     "with the code before it (compare-hf-before-*/ and compare-hf-after-1/ beside it, all planning with one pinned "
     "curve), after the quantized products took 6-row tiles from 4 rows on and one 3-row tile for 3 rows (a 3-, 5- "
     "or 6-token forward 5-11% faster, 7-16 tokens 0-9%, bit for bit the same numbers, alternated in one process). "
     "Between the two codes the speedups over all tasks moved within their drift (-0.02 to +0.07 after the first "
     "token, the means of the rounds). Every output identical to `ar`'s. Texts, token ids and answers removed; the "
     "run directory's NOTES.md has the tables."),
    ("bench/results/2026-11-29-cpu-around-the-stack/compare-hf-after/results.json",
     "Two prompts per task beside transformers, the default native weights, one round (after the code before it: "
     "compare-hf-before/ beside it, both planning with one pinned curve), after a chain step went to the C "
     "attention as the causal rule instead of mask bytes and the layer stack gathered the embedding rows itself "
     "(1-2.5% off a chain step's forward, alternated in one process). The VM ran slower than in the run below "
     "(`ar` 5.7 ms a step against 4.4); between the two codes the speedups over all tasks moved within their "
     "drift (-0.01 to +0.04 after the first token). Every output identical to `ar`'s. Texts, token ids and "
     "answers removed; "
     "the run directory's NOTES.md has the tables."),
    ("bench/results/2026-11-29-cpu-curve-error/hf2-after/results.json",
     "Two prompts per task beside transformers, the default native weights, one round (the last of two alternated "
     "with the code before it, both planning with one pinned curve: hf*-before/ beside it), after the planner's "
     "learnt time beyond the curve may go below zero (one-token steps took 8-31% less than the curves said in "
     "the loop here). Between the two codes the real runs moved within "
     "their drift (medians +0.01 to +0.06 after the first token); with the forwards emulated (the same in every "
     "run) and a curve overpricing one-token steps, every method gained 4-7%. Every output identical to `ar`'s. "
     "Texts, token ids and answers removed; the run directory's NOTES.md has the tables."),
    ("bench/results/2026-11-28-cpu-fewer-calls/compare-hf-after-1/results.json",
     "Another CPU: a 2-core Intel Xeon (Emerald Rapids, 300 MB L3; the other CPU runs here are on a 2-core AMD "
     "EPYC), two prompts per task beside transformers, native weights, one round, after the step was cut to 26-47 "
     "Python calls (paired with the session's start code, both planning with one pinned curve measured on this "
     "machine: compare-hf-before-1/ beside it). The host work took 0.09-0.28 ms a step in both: the loop's code "
     "stays in this L3. Speculation gains only 1.03-1.12x after the first token here: a step's forward grows "
     "steeply with its width on this CPU (5.2 ms at one token, 8.5 at 8), so the planner sends 2.5-3.2 tokens a "
     "step (tau 1.5-1.6). Every output identical to `ar`'s. Texts, token ids and answers removed; the run "
     "directory's NOTES.md has the tables."),
    ("bench/results/2026-11-28-cpu-cold-host/compare-hf-after-1/results.json",
     "Two prompts per task beside transformers, the default native weights, one round, after the loop's step "
     "was rewritten to run 31-48% fewer Python calls (the run paired with the session's start code before it, "
     "both planning with one pinned step-cost curve: compare-hf-before-1/ beside it). In the loop the verify "
     "phase fell by 0.01-0.02 ms a step in every method; the host totals moved by -0.02 to +0.04 ms, within the "
     "two runs' drift, so the speedups are one pair's. Every output identical to `ar`'s. Texts, token ids and "
     "answers removed; the run directory's NOTES.md has the tables."),
    ("bench/results/2026-11-28-cpu-ranked-head/ab/now-1/results.json",
     "One prompt per task, the default native weights, one round, after the work around a step's layers left "
     "Python (the head ranks its own logits, the attention plan and RoPE without per-step torch ops, the final "
     "norm in the layers' C call) and the lookahead window's update went to C; alternated twice with the "
     "session's start code (ab/ beside it). Host 0.13 ms (`ar`) to 0.36 ms (`hybrid`) a step against 0.17-0.44 "
     "before; `ar`'s forward 4.13 -> 3.84 ms. Every output identical to `ar`'s. Texts and token ids removed from "
     "the JSON; the run directory's NOTES.md has the pieces alone."),
    ("bench/results/2026-11-29-cpu-critical-path/before-4/results.json",
     "Batches of 8 prompts of one task (--batch-size 8 --limit 8), the default quantized path, one round (the "
     "last of 4 alternated with a planner rule tried and not kept, planning with one pinned curve), the first "
     "run with each batch's decoding time after its prefill: over the 4 rounds' medians 0.98 (pld, "
     "lookahead+pld, hybrid) to 1.04x (suffix) ar after the first token, 1.01-1.03x over whole turns, single "
     "runs 0.93-1.06x. Every output identical to ar's. Texts, token ids and accepted lengths removed from the "
     "JSON; the run directory's NOTES.md has the rule and the rounds."),
    ("bench/results/2026-11-28-cpu-ranked-head/ab/b8-now/results.json",
     "Batches of 8 prompts of one task (--batch-size 8 --limit 8), the default quantized path, one round, the same "
     "code: 0.96-0.99x ar here, 1.01-1.04x in the round with the head's ranking alone (ab-head/); the host 0.29 "
     "(ar) to 0.75 ms (hybrid) a step against 0.40-0.95 before. Every output identical to ar's. Texts and token "
     "ids removed from the JSON."),
    ("bench/results/2026-11-27-cpu-host-glue/real/now-1/results.json",
     "One prompt per task, the default native weights, one round, after the compiled host path's glue moved into C "
     "(CPython extensions; run alternated with the session's start code and with the reference host path: real/ "
     "beside it). The host is 4-8% of a step here, 0.20 ms (`ar`) to 0.49 ms (`hybrid`) against 0.22-0.61 before "
     "and 0.25-0.91 on the reference path; tokens/s moved with the forward's drift more than with the host. Every "
     "output identical to `ar`'s. Texts and token ids removed from the JSON; the run directory's NOTES.md has the "
     "host work alone."),
    ("bench/results/2026-11-27-cpu-host-drafting/batch8/results.json",
     "Batches of 8 prompts of one task (--batch-size 8 --limit 8), fp32, one round, with the step's drafting, "
     "planning, packing and KV compaction compiled (the header's host-path line predates the drafting's own "
     "mention): every method at 1.00-1.07x `ar` (0.98-1.02x in the run below), every output identical to "
     "`ar`'s. The host's share of a batch step: 0.45 ms (`ar`) to 1.15 ms (`hybrid`) against forwards of 25.7 "
     "ms (`ar`) to 38.5 ms (`hybrid`): `hybrid` sends more tokens than pay at this shape (tau 1.51, as `pld`'s "
     "1.50 with 29.8 ms forwards), the planner still pricing a batch step below what it measures. Texts and "
     "token ids removed from the JSON; the run directory's NOTES.md has the host work alone."),
    ("bench/results/2026-11-27-cpu-host-drafting/fp32-compiled/results.json",
     "One prompt per task, fp32, two interleaved rounds, the compiled host path (the same command on the "
     "session's start code and on the reference path ran before and after it: fp32-start/, fp32-reference/; "
     "with a 17 ms forward the host is 2-4% of a step, below the runs' spread). Every output identical to "
     "`ar`'s. Texts and token ids removed from the JSON."),
    ("bench/results/2026-11-26-cpu-batch8-after/results.json",
     "Batches of 8 prompts of one task (--batch-size 8 --limit 8), fp32, one round, after this session's forward "
     "changes (batch steps of up to 64 rows on the one-call stack): 0.98-1.02x `ar` (0.90-1.03 in the run "
     "below, the same command before them). Every output identical to `ar`'s. The planner still predicts a batch "
     "step's forward 11-19% below what it measures, and in a static batch the steps follow the sequences that "
     "accept least (pld cut the batch's steps from 762 to 606 with a tau of 1.56). Texts and token ids removed "
     "from the JSON."),
    ("bench/results/2026-11-26-cpu-batch8/results.json",
     "Batches of 8 prompts of one task (--batch-size 8 --limit 8), fp32, one round, on the quiet machine. No "
     "method gains: at 8 rows a forward is already past the CPU's compute knee (a batch step of 8 one-token "
     "sequences took 36 ms against 21 ms for one token), and the planner predicted each step's forward 21-32% "
     "below what it measured (the step-planner table of its results.md), so it sent drafts that did not "
     "pay. Every output identical to `ar`'s. Texts and token ids removed from the JSON."),
    ("bench/results/2026-11-27-cpu-prefill-kernel/compare-hf-after/results.json",
     "--compare-hf --limit 2 after the CPU prefill attention kernel (kernels/cpu/prefill_attention.c), fp32, "
     "one round, run back to back with the code before it (compare-hf-before/ beside it): all 120 outputs the "
     "same in both runs, every one identical to `ar`'s and to transformers'. Against transformers in the same "
     "run, the time to the first token of the 541-1,475-token prompts fell 4-17%; the decoding steps do not use "
     "the kernel. The run's NOTES.md has the kernel against SDPA (1.3-2.3x) and the prefill alone (8-16% less "
     "time). Texts and token ids removed from the JSON."),
    ("bench/results/2026-11-27-cpu-kv16/llamacpp/results.json",
     "Our methods on the default quantized path (the GGUF's Q4_1 / Q8_0 blocks, int8 activations, fp16 K/V) "
     "beside llama.cpp on the same file, prompts and 2 threads, one round. Decoding: our ar 2.02x llama.cpp "
     "plain, suffix 2.51x llama.cpp plain and 2.59x its best speculation. Every output of ours identical to ar's; "
     "with fp16 K/V (llama.cpp's default too) our outputs share 37 tokens with llama.cpp's before they part, "
     "where fp32 K/V shared 22. The run directory's NOTES.md has fp16 against fp32 K/V."),
    ("bench/results/2026-11-27-cpu-host-glue/b8/now/results.json",
     "Batches of 8 prompts of one task (--batch-size 8 --limit 8), the default quantized path, one round, with the "
     "host path's glue in C: 0.97-1.01x ar (the host 0.41-0.95 ms of 14-17 ms steps). Pricing the batch step right "
     "did not change that (b8-pricing/ beside it, NOTES.md): the shared prefill, a static batch's slowest sequences "
     "and the forward's growth with rows decide it. Every output identical to ar's. Texts and token ids removed "
     "from the JSON."),
    ("bench/results/2026-11-27-cpu-kv16/b8-after/results.json",
     "Batches of 8 prompts of one task (--batch-size 8 --limit 8), the default quantized path with fp16 K/V, one "
     "round, run after the same command with fp32 K/V (b8-before/): every method 11-14% more tokens/s than there "
     "and at 1.00-1.02x ar (0.99-1.01 before). Every output identical to ar's. Texts and token ids removed from "
     "the JSON."),
    ("bench/results/2026-11-28-cpu-ranked-head/qwen-pair/results.json",
     "The Qwen2.5-Coder pair (1.5B target, 0.5B draft) both on the native path (the files' Q4_K products read "
     "natively, the rest Q8_0, fp16 K/V), one prompt per task, one round, with transformers beside: draft+pld "
     "10.3x and pld 11.9x transformers' assisted generation; a 0.5B draft token about 16 ms beside a 38 ms 1.5B "
     "step. Every output of ours identical to ar's. Texts and token ids removed from the JSON."),
    ("bench/results/2026-11-27-cpu-q4k/qwen/now-2/results.json",
     "The Qwen2.5-Coder 1.5B with its file's Q4_K products read natively (q4_1f: fp32 sub-block scales, the file's "
     "weights bit for bit; products with a Q6_K part Q8_0 from fp32), one prompt per task, one round, alternated "
     "with the code that made every product Q8_0 (qwen/ beside it): ar's forward 38.2 -> 32.1 ms, 1,640 -> 1,293 MB "
     "a step. Every output identical to ar's. Texts and token ids removed from the JSON."),
    ("bench/results/2026-11-27-cpu-qwen-native/native/results.json",
     "The Qwen2.5-Coder pair on the default quantized path (native: every product of these Q4_K_M files Q8_0, "
     "the 0.5B's LM head its own Q8_0 blocks; int8 activations), one prompt per task, one round. Every output "
     "of ours identical to `ar`'s. pld 1.67x `ar`, draft+pld 1.43x, draft 1.19x over whole turns; transformers "
     "runs fp32, and its assisted generation with the same 0.5B is 0.14x our `ar`. A 0.5B draft token cost "
     "21.3 ms in the loop beside a 37.8 ms `ar` token (200 ms beside 344 ms in fp32 on 2026-11-23). The run's "
     "NOTES.md has the draft's cost and the floors."),
    ("bench/results/2026-11-27-cpu-qwen-native/ar-native/results.json",
     "`ar` alone on native, three interleaved rounds, run back to back with the fp32 run below: 2.87x its "
     "tokens/s (2.72x after the first token; 2.88-2.89x in one process with the forms interleaved, NOTES.md). "
     "The 3x asked is not met: native runs at 1.16-1.36x its Q8_0 floor, fp32 at its own, and the bytes allow "
     "3.76x."),
    ("bench/results/2026-11-27-cpu-qwen-native/ar-fp32/results.json",
     "The same command with --weights fp32, right after the run above."),
    ("bench/results/2026-11-27-cpu-llamacpp/results.json",
     "--compare-llamacpp --limit 1, one round, 2 threads for both engines: llama.cpp b11434 (make llamacpp, "
     "native flags) on the GGUF's Q4_1 blocks as stored, ours in fp32. llama.cpp plain decodes 1.94x our ar (97.6 "
     "against 50.4 tokens/s after the first token), 1.42x our fastest speculative method (suffix); our prefill is "
     "2.75x its (718 against 261 tokens/s). Its n-gram speculation decoded no faster than its plain decoding here. "
     "No llama.cpp output equals our ar's (they share 19 tokens on average first: its products take 8-bit "
     "activations). The run's NOTES.md has llama-bench and the contended first run."),
    ("bench/results/2026-11-27-cpu-vllm-prefill-kernel/results.json",
     "--compare-vllm --limit 2 (OMP_NUM_THREADS=1) after the prefill kernel. Every vLLM output equalled vLLM "
     "plain's and our ar's. Engines not interleaved. Our time to the first token is now vLLM's (16.6 s against "
     "16.1-16.8 s over the 10 first turns). Our ar 1.40x vLLM plain; our best (suffix, 29.7 tokens/s) 1.29x "
     "vLLM's best (its suffix, 23.1); our drafter inside vLLM 0.95x its suffix, at tau 1.71 against n-gram's "
     "1.66, 85% of the best chain of the same trees chosen in hindsight (2.01; NOTES.md)."),
    ("bench/results/2026-11-26-cpu-vllm-shared-store/results.json",
     "--compare-vllm --limit 2 (OMP_NUM_THREADS=1) with our suffix and hybrid drafting from one store of the "
     "run's finished outputs, as vLLM's suffix method and our drafter inside vLLM do (--shared-store, on with "
     "--compare-vllm since). Every vLLM output equalled vLLM plain's and our ar's. Engines not interleaved. Our ar "
     "1.49x vLLM plain; our best (suffix, 26.7 tokens/s) 1.29x vLLM's best (its suffix, 20.7); our drafter inside "
     "vLLM its fastest method (23.1), 1.12x its suffix, at tau 1.71 against n-gram's 1.66."),
    ("bench/results/2026-11-26-cpu-vllm-mix/results.json",
     "The same command (OMP_NUM_THREADS=1) with our context mixture inside vLLM beside the hybrid's chain "
     "(vllm-specdec-mix; it ran as vllm-specdec and was relabelled). Every vLLM output equalled vLLM plain's and "
     "our ar's. Engines not interleaved. The mixture took the fewest forwards (tau 1.76 against the hybrid's "
     "1.71 and n-gram's 1.66) but more time (23.7 tokens/s against 24.5), as in every alternated run after it "
     "(bench/results/2026-11-26-cpu-context-mix/NOTES.md). Our ar 1.36x vLLM plain; our best (hybrid, 27.5) "
     "1.19x vLLM's best (its suffix, 23.1)."),
    ("bench/results/2026-11-26-cpu-vllm-1thread-attention/results.json",
     "The same command (OMP_NUM_THREADS=1) after the attention kernel's spread prefetch (ours only; on one thread "
     "the contiguous task ranges change nothing). Every vLLM output equalled vLLM plain's and our ar's. Engines "
     "not interleaved, as below. Our ar 21.4 tokens/s, 1.26x vLLM plain; our best speculative method (suffix, "
     "27.1) 1.17x vLLM's best (its suffix, 23.1); our drafter inside vLLM again vLLM's fastest (23.5), 1.02x its "
     "suffix, at tau 1.71 against n-gram's 1.66."),
    ("bench/results/2026-11-26-cpu-vllm-1thread-rerun/results.json",
     "The same command three hours later, after the CPU prefill chunk grew to 2,048 tokens (ours only). Every "
     "vLLM output equalled vLLM plain's and our ar's. Our methods ran first, then each vLLM method in turn: the "
     "engines are not interleaved, so the machine's drift between them moves their ratio. Here our ar was 20.6 "
     "tokens/s (21.7 in the run below) and vLLM's suffix 22.6 (21.2), so our best speculative method was 1.14x "
     "vLLM's best (1.28x below). Inside vLLM our drafter was again vLLM's fastest method (24.1), 1.07x its "
     "suffix, at tau 1.69 against n-gram's 1.66."),
    ("bench/results/2026-11-26-cpu-vllm-1thread/results.json",
     "vLLM beside ours (--compare-vllm), one thread for both engines (OMP_NUM_THREADS=1, and NUMBA_NUM_THREADS=1 "
     "in vLLM's process: numba, which vLLM's n-gram proposer uses, had set the forward's OpenMP threads to both "
     "cores in the earlier runs, results/2026-11-26-cpu-vllm-quiet/ and -vllm/, kept as history), two prompts "
     "per task (vLLM: the 10 first turns), one round. Every vLLM output equalled vLLM plain's and our ar's. On one "
     "thread vLLM's n-gram is its slowest speculative method (19.1 tokens/s); our drafter inside vLLM its "
     "fastest (22.4)."),
]
HEADER_KEYS = ("date", "command", "device", "dtype", "weights", "draft model", "kernel", "versions", "max_new_tokens",
               "batch_size", "sampling", "repeats", "step planner", "suffix store", "cuda graphs", "exact", "step cost",
               "model loads", "vllm", "vllm loads", "llamacpp", "llamacpp loads", "llamacpp bench")


def load(rel: str) -> dict:
    return json.loads((ROOT / rel).read_text())


def _order(records: list[dict], key: str) -> list[str]:
    return list(dict.fromkeys(r[key] for r in records))


def model_name(header: dict) -> str:
    """The header's model line without the folder it was read from on the measuring machine."""
    path, _, rest = header["model"].partition(" ")
    return f"{Path(path).name} {rest}".strip()


def _table(s: dict, methods: list[str], cols: list[str], cell) -> list[str]:
    out = ["| method | " + " | ".join(cols) + " |", "|---|" + "---:|" * len(cols)]
    for m in methods:
        out.append(f"| {m} | " + " | ".join(cell(s.get((m, t))) for t in cols) + " |")
    return out + [""]


def _identical(x: dict | None) -> str:
    return "-" if x is None or x["identical"] is None else _fmt(x["identical"], ".0%")


def _ms_per_token(records: list[dict], method: str, batch_size: int = 1) -> float:
    """Wall ms per decoded token after the first, all of the method's records (a batch's: its
    decoding time over the tokens its sequences decoded); nan where a record has no decoding time."""
    rs = [r for r in records if r["method"] == method]
    secs = [decode_seconds(r, batch_size) for r in rs]
    tokens = sum(r["new_tokens"] - 1 for r in rs)
    return 1e3 * sum(secs) / tokens if tokens > 0 and None not in secs else float("nan")


def run_section(rel: str, note: str) -> list[str]:
    data = load(rel)
    head, records = data["header"], data["records"]
    s = summarize(records, head.get("batch_size", 1))
    methods, tasks = _order(records, "method"), _order(records, "task")
    cols = tasks + ["all"]
    prompts = sum(1 for r in records if r["method"] == "ar")
    lines = [f"### {head['dtype']}, {head['kernel']} kernels, {prompts} prompt turns ({rel})", ""]
    lines += [f"- **{k}**: {head[k]}" for k in HEADER_KEYS if k in head]
    if head.get("emulated step cost", "off") != "off":  # the forwards' times were played, not this machine's
        lines += [f"- **emulated step cost**: {head['emulated step cost']}"]
    lines += ["", note, ""]
    lines += ["All tasks: tokens/s of the whole turn, speedup over `ar` of the whole turn and after the first "
              "token, wall ms per token after the first, tau, share of outputs identical to `ar`.", "",
              "| method | tokens/s | speedup | after the first token | ms / token after the first | tau | identical |",
              "|---|---:|---:|---:|---:|---:|---:|"]
    for m in methods:
        x, ms = s[(m, "all")], _ms_per_token(records, m, head.get("batch_size", 1))
        lines.append(f"| {m} | {_fmt(x['tok_s'], '.1f')} | {_fmt(x['speedup'])} | {_fmt(x['decode_speedup'])} "
                     f"| {_fmt(ms)} | {_fmt(x['tau'])} | {_identical(x)} |")
    lines.append("")
    timed = any(x["decode_speedup"] == x["decode_speedup"] for x in s.values())  # not all nan
    if not timed:  # a batched run recorded before its records held their decoding time
        lines += ["(No decoding times after the first token: this batched run's records predate them.)", ""]
    for metric, title in (("decode_speedup", "Speedup over `ar` after the first token (decoding alone)"),
                          ("tau", "tau (new tokens per forward after the prefill)"),
                          ("speedup", "Speedup over `ar`, whole turn (prefill included)")):
        if metric != "decode_speedup" or timed:
            lines += [f"{title}:", ""] + _table(s, methods, cols, lambda x, k=metric: _fmt(None if x is None else x[k]))
    lines += ["Share of greedy outputs identical to `ar`:", ""] + _table(s, methods, cols, _identical)
    # each empty without its records
    return lines + phase_lines(records, methods) + vllm_section(records, methods) + llamacpp_section(records, methods)


def phase_lines(records: list[dict], methods: list[str]) -> list[str]:
    """Where a decoding step's time goes, per method (runs recorded with ``step_phases``)."""
    from decoding.stats import PHASES

    ph = phase_summary(records)
    if not ph:
        return []
    host = [p for p in PHASES if p != "forward"]
    lines = ["Where a decoding step's time goes, ms per step over all tasks (`decoding.stats.StepClock`; forward: "
             "the model's forward up to the device's end of it, the rest host work):", "",
             "| method | forward | " + " | ".join(host) + " | host | host share |",
             "|---|---:|" + "---:|" * len(host) + "---:|---:|"]
    for m in methods:
        p = ph.get(m)
        if p is not None:
            lines.append(f"| {m} | {_fmt(p['forward'])} | " + " | ".join(_fmt(p[h]) for h in host)
                         + f" | {_fmt(p['host'])} | {_fmt(p['host'] / (p['host'] + p['forward']), '.0%')} |")
    return lines + [""]


def render() -> str:
    groups: dict[tuple[str, str], list[tuple[str, str]]] = {}
    for rel, note in RUNS:
        head = load(rel)["header"]
        groups.setdefault((head["device"], model_name(head)), []).append((rel, note))
    lines = ["# Current results", "",
             "Generated by `python bench/results_md.py` from the results files it lists (`RUNS`); do not edit "
             "by hand. Earlier runs, and the CPU runs that have no results.json, are dated files under "
             "[results/](results/). How the numbers are measured: [README.md](README.md).", ""]
    for device, model in groups:
        lines += [f"## {device}, {model}", ""]
        for rel, note in groups[(device, model)]:
            lines += run_section(rel, note)
    return "\n".join(lines).rstrip("\n") + "\n"


def headline(rel: str = RUNS[0][0]) -> str:
    """The README's table: speedup over `ar` after the first token (tau) per method and task."""
    data = load(rel)
    records = data["records"]
    s = summarize(records, data["header"].get("batch_size", 1))
    methods, cols = _order(records, "method"), _order(records, "task") + ["all"]
    return "\n".join(_table(s, methods, cols, lambda x: f"{_fmt(x['decode_speedup'])} ({_fmt(x['tau'])})")).rstrip()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="compare with the committed file instead of writing it")
    args = p.parse_args(argv)
    text = render()
    if args.check:
        same = OUT.is_file() and OUT.read_text() == text
        print(f"{OUT.relative_to(ROOT)} {'is up to date' if same else 'differs: run python bench/results_md.py'}")
        return 0 if same else 1
    OUT.write_text(text)
    print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

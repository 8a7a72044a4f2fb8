"""bench/run.py's measuring loop: the models, the warm-up, every method on every batch of
prompts in interleaved rounds (each conversation turn asked after the method's own previous
answer) and one results.json record per prompt turn and method."""

from __future__ import annotations

import json
import statistics
import sys
import time
from typing import Callable, Optional

from bench.measure import Measured, PeakMemory, measure, merge


class HeldStore:
    """A run's suffix store as one timed call sees it: drafts read the store as it is, and the
    sequences the call finishes wait in ``pending`` instead of going in. ``Bench._rounds`` adds
    the first round's after the batch's last round, so no round of a prompt drafts from its own
    earlier output (and the warm-up's go nowhere)."""

    def __init__(self, store):
        self.store, self.pending = store, []

    @property
    def trie(self):
        return self.store.trie

    def add(self, tokens: list[int]) -> None:
        self.pending.append(list(tokens))


class Bench:
    """Loads the target (and draft, and transformers' models with --compare-hf) and measures
    the step cost on construction; :meth:`run` measures every method on the records."""

    def __init__(self, args, memory: PeakMemory):
        from bench.hf_compare import HF_ASSISTED, HF_METHODS, load_hf_model
        from decoding.inputs import same_tokenizer
        from decoding.options import DTYPES, sampling_of
        from kernels.backend import get_backend
        from models.cost import step_cost
        from models.loader import DEFAULT_CACHE_DIR, load_model, load_tokenizer, resolve_model_path

        self.args, self.memory = args, memory
        self.loads: dict[str, dict] = {}
        backend = get_backend(args.kernel, args.device, exact=getattr(args, "exact", False))
        dtype = DTYPES[args.dtype]
        weights = getattr(args, "weights", None)
        self.model, self.tok = self._load("target", lambda: load_model(args.model, backend, dtype, args.device,
                                                                       weights=weights, named_by="--model"))
        cfg = self.model.cfg
        self.model_line = f"{args.model} ({cfg.architecture}, {cfg.num_layers} layers, hidden {cfg.hidden_size})"
        print(f"loaded: {self.model_line}", flush=True)
        self.draft, self.draft_line = None, None
        if any(m.startswith("draft") for m in args.methods):
            draft = self._load("draft", lambda: load_model(args.draft_model, backend, dtype, args.device,
                                                           weights=weights, named_by="--draft-model"))
            self.draft = draft.model
            dc = self.draft.cfg  # the header's draft line: its weights' form beside the target's
            self.draft_line = (f"{args.draft_model} ({dc.architecture}, {dc.num_layers} layers, hidden "
                               f"{dc.hidden_size}); weights {self.draft.weights}")
            # the vocabularies themselves (token -> id), now: before anything is generated
            same_tokenizer(self.tok, draft.tokenizer, f"--model {args.model}", f"--draft-model {args.draft_model}")
        elif args.compare_hf and args.draft_model:  # hf-assisted alone: its tokenizer, without our copy of it
            same_tokenizer(self.tok, load_tokenizer(args.draft_model, named_by="--draft-model"),
                           f"--model {args.model}", f"--draft-model {args.draft_model}")
        if getattr(args, "cuda_graphs", False):
            from models.graphs import use_cuda_graphs
            for m in (self.model, self.draft):
                if m is not None:
                    use_cuda_graphs(m)
        self.emulation = None
        if getattr(args, "emulate_curve", None) is not None:  # before the step cost: it is measured emulated
            from models.cost import emulate_step_cost
            self.emulation = emulate_step_cost(self.model, args.emulate_curve, source=str(args.emulate_cost))
        self.eos = tuple(cfg.eos_token_ids)
        self.sp = sampling_of(args)
        self.methods = list(args.methods)
        self.hf = self.hf_draft = None
        if args.compare_hf:
            self.hf = self._load("hf target", lambda: load_hf_model(resolve_model_path(args.model), dtype, args.device))
            self.methods += list(HF_METHODS)
            if args.draft_model:
                self.hf_draft = self._load("hf draft", lambda: load_hf_model(resolve_model_path(args.draft_model),
                                                                             dtype,
                                                                             args.device))
                self.methods.append(HF_ASSISTED)
        self.hf_methods = set(HF_METHODS) | {HF_ASSISTED}
        self.cost = None if args.no_plan else (args.step_cost_curve if args.step_cost_curve is not None
                                               else step_cost(self.model, DEFAULT_CACHE_DIR))
        if self.emulation is not None:  # its counters then say what the decoding runs did
            self.emulation.reset()
        self.skipped: list[str] = []
        self._encoded: dict[str, list[int]] = {}
        self.graph_warm_up: Optional[dict] = None  # with --cuda-graphs: what run() captured before timing
        # --shared-store: per method (suffix, hybrid), the run's store of finished sequences, and what
        # the last timed call finished (added to the store after the batch's last round)
        self.stores: dict[str, object] = {}
        self.finished: dict[str, list[list[int]]] = {}

    def _load(self, what: str, load):
        """``load()``, with its wall time and the memory peak while it ran kept in ``loads``."""
        self.memory.start()
        t = time.perf_counter()
        out = load()
        secs = time.perf_counter() - t
        peak, rise = self.memory.stop()
        self.loads[what] = {"s": round(secs, 2), "peak_mem_mib": round(peak), "rise_mib": round(rise)}
        print(f"loaded {what} in {secs:.1f} s (memory peak {peak:.0f} MiB, +{rise:.0f} MiB)", flush=True)
        return out

    def loads_line(self) -> str:
        return "; ".join(f"{w} {x['s']:.1f} s, peak {x['peak_mem_mib']} MiB (+{x['rise_mib']})"
                         for w, x in self.loads.items())

    def encode(self, messages: list[dict]) -> list[int]:
        key = json.dumps(messages)
        if key not in self._encoded:
            self._encoded[key] = self.tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                              return_dict=False)
        return self._encoded[key]

    def text(self, ids: list[int]) -> str:
        """The decoded output, a final EOS left out."""
        return self.tok.decode(ids[:-1] if ids and ids[-1] in self.eos else ids, skip_special_tokens=True)

    def timed(self, name: str, prompts: list[list[int]], max_new: int, repeats: int) -> list[tuple[Measured, int]]:
        """``name`` on the prompts, ``repeats`` times; per prompt its measurement and its index
        in it (ours decode the prompts as one batch, transformers one by one)."""
        from bench.hf_compare import hf_generate
        from decoding.generate import generate
        from decoding.options import build_proposer, planner_for
        from decoding.stats import StepClock

        if name in self.hf_methods:
            def one(p):
                def call(clock):
                    h = hf_generate(self.hf, p, name, max_new, self.eos, sampling=self.sp, pld=self.args.pld_nk,
                                    assistant=self.hf_draft, on_tokens=clock)
                    return [{"output_ids": h["output_ids"], "forwards": h["forwards"], "stats": None,
                             "step_tokens": None, "finish_reason": h["finish_reason"]}], {"plan": None}
                return measure(call, 1, repeats, self.memory)
            return [(one(p), 0) for p in prompts]

        def call(clock):
            plan = planner_for(self.model, name, self.cost is None, None, self.cost, self.args.fixed_plan)
            phases = StepClock()
            store = self._held_store(name)
            res = generate(self.model, prompts, build_proposer(name, self.args, self.draft, store),
                           max_new_tokens=max_new, sampling=self.sp, planner=plan, on_tokens=clock, step_clock=phases)
            if store is not None:
                self.finished[name] = store.pending
            return ([{"output_ids": x.output_ids, "forwards": x.stats.forwards, "stats": x.stats.as_dict(),
                      "step_tokens": x.stats.step_tokens, "finish_reason": x.finish_reason} for x in res],
                    {"plan": plan.log if plan is not None else None,
                     "step_phases": {"steps": phases.steps, "ms": phases.ms}})
        m = measure(call, len(prompts), repeats, self.memory)
        return [(m, i) for i in range(len(prompts))]

    def _rounds(self, prompts: dict[str, list[list[int]]], max_new: int, repeats: int
                ) -> dict[str, list[tuple[Measured, int]]]:
        """Every method on its prompts of one batch, ``repeats`` rounds: each round runs every
        method once, back to back, starting one method later than the round before. A shared
        machine's speed drifts within minutes; interleaved rounds let the drift fall on every
        method alike instead of on whichever ran its repeats during a slow spell."""
        names = list(prompts)
        rounds: dict[str, list[list[tuple[Measured, int]]]] = {name: [] for name in names}
        first: dict[str, list[list[int]]] = {}  # --shared-store: the first round's finished sequences
        finished = self.__dict__.setdefault("finished", {})  # (a Bench built without __init__ in tests)
        finished.clear()  # the warm-up's go nowhere
        for r in range(repeats):
            for name in names[r % len(names):] + names[:r % len(names)]:
                rounds[name].append(self.timed(name, prompts[name], max_new, 1))
                if r == 0 and name in finished:
                    first[name] = finished.pop(name)
        for name, seqs in first.items():  # later batches see this one's outputs; none of its rounds did
            for tokens in seqs:
                self.stores[name].add(tokens)
        return {name: [(merge([got[i][0] for got in rs]), rs[0][i][1]) for i in range(len(rs[0]))]
                for name, rs in rounds.items()}

    def _held_store(self, name: str) -> Optional["HeldStore"]:
        """With --shared-store, the run's store for ``name`` (suffix, hybrid) behind a
        ``HeldStore``; else None."""
        from decoding.methods import STORE_METHODS
        from decoding.suffix import SuffixConfig, SuffixStore

        if not getattr(self.args, "shared_store", False) or name not in STORE_METHODS:
            return None
        if name not in self.stores:
            cfg = SuffixConfig()  # the depth both methods' configs index (the store must match it)
            self.stores[name] = SuffixStore(cfg.depth, cfg.store_nodes)
        return HeldStore(self.stores[name])

    def _warm_up(self, records: list[dict]) -> None:
        """Everything a timed run must not pay for, before the first one: the CUDA graphs (with
        --cuda-graphs), every method once on the shortest prompt (first calls pay for allocation,
        and on a GPU for compilation: there with the n-gram search on the device, which later
        serves only batches of long histories, so that its kernel compiles here and not inside
        a timed step: 0.56 s of a batch-4 pld run on the H200) and, on a GPU, the longest
        prompt's prefill and a batch of the longest prompts' (Triton compiles a long eager
        prefill's kernels on first use, which would land in the first timed method's TTFT: up
        to 1.2 s of a batch-4 ``ar`` run), and a K/V-moving commit (the compaction kernel)."""
        if not records:
            return
        if getattr(self.args, "cuda_graphs", False):
            self.graph_warm_up = self._warm_up_graphs(records)
        from decoding import prompt_lookup

        prompts = sorted((self.encode(r["messages"]) for r in records), key=len)
        cuda = str(getattr(self.args, "device", "cpu")).startswith("cuda")
        host_search = prompt_lookup.HOST_SEARCH_TOKENS
        if cuda:  # short histories are searched on the host: this once, the n-gram kernel (its compile)
            prompt_lookup.HOST_SEARCH_TOKENS = 0
        try:
            for name in self.methods:
                self.timed(name, [prompts[0]], 4, 1)
        finally:
            prompt_lookup.HOST_SEARCH_TOKENS = host_search
        if cuda:
            self.timed("ar", [prompts[-1]], 2, 1)
            batch = min(self.args.batch_size, len(prompts))
            if batch > 1:  # a batch's prefill launches the kernels with other sizes (other variants)
                self.timed("ar", prompts[-batch:], 2, 1)
            from models.runner import ModelRunner

            ModelRunner.for_batch(self.model, [prompts[0]], 4).warm_up_commit()

    def _warm_up_graphs(self, records: list[dict]) -> dict:
        """Size the shared runner for the longest conversation (its first prompt, and each later
        turn with an answer of --max-new-tokens before it) and capture its graphs before
        anything is timed: otherwise the first method to meet a step shape pays its capture."""
        from models.runner import ModelRunner

        new = self.args.max_new_tokens
        longest = 0
        for r in records:
            n = len(self.encode(r["messages"]))
            for turn in r["next_turns"]:
                n += new + len(self.tok.encode(turn)) + 16  # the answer, the question, the template's tokens
            longest = max(longest, n)
        longest = min(longest, self.model.cfg.max_position_embeddings - new)
        done = ModelRunner.warm_up_shared(self.model, self.args.batch_size, longest, new)
        print(f"cuda graphs: {done['captured']} captured ahead in {done['seconds']:.1f} s "
              f"(cache {done['cache_tokens']} tokens)", flush=True)
        return done

    def _too_long(self, conv: dict) -> Optional[str]:
        n = max(len(self.encode(msgs)) for msgs in conv["msgs"].values())
        ctx = self.model.cfg.max_position_embeddings
        if n + self.args.max_new_tokens <= ctx:
            return None
        return (f"record {conv['rec']['id']} ({conv['rec']['task']}, turn {conv['turn']}): prompt of {n} tokens "
                f"+ --max-new-tokens {self.args.max_new_tokens} exceeds the model context of {ctx} tokens; skipped")

    def run(self, records: list[dict], on_batch: Optional[Callable[[list[dict]], None]] = None) -> list[dict]:
        """Every method on every record (its turns in order); ``on_batch(results so far)`` after
        each batch of prompt turns is measured (bench/run.py writes results.json there, so that
        a run that fails later keeps what it measured)."""
        from tqdm import tqdm

        args = self.args
        todo = [{"rec": r, "turn": 1, "msgs": {m: r["messages"] for m in self.methods}} for r in records]
        self._warm_up([c["rec"] for c in todo if self._too_long(c) is None])
        results = []
        bar = tqdm(total=sum(1 + len(r["next_turns"]) for r in records), desc="prompt turns")
        try:  # closed on an interrupt too: its last redraw must not land after the run's last line
            while todo:
                # batches of prompts of one task; the next turns of conversations come back as new items
                by_task: dict[str, list] = {}
                for c in todo:
                    by_task.setdefault(c["rec"]["task"], []).append(c)
                todo = []
                for convs in by_task.values():
                    fit = []
                    for c in convs:
                        msg = self._too_long(c)
                        if msg is None:
                            fit.append(c)
                            continue
                        print(f"error: {msg}", file=sys.stderr)  # reported by record; the others go on
                        self.skipped.append(msg)
                        bar.update(1 + len(c["rec"]["next_turns"]) - (c["turn"] - 1))
                    for i in range(0, len(fit), args.batch_size):
                        batch = fit[i:i + args.batch_size]
                        answers = {}
                        prompts = {name: [self.encode(c["msgs"][name]) for c in batch] for name in self.methods}
                        got = self._rounds(prompts, args.max_new_tokens, args.repeats)
                        ar_out = [m.outputs[j]["output_ids"] for m, j in got["ar"]]
                        for name in self.methods:
                            for c, p, (m, j), ref in zip(batch, prompts[name], got[name], ar_out):
                                results.append(self._record(c, name, p, m, j, ref))
                                answers[(id(c), name)] = results[-1]["text"]
                        for c in batch:  # the next turn sees the method's own answer
                            nxt = c["rec"]["next_turns"]
                            if c["turn"] <= len(nxt):
                                todo.append({"rec": c["rec"], "turn": c["turn"] + 1, "msgs": {
                                    name: msgs + [{"role": "assistant", "content": answers[(id(c), name)]},
                                                  {"role": "user", "content": nxt[c["turn"] - 1]}]
                                    for name, msgs in c["msgs"].items()}})
                        bar.update(len(batch))
                        if on_batch is not None:
                            on_batch(results)
        finally:
            bar.close()
        return results

    def _record(self, conv: dict, method: str, prompt: list[int], m: Measured, j: int,
                ar_ids: list[int]) -> dict:
        """One results.json record. A batch shares its wall time: time_s is this sequence's
        share of the batch's (median over repeats), tok_s the batch's, decode_s its share of the
        batch's time after the first tokens (by the tokens it decoded there); ``plan`` is the batch's
        step-planner log (first repeat), ``step_phases`` the batch's step time by phase
        (``decoding.stats.StepClock``: total ms per phase and the step count, first repeat)."""
        o = m.outputs[j]
        ids = o["output_ids"]
        batch_new = sum(len(x["output_ids"]) for x in m.outputs)
        shares = [s * len(ids) / max(batch_new, 1) for s in m.secs]
        # decoding after the first token: the batch's decoding time, shared by the tokens each sequence
        # decoded in it (batch 1: the wall time after the first token), per repeat, then the median
        after = batch_new - len(m.outputs)
        decode = [None if d is None else d * (len(ids) - 1) / after if after > 0 else 0.0 for d in m.decode_secs]
        rates = [batch_new / s if s > 0 else float("nan") for s in m.secs]
        rec, turn = conv["rec"], conv["turn"]
        out = {
            "id": rec["id"] if turn == 1 else f"{rec['id']}-turn{turn}",
            "conversation": rec["id"], "question_id": rec["question_id"], "turn": turn,
            "task": rec["task"], "method": method, "prompt_tokens": len(prompt),
            "new_tokens": len(ids), "forwards": o["forwards"], "tau": len(ids) / max(o["forwards"], 1),
            "time_s": statistics.median(shares), "tok_s": statistics.median(rates),
            "repeats": len(m.secs), "time_s_runs": shares, "tok_s_runs": rates,
            "tok_s_min": min(rates), "tok_s_max": max(rates),
            "ttft_s": m.ttft[j],
            "decode_s": statistics.median(decode) if decode and None not in decode else None,
            "peak_mem_mib": m.peak_mib, "peak_mem_rise_mib": m.peak_rise_mib,
            "step_tokens": o["step_tokens"], "accept_lengths": o["accept_lengths"],
            "identical_to_ar": (ids == ar_ids) if self.sp.greedy else None,
            "finish_reason": o["finish_reason"], "stats": o["stats"], "plan": m.extra.get("plan"),
            # the batch's decoding steps, phase by phase (first repeat), on its first record only
            "step_phases": m.extra.get("step_phases") if j == 0 else None,
            "text": self.text(ids), "output_ids": ids,
        }
        if rec["next_turns"]:  # a conversation: the messages this turn was asked with
            out["messages"] = conv["msgs"][method]
        return out

"""Summaries of benchmark records: the methods x tasks table (Markdown) and a chart (PNG)."""

import statistics
import warnings
from collections import Counter, defaultdict
from pathlib import Path
from typing import Optional


def summarize(records: list[dict], batch_size: int = 1) -> dict[tuple[str, str], dict]:
    """(method, task) -> totals and ratios; speedup is tokens/s over "ar" on the same task,
    measured in the same run: with repeats (interleaved rounds, bench/loop.py) the median over
    the rounds of the ratio within each round, with its min-max (``speedup_min``,
    ``speedup_max``; None after a single round). Tasks also get an "all" row. ``batch_size``:
    the run's; records of a batched run written before they held ``decode_s`` have no decoding
    time (their time_s is a share of the batch's wall time, ttft_s the whole batch's prefill)."""
    groups = defaultdict(list)
    for r in records:
        groups[(r["method"], r["task"])].append(r)
        groups[(r["method"], "all")].append(r)
    out = {}
    for (method, task), rs in groups.items():
        new = sum(r["new_tokens"] for r in rs)
        secs = sum(r["time_s"] for r in rs)
        fwd = sum(r["forwards"] for r in rs)
        same = [r["identical_to_ar"] for r in rs if r.get("identical_to_ar") is not None]
        runs = _tok_s_runs(rs, new)
        ttft = [r["ttft_s"] for r in rs if r.get("ttft_s") is not None]
        peaks = [r for r in rs if r.get("peak_mem_mib") is not None]
        # after the first token: the tokens decoding added over the time it took, without the
        # prefill, which every method shares and which dilutes their differences on long prompts
        after_first = [decode_seconds(r, batch_size) for r in rs]
        decode_tok_s = (sum(r["new_tokens"] - 1 for r in rs) / sum(after_first)
                        if None not in after_first and sum(after_first) > 0 else float("nan"))
        out[(method, task)] = {
            "prompts": len(rs), "new_tokens": new, "time_s": secs, "forwards": fwd,
            # tokens/s: the median over repeats of (new tokens / time of all the group's prompts)
            "tok_s": statistics.median(runs), "tok_s_min": min(runs), "tok_s_max": max(runs), "repeats": len(runs),
            "tok_s_runs": runs,
            # tau: new tokens per forward, pooled over the prompts (each record holds its own)
            "tau": new / max(fwd, 1),
            "mean_step_tokens": (sum(r["step_tokens"] for r in rs) / fwd)
            if fwd and all(r.get("step_tokens") is not None for r in rs) else float("nan"),
            "identical": (sum(same) / len(same)) if same else None,
            "ttft_s": statistics.median(ttft) if ttft else None,
            "decode_tok_s": decode_tok_s,
            "peak_mem_mib": max(r["peak_mem_mib"] for r in peaks) if peaks else None,
            "peak_mem_rise_mib": max(r["peak_mem_rise_mib"] for r in peaks) if peaks else None,
        }
    for (method, task), s in out.items():
        base = out.get(("ar", task))
        s["speedup"] = s["tok_s"] / base["tok_s"] if base and base["tok_s"] > 0 else float("nan")
        s["speedup_min"] = s["speedup_max"] = None
        if base and len(s["tok_s_runs"]) == len(base["tok_s_runs"]) > 1:
            # round r of every method ran back to back (interleaved rounds): pair them, so that a
            # slow spell of the machine in one round does not count against one method alone
            ratios = [a / b if b > 0 else float("nan") for a, b in zip(s["tok_s_runs"], base["tok_s_runs"])]
            s["speedup"] = statistics.median(ratios)
            s["speedup_min"], s["speedup_max"] = min(ratios), max(ratios)
        s["decode_speedup"] = (s["decode_tok_s"] / base["decode_tok_s"]
                               if base and base["decode_tok_s"] > 0 else float("nan"))
    return out


def decode_seconds(r: dict, batch_size: int = 1) -> Optional[float]:
    """A record's decoding time after its first token: ``decode_s`` (a batch's time after its
    prefill, shared by the tokens each sequence decoded), else at batch 1 its time after the first
    token; None where neither is known."""
    if r.get("decode_s") is not None:
        return r["decode_s"]
    if batch_size == 1 and r.get("ttft_s") is not None:
        return r["time_s"] - r["ttft_s"]
    return None


def _tok_s_runs(rs: list[dict], new: int) -> list[float]:
    """Tokens/s of the group in each repeat (records without ``time_s_runs`` ran once)."""
    times = [r.get("time_s_runs") or [r["time_s"]] for r in rs]
    n = min(len(t) for t in times)
    totals = [sum(t[i] for t in times) for i in range(n)]
    return [new / t if t > 0 else float("nan") for t in totals]


def _fmt(x, spec=".2f") -> str:
    if x is None:
        return "-"
    if isinstance(x, float) and x != x:
        return "-"
    return format(x, spec)


def markdown(records: list[dict], header: dict, methods: list[str], tasks: list[str]) -> str:
    s = summarize(records, header.get("batch_size", 1))
    lines = ["# Benchmark results", ""]
    for k, v in header.items():
        if not isinstance(v, (dict, list)) or k == "skipped":  # machine-readable entries stay in the JSON
            lines.append(f"- **{k}**: {v}")
    lines += ["", "tokens/s: median over the repeats (each repeat: new tokens / wall time of the group's prompts); "
              "min-max: the range over the repeats. Speedup: tokens/s over our autoregressive decoding with "
              "the same kernels, same run (with repeats: the median over the rounds of that ratio within each "
              "round, min-max beside it; every round runs every method once, back to back). tau: new tokens "
              "per forward after prefill. TTFT: median time to first "
              "token (prefill of the batch + first token). peak memory: see the header's memory line. identical: "
              "share of greedy outputs equal to autoregressive (n/a when sampling).", ""]
    cols = tasks + (["all"] if len(tasks) > 1 else [])
    lines += ["| method | task | prompts | new tokens | forwards | tokens/s | min-max | speedup | min-max | tau "
              "| query tokens/forward | TTFT ms | peak MiB (+run) | identical |",
              "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for t in cols:
        for m in methods:
            x = s.get((m, t))
            if x is None:
                continue
            rng = f"{_fmt(x['tok_s_min'], '.1f')}-{_fmt(x['tok_s_max'], '.1f')}" if x["repeats"] > 1 else "-"
            srng = f"{_fmt(x['speedup_min'])}-{_fmt(x['speedup_max'])}" if x["speedup_min"] is not None else "-"
            mem = "-" if x["peak_mem_mib"] is None else \
                f"{x['peak_mem_mib']:.0f} (+{x['peak_mem_rise_mib']:.0f})"
            ttft = None if x["ttft_s"] is None else x["ttft_s"] * 1e3
            ident = "n/a" if x["identical"] is None else _fmt(x["identical"], ".0%")
            lines.append(f"| {m} | {t} | {x['prompts']} | {x['new_tokens']} | {x['forwards']} "
                         f"| {_fmt(x['tok_s'], '.1f')} | {rng} | {_fmt(x['speedup'])} | {srng} | {_fmt(x['tau'])} "
                         f"| {_fmt(x['mean_step_tokens'], '.1f')} "
                         f"| {_fmt(ttft, '.0f')} | {mem} | {ident} |")
    lines.append("")
    tables = [("speedup", "speedup over ar"),
              ("decode_speedup", "speedup over ar after the first token (decoding alone, without the prefill every "
                                 "method shares" + ("; a batch's decoding time after its prefill" if
                                                    header.get("batch_size", 1) > 1 else "") + ")")]
    tables.append(("tau", "tau (new tokens per forward)"))
    for metric, title in tables:
        lines += [f"### {title}", "", "| method | " + " | ".join(cols) + " |", "|---|" + "---:|" * len(cols)]
        for m in methods:
            lines.append(f"| {m} | " + " | ".join(_fmt(s.get((m, t), {}).get(metric)) for t in cols) + " |")
        lines.append("")
    plans = planner_summary(records)
    phases = phase_summary(records)
    if plans:
        lines += ["### step planner (all tasks)", "",
                  "Predicted: expected new tokens per predicted forward time, over a one-token step's; "
                  "measured: tokens/s over ar. Forward time predicted from the measured step-cost curve "
                  "(plus, for a draft model, the time its own forwards took); "
                  "measured step time includes the host's work; forward: the measured forward alone "
                  "(the step clock's), against the curve's prediction.", "",
                  "| method | query tokens / sequence step | expected tokens / step | predicted ms / step "
                  "| measured ms / step | forward ms / step | predicted speedup | measured speedup |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|"]
        for m in methods:
            p = plans.get(m)
            if p is None:
                continue
            lines.append(f"| {m} | {_fmt(p['step_tokens'], '.1f')} | {_fmt(p['expected_tokens'])} "
                         f"| {_fmt(p['predicted_ms'], '.1f')} | {_fmt(p['measured_ms'], '.1f')} "
                         f"| {_fmt(phases.get(m, {}).get('forward'), '.1f')} "
                         f"| {_fmt(p['predicted_speedup'])} | {_fmt(s.get((m, 'all'), {}).get('speedup'))} |")
        lines.append("")
    if phases:
        from decoding.stats import PHASES

        host = [p for p in PHASES if p != "forward"]
        lines += ["### where a decoding step's time goes (all tasks, ms per step)", "",
                  "Measured in the loop (decoding.stats.StepClock), first repeat. forward: the model's forward "
                  "(on a GPU up to the device's end of it); the rest is host work: the planner, the "
                  "proposer's drafting, packing the step, reducing and verifying the logits, committing the "
                  "K/V, bookkeeping. host share: host ms / (host + forward) ms.", "",
                  "| method | steps | forward | " + " | ".join(host) + " | host | host share |",
                  "|---|---:|---:|" + "---:|" * len(host) + "---:|---:|"]
        for m in methods:
            p = phases.get(m)
            if p is None:
                continue
            lines.append(f"| {m} | {p['steps']} | {_fmt(p['forward'])} | "
                         + " | ".join(_fmt(p[h]) for h in host)
                         + f" | {_fmt(p['host'])} | {_fmt(p['host'] / (p['host'] + p['forward']), '.0%')} |")
        lines.append("")
    if "hf-pld" in methods:
        # tau against transformers' prompt lookup on the same prompts: per task, then the mean of
        # the per-task ratios (each task weighs the same, whatever its prompt count).
        lines += ["### tau / tau of hf-pld (transformers prompt lookup, same prompts)", "",
                  "| method | " + " | ".join(tasks) + " | mean over tasks |", "|---|" + "---:|" * (len(tasks) + 1)]
        for m in methods:
            ratios = [s[(m, t)]["tau"] / s[("hf-pld", t)]["tau"] if (m, t) in s and ("hf-pld", t) in s else None
                      for t in tasks]
            got = [r for r in ratios if r is not None]
            lines.append(f"| {m} | " + " | ".join(_fmt(r) for r in ratios)
                         + f" | {_fmt(sum(got) / len(got) if got else None)} |")
        lines.append("")
    if any(m.startswith("vllm") for m in methods):
        lines += vllm_section(records, methods)
    if any(m.startswith("llamacpp") for m in methods):
        lines += llamacpp_section(records, methods)
    return "\n".join(lines)


def phase_summary(records: list[dict]) -> dict[str, dict]:
    """Per method, the mean ms per decoding step of each phase over all its records' steps
    (``step_phases``: the batch's totals, on its first record)."""
    tot: dict[str, dict] = {}
    for r in records:
        ph = r.get("step_phases")
        if not ph or not ph.get("steps"):
            continue
        t = tot.setdefault(r["method"], {"steps": 0, "ms": defaultdict(float)})
        t["steps"] += ph["steps"]
        for k, v in ph["ms"].items():
            t["ms"][k] += v
    out = {}
    for m, t in tot.items():
        per = {k: v / t["steps"] for k, v in t["ms"].items()}
        per["host"] = sum(v for k, v in per.items() if k != "forward")
        per["steps"] = t["steps"]
        out[m] = per
    return out


VLLM_BUILT_IN = ("vllm-ngram", "vllm-suffix")


def vllm_section(records: list[dict], methods: list[str]) -> list[str]:
    """vLLM beside ours (bench/run.py --compare-vllm) on the prompt turns vLLM ran (first turns),
    every method pooled over them, and the ratios the comparison is about."""
    turns = {r["id"] for r in records if r["method"] == "vllm"}
    if not turns:
        return []
    same = [r for r in records if r["id"] in turns]
    s = {m: x for (m, t), x in summarize(same).items() if t == "all"}
    ident = {}
    for m in methods:
        got = [r["identical_to_vllm"] for r in same if r["method"] == m and r.get("identical_to_vllm") is not None]
        ident[m] = sum(got) / len(got) if got else None
    plain = s.get("vllm", {}).get("tok_s")
    lines = ["### vLLM on the same prompts", "",
             f"The {len(turns)} first turns vLLM ran (later turns follow each engine's own answers), every method "
             "pooled over them. identical: greedy output equal to vLLM plain's, and to our ar's. Load time and "
             "memory: the header's model loads and vllm loads lines; peak MiB here is the largest of a prompt's.", "",
             "| method | tokens/s | over vLLM plain | tau | identical to vLLM plain | identical to our ar "
             "| peak MiB |", "|---|---:|---:|---:|---:|---:|---:|"]
    for m in methods:
        x = s.get(m)
        if x is None:
            continue
        over = x["tok_s"] / plain if plain else None
        lines.append(f"| {m} | {_fmt(x['tok_s'], '.1f')} | {_fmt(over)} | {_fmt(x['tau'])} "
                     f"| {'-' if ident.get(m) is None else _fmt(ident[m], '.0%')} "
                     f"| {'-' if x['identical'] is None else _fmt(x['identical'], '.0%')} "
                     f"| {_fmt(x['peak_mem_mib'], '.0f')} |")
    lines.append("")

    def best(names, key):
        got = [(s[n][key], n) for n in names if n in s and s[n][key] == s[n][key]]
        return max(got) if got else (None, None)

    checks = []
    ours_in = s.get("vllm-specdec")
    b_tau, b_tau_m = best(VLLM_BUILT_IN, "tau")
    b_rate, b_rate_m = best(VLLM_BUILT_IN, "tok_s")
    if ours_in and b_tau:
        checks.append(f"our drafter inside vLLM: tau {ours_in['tau'] / b_tau:.2f}x vLLM's best built-in "
                      f"({b_tau_m}), tokens/s {ours_in['tok_s'] / b_rate:.2f}x ({b_rate_m}); identical to vLLM "
                      f"plain: {_fmt(ident.get('vllm-specdec'), '.0%')}")
    if "ar" in s and plain:
        checks.append(f"our ar: tokens/s {s['ar']['tok_s'] / plain:.2f}x vLLM plain")
    ours = [m for m in methods if m in s and m != "ar" and not m.startswith(("vllm", "hf"))]
    o_rate, o_m = best(ours, "tok_s")
    if o_rate and b_rate:
        checks.append(f"our best speculative method ({o_m}): tokens/s {o_rate / b_rate:.2f}x vLLM's best "
                      f"speculative ({b_rate_m})")
    if checks:
        lines += [f"- {c}" for c in checks] + [""]
    return lines


def llamacpp_section(records: list[dict], methods: list[str]) -> list[str]:
    """llama.cpp beside ours (bench/run.py --compare-llamacpp) on the prompt turns llama-server ran
    (first turns), every method pooled over them: decoding after the first token and the prefill
    apart, and the ratios the comparison is about."""
    turns = {r["id"] for r in records if r["method"] == "llamacpp"}
    if not turns:
        return []
    same = [r for r in records if r["id"] in turns]
    s = {m: x for (m, t), x in summarize(same).items() if t == "all"}
    ident, prefill, drafts, prefix = {}, {}, {}, {}
    for m in methods:
        rs = [r for r in same if r["method"] == m]
        got = [r["identical_to_llamacpp"] for r in rs if r.get("identical_to_llamacpp") is not None]
        ident[m] = sum(got) / len(got) if got else None
        ttft = [r["ttft_s"] for r in rs if r.get("ttft_s") is not None]
        prefill[m] = (sum(r["prompt_tokens"] for r in rs) / sum(ttft)
                      if rs and len(ttft) == len(rs) and sum(ttft) > 0 else None)
        st = [r["stats"] for r in rs if isinstance(r.get("stats"), dict) and "draft_tokens" in r["stats"]]
        drafts[m] = (sum(x["draft_accepted"] for x in st), sum(x["draft_tokens"] for x in st)) if st else None
        pre = [r["same_prefix_as_ar"] for r in rs if r.get("same_prefix_as_ar") is not None]
        prefix[m] = sum(pre) / len(pre) if pre else None
    plain = s.get("llamacpp", {})
    lines = ["### llama.cpp on the same prompts", "",
             f"The {len(turns)} first turns llama-server ran (later turns follow each engine's own answers), every "
             "method pooled over them. decode tokens/s: the tokens after the first over the time after the first "
             "token (llama.cpp: its timings, predicted_n - 1 over predicted_ms); prefill tokens/s: prompt tokens "
             "over the time to the first token (llama.cpp: prompt_n over prompt_ms). tau: new tokens per forward "
             "after the prefill (llama.cpp: from its accepted drafts). drafts: draft tokens accepted / proposed. "
             "llama.cpp computes on the GGUF's weights as stored, ours on dequantised weights: identical says "
             "how many greedy outputs agree, and before the first difference: the mean number of tokens an output "
             "shares with our ar's.", "",
             "| method | decode tokens/s | over llama.cpp plain | prefill tokens/s | TTFT ms | tokens/s (turn) | tau "
             "| drafts | identical to llama.cpp plain | identical to our ar | before the first difference |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for m in methods:
        x = s.get(m)
        if x is None:
            continue
        over = x["decode_tok_s"] / plain["decode_tok_s"] if plain.get("decode_tok_s") else None
        d = drafts[m]
        ttft = None if x["ttft_s"] is None else x["ttft_s"] * 1e3
        lines.append(f"| {m} | {_fmt(x['decode_tok_s'], '.1f')} | {_fmt(over)} | {_fmt(prefill[m], '.0f')} "
                     f"| {_fmt(ttft, '.0f')} | {_fmt(x['tok_s'], '.1f')} | {_fmt(x['tau'])} "
                     f"| {'-' if d is None else f'{d[0]} / {d[1]}'} "
                     f"| {'-' if ident.get(m) is None else _fmt(ident[m], '.0%')} "
                     f"| {'-' if x['identical'] is None else _fmt(x['identical'], '.0%')} "
                     f"| {_fmt(prefix[m], '.1f')} |")
    lines.append("")

    def best(names):
        got = [(s[n]["decode_tok_s"], n) for n in names if n in s and s[n]["decode_tok_s"] == s[n]["decode_tok_s"]]
        return max(got) if got else (None, None)

    checks = []
    if "ar" in s and plain.get("decode_tok_s"):
        checks.append(f"our ar: decode tokens/s {s['ar']['decode_tok_s'] / plain['decode_tok_s']:.2f}x llama.cpp "
                      f"plain"
                      + (f", prefill {prefill['ar'] / prefill['llamacpp']:.2f}x" if prefill.get("ar")
                         and prefill.get("llamacpp") else ""))
    theirs = [m for m in methods if m.startswith("llamacpp-")]
    ours = [m for m in methods if m in s and m != "ar" and not m.startswith(("llamacpp", "vllm", "hf"))]
    t_rate, t_m = best(theirs)
    o_rate, o_m = best(ours)
    if t_rate and plain.get("decode_tok_s"):
        checks.append(f"llama.cpp's best speculation ({t_m}): decode tokens/s {t_rate / plain['decode_tok_s']:.2f}x "
                      f"llama.cpp plain")
    if o_rate and t_rate:
        checks.append(f"our best speculative method ({o_m}): decode tokens/s {o_rate / t_rate:.2f}x llama.cpp's "
                      f"best ({t_m})")
    if checks:
        lines += [f"- {c}" for c in checks] + [""]
    return lines


def planner_summary(records: list[dict]) -> dict[str, dict]:
    """Per method, the step planner's totals over all its records (those run with a planner)."""
    tot: dict[str, dict] = {}
    for r in records:
        log = r.get("plan")
        if not log or not log.get("steps"):
            continue
        t = tot.setdefault(r["method"], defaultdict(float))
        for k, v in log.items():
            t[k] += v
    out = {}
    for m, t in tot.items():
        ar_rate = t["seq_steps"] / t["one_token_ms"] if t["one_token_ms"] else float("nan")
        out[m] = {"step_tokens": t["step_tokens"] / t["seq_steps"],
                  "expected_tokens": t["expected_tokens"] / t["steps"],
                  "predicted_ms": t["predicted_ms"] / t["steps"], "measured_ms": t["measured_ms"] / t["steps"],
                  "predicted_speedup": (t["expected_tokens"] / t["predicted_ms"]) / ar_rate if t["predicted_ms"]
                  else float("nan")}
    return out


def pyplot():
    """matplotlib's pyplot on the Agg backend, or None with a warning where it is not installed
    (a GPU machine set up with --no-deps): the tables are written either way."""
    try:
        import matplotlib
    except ImportError:
        warnings.warn("matplotlib is not installed: no chart drawn (the tables are written)")
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def chart(records: list[dict], methods: list[str], tasks: list[str], path: Path, title: str = "",
          cost_curve: Optional[dict] = None) -> Optional[Path]:
    """Grouped bars: speedup (left) and tau (middle) per task, one bar per method; with a
    ``cost_curve`` (the header's step_cost_curve) the step cost the planner used (right)."""
    plt = pyplot()
    if plt is None:
        return None

    s = summarize(records)
    cols = tasks + (["all"] if len(tasks) > 1 else [])
    shown = [m for m in methods if m != "ar"] or methods
    panels = 3 if cost_curve else 2
    fig, axes = plt.subplots(1, panels, figsize=(max(8, 1.6 * len(cols) * 2) + 3 * (panels - 2), 4.2))
    width = 0.8 / len(shown)
    for ax, metric, label in ((axes[0], "speedup", "speedup over autoregressive (tokens/s)"),
                              (axes[1], "tau", "tau: tokens per forward")):
        for i, m in enumerate(shown):
            got = [s.get((m, t), {}) for t in cols]
            vals = [x.get(metric, float("nan")) for x in got]
            err = None
            if metric == "speedup" and any(x.get("speedup_min") is not None for x in got):
                # min-max over the interleaved rounds
                err = [[v - x["speedup_min"] if x.get("speedup_min") is not None else 0.0 for v, x in zip(vals, got)],
                       [x["speedup_max"] - v if x.get("speedup_max") is not None else 0.0 for v, x in zip(vals, got)]]
            ax.bar([j + i * width for j in range(len(cols))], vals, width, label=m, yerr=err, capsize=2 if err else 0)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks([j + width * (len(shown) - 1) / 2 for j in range(len(cols))])
        ax.set_xticklabels(cols, rotation=20)
        ax.set_ylabel(label)
    axes[0].legend(fontsize=8)
    if cost_curve:
        ts, ms = cost_curve["tokens"], cost_curve["ms"]
        axes[2].plot(ts, [m / ms[0] for m in ms], "o-")
        axes[2].plot(ts, ts, ":", color="gray", label="tokens (linear)")
        axes[2].set_xscale("log", base=2)
        axes[2].set_yscale("log", base=2)
        axes[2].set_xlabel("step tokens")
        axes[2].set_ylabel("forward time / one-token forward")
        axes[2].set_title("step cost (measured, used by the planner)", fontsize=8)
        axes[2].legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def accept_chart(records: list[dict], methods: list[str], path: Path, title: str = "",
                 cap: int = 16) -> Optional[Path]:
    """Per method, the share of its steps (forwards after the prompt's) that gained 1, 2, 3, ...
    tokens (``accept_lengths`` of the records; ``cap``+ pooled). Methods that always gain one
    token (ar, hf) are left out when others are shown. None when no record has step data."""
    counts = {m: Counter(min(n, cap) for r in records if r["method"] == m for n in r.get("accept_lengths") or [])
              for m in methods}
    counts = {m: c for m, c in counts.items() if c}
    if not counts:
        return None
    shown = [m for m, c in counts.items() if set(c) != {1}] or list(counts)
    plt = pyplot()
    if plt is None:
        return None

    top = max(max(counts[m]) for m in shown)
    xs = list(range(1, top + 1))
    width = 0.8 / len(shown)
    fig, ax = plt.subplots(figsize=(max(6.0, 0.5 * len(xs) * max(1, len(shown) / 2)), 4.0))
    for i, m in enumerate(shown):
        total = sum(counts[m].values())
        ax.bar([x + (i - (len(shown) - 1) / 2) * width for x in xs], [counts[m][x] / total for x in xs], width,
               label=f"{m} ({total} steps, mean {sum(k * v for k, v in counts[m].items()) / total:.2f})")
    ax.set_xticks(xs)
    ax.set_xticklabels([str(x) if x < cap else f"{cap}+" for x in xs])
    ax.set_xlabel("tokens gained in a step (accepted draft tokens + 1)")
    ax.set_ylabel("share of steps")
    ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main(argv=None) -> None:
    """Re-render results.md, chart.png and accept_hist.png from a results.json (e.g. after
    changing the report)."""
    import argparse
    import json

    p = argparse.ArgumentParser(description=main.__doc__)
    p.add_argument("results", type=Path, help="a results.json written by bench/run.py")
    args = p.parse_args(argv)
    data = json.loads(args.results.read_text())
    records, head = data["records"], data["header"]
    methods = list(dict.fromkeys(r["method"] for r in records))
    tasks = list(dict.fromkeys(r["task"] for r in records))
    md = markdown(records, head, methods, tasks)
    (args.results.parent / "results.md").write_text(md)
    chart(records, methods, tasks, args.results.parent / "chart.png",
          f"{head.get('model', '')} | {head.get('device', '')} | {head.get('dtype', '')}", head.get("step_cost_curve"))
    accept_chart(records, methods, args.results.parent / "accept_hist.png", head.get("model", ""))
    print(md)


if __name__ == "__main__":
    main()

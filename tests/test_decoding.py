"""Every speculative method is lossless: greedy output token-identical to plain greedy."""

import pytest
import torch

from decoding.draft import DraftModel, DraftModelConfig
from decoding.generate import generate
from decoding.jacobi import JacobiConfig
from decoding.lookahead import LookaheadConfig, NgramPool
from decoding.methods import METHODS, make_proposer
from decoding.prompt_lookup import PromptLookup, PromptLookupConfig
from helpers import ours_from_hf, tiny_hf_model
from kernels.backend import TorchBackend
from models.config import ModelConfig
from models.loader import build_model

SPEC = [m for m in METHODS if m != "ar"]


def tiny_draft(model, n_layers=1):
    """A layer-truncated copy of ``model`` (shares its vocabulary): a cheap, real draft model."""
    cfg = ModelConfig(**{**{f: getattr(model.cfg, f) for f in model.cfg.__slots__}, "num_layers": n_layers})
    sd = {}
    for k, v in model.state_dict().items():
        if k.startswith("layers.") and int(k.split(".")[1]) >= n_layers:
            continue
        sd[k] = v
    draft = build_model(cfg, _to_hf_names(sd, cfg), model.backend)
    return draft


def _to_hf_names(sd, cfg):
    """Our parameter names -> Hugging Face ones (inverse of Transformer.load_hf_state_dict)."""
    out = {"model.embed_tokens.weight": sd["embed.weight"], "model.norm.weight": sd["norm"]}
    if "lm_head.weight" in sd:
        out["lm_head.weight"] = sd["lm_head.weight"]
    q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    for i in range(cfg.num_layers):
        p, h = f"layers.{i}.", f"model.layers.{i}."
        wq, wk, wv = sd[p + "wqkv.weight"].split([q, kv, kv])
        out.update({h + "self_attn.q_proj.weight": wq, h + "self_attn.k_proj.weight": wk,
                    h + "self_attn.v_proj.weight": wv, h + "self_attn.o_proj.weight": sd[p + "wo.weight"],
                    h + "input_layernorm.weight": sd[p + "attn_norm"],
                    h + "post_attention_layernorm.weight": sd[p + "mlp_norm"],
                    h + "mlp.down_proj.weight": sd[p + "w_down.weight"]})
        if cfg.qkv_bias:
            bq, bk, bv = sd[p + "wqkv.bias"].split([q, kv, kv])
            out.update({h + "self_attn.q_proj.bias": bq, h + "self_attn.k_proj.bias": bk,
                        h + "self_attn.v_proj.bias": bv})
        gate, up = sd[p + "w_gate_up.weight"].chunk(2)
        out.update({h + "mlp.gate_proj.weight": gate, h + "mlp.up_proj.weight": up})
    return out


def proposer(name, model, small=False):
    if name == "draft":
        # the real model drafts for itself (every greedy draft is accepted: the acceptance
        # path is exercised); the tiny model gets a 1-layer truncation (mostly rejected)
        return DraftModel(tiny_draft(model, 1) if small else model, DraftModelConfig(num_draft=4))
    if small and name.startswith("lookahead"):
        return make_proposer(name, config=LookaheadConfig(window=3, ngram=3, guesses=3, with_pld=name.endswith("pld")))
    return make_proposer(name)


def outputs(results):
    return [r.output_ids for r in results]


# ---- the real default model (torch backend, fp32) -------------------------------------------
@pytest.fixture(scope="module")
def real8(smol):
    """8 real prompts: 2 chat (MT-bench), 2 code (HumanEval), 2 summarization, 2 QA (ACLSum),
    the shortest of the suite's test split to keep CI fast, and their plain greedy outputs."""
    from bench.data.suite import load_suite

    model, tok = smol
    prompts = []
    for task in ("chat", "code", "summarization", "qa"):
        recs = sorted(load_suite(tasks=task, split="test"), key=lambda r: r["prompt_tokens"])[:2]
        for r in recs:
            text = r["turns"][0] if task == "chat" else r["prompt"]
            prompts.append(tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                                   tokenize=True, return_dict=False))
    ref = [generate(model, [p], max_new_tokens=48)[0].output_ids for p in prompts]
    return prompts, ref


@pytest.mark.parametrize("name", SPEC)
def test_real_model_greedy_lossless(smol, real8, name):
    model, _ = smol
    prompts, ref = real8
    # a ragged batch of 4, twice, then batch 1 on the first and last prompt
    for chunk in (slice(0, 4), slice(4, 8)):
        res = generate(model, prompts[chunk], proposer(name, model), max_new_tokens=48)
        assert outputs(res) == ref[chunk]
    for i in (0, 7):
        assert generate(model, [prompts[i]], proposer(name, model), max_new_tokens=48)[0].output_ids == ref[i]


# ---- tiny random model: both kernel backends ---------------------------------------------------
@pytest.fixture(scope="module", params=["torch", "triton"])
def tiny(request):
    return ours_from_hf(tiny_hf_model("llama", seed=3), kernel=request.param).model


TINY_PROMPTS = [[5, 6, 7, 8, 5, 6, 7, 9], [1, 2, 3, 1, 2, 3, 1, 2, 3, 4, 5, 6, 1, 2, 3, 11, 12],
                [40], [7, 7, 7, 7, 8, 8]]


@pytest.mark.parametrize("name", SPEC)
def test_tiny_greedy_lossless_both_backends(tiny, name):
    ref = [generate(tiny, [p], max_new_tokens=20, eos_token_ids=())[0].output_ids for p in TINY_PROMPTS]
    res = generate(tiny, TINY_PROMPTS, proposer(name, tiny, small=True), max_new_tokens=20, eos_token_ids=())
    assert outputs(res) == ref
    assert all(len(o) == 20 for o in ref)  # no EOS configured: max_new_tokens is exact
    assert sum(r.stats.forwards for r in res) < sum(len(o) for o in ref) or name == "jacobi"


class RecordingPLD(PromptLookup):
    def observe(self, seq, tree, rows, logits, path, new_tokens):
        super().observe(seq, tree, rows, logits, path, new_tokens)
        self.steps.append((len(path) - 1, list(new_tokens)))


@pytest.mark.parametrize("cfg", [
    LookaheadConfig(window=4, ngram=2, guesses=2),  # N = 2: the window is one level (Jacobi-like)
    LookaheadConfig(window=3, ngram=4, guesses=2, window_shift="accepted", with_pld=True),
    LookaheadConfig(window=5, ngram=3, guesses=0, pool_from_prompt=False, pool_from_output=False),
])
def test_lookahead_variants_lossless(cfg):
    model = ours_from_hf(tiny_hf_model("llama", seed=3)).model
    ref = [generate(model, [p], max_new_tokens=24, eos_token_ids=())[0].output_ids for p in TINY_PROMPTS]
    res = generate(model, TINY_PROMPTS, make_proposer("lookahead+pld" if cfg.with_pld else "lookahead", config=cfg),
                   max_new_tokens=24, eos_token_ids=())
    assert outputs(res) == ref


def test_eos_inside_accepted_draft_ends_sequence():
    model = ours_from_hf(tiny_hf_model("llama", seed=3)).model
    base = generate(model, [[40]], max_new_tokens=12, eos_token_ids=())[0].output_ids
    # find a prompt and EOS that PLD reaches inside an accepted draft: the last step accepted
    # at least as many drafts as tokens it kept, so the EOS was a draft token, not the bonus
    found = None
    for j in range(2, 12):
        prompt = [40] + base[:j]  # the model's own text: its continuation repeats the prompt
        plain = generate(model, [prompt], max_new_tokens=30, eos_token_ids=())[0].output_ids
        for eos in dict.fromkeys(plain[1:]):
            rec = RecordingPLD(PromptLookupConfig())
            rec.steps = []
            out = generate(model, [prompt], rec, max_new_tokens=30, eos_token_ids=(eos,))[0]
            if not rec.steps:  # the EOS came first, from the prefill
                continue
            drafts, kept = rec.steps[-1]
            if drafts >= len(kept) > 1:
                found = eos
                assert out.output_ids == plain[:plain.index(eos) + 1] and out.finish_reason == "eos"
                break
        if found is not None:
            break
    assert found is not None
    cut = plain[:plain.index(found) + 1]
    for name in METHODS:
        res = generate(model, [prompt, TINY_PROMPTS[0]], proposer(name, model, small=True), max_new_tokens=30,
                       eos_token_ids=(found,))
        assert res[0].output_ids == cut and res[0].finish_reason == "eos", name


def test_stats_are_consistent():
    model = ours_from_hf(tiny_hf_model("llama", seed=3)).model
    res = generate(model, TINY_PROMPTS, make_proposer("lookahead+pld"), max_new_tokens=16, eos_token_ids=())
    for r in res:
        st = r.stats
        assert sum(k * v for k, v in st.accepted_hist.items()) == len(r.output_ids) - 1  # first token: prefill
        assert sum(st.accepted_hist.values()) == st.forwards
        assert all(st.accepted[b] <= st.proposed[b] for b in st.accepted)


# ---- pool, proposers, configurations -------------------------------------------------------
def test_ngram_pool_lru():
    pool = NgramPool(3, capacity=2)
    pool.add_all([1, 2, 3, 1, 4, 5, 1, 2, 3])
    assert pool.get(1) == [(2, 3), (4, 5)]  # (2, 3) refreshed last
    pool.add([1, 9, 9])
    assert pool.get(1) == [(9, 9), (2, 3)]
    assert pool.get(7) == [] and len(NgramPool(3, 0).get(1)) == 0


def test_pld_proposes_the_seed_continuation():
    model = ours_from_hf(tiny_hf_model("llama", seed=3)).model
    p = make_proposer("pld", config=PromptLookupConfig(max_ngram=3, num_draft=3))
    from decoding.generate import Sequence
    from models.runner import ModelRunner

    seq = Sequence(sid=0, prompt=[1, 2, 3, 4, 1, 2], max_new_tokens=10, generator=None, output=[3])
    p.start([seq], ModelRunner(model, cache_tokens=64), None)
    tree = p.propose([seq], [9])[0]
    assert tree.tokens == [3, 4, 1, 2]


@pytest.mark.parametrize("make, match", [
    (lambda: LookaheadConfig(window=1), "window"),
    (lambda: LookaheadConfig(ngram=1), "ngram"),
    (lambda: LookaheadConfig(guesses=-1), "guesses"),
    (lambda: LookaheadConfig(window_shift="two"), "window_shift"),
    (lambda: PromptLookupConfig(num_draft=0), "num_draft"),
    (lambda: PromptLookupConfig(min_ngram=3, max_ngram=2), "max_ngram"),
    (lambda: JacobiConfig(window=0), "window"),
    (lambda: DraftModelConfig(num_draft=0), "num_draft"),
    (lambda: make_proposer("beam"), "unknown method"),
    (lambda: make_proposer("draft"), "draft model"),
])
def test_bad_configurations(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_draft_model_with_another_vocabulary():
    target = ours_from_hf(tiny_hf_model("llama", seed=3)).model
    other = ours_from_hf(tiny_hf_model("llama", seed=4, vocab_size=50)).model
    with pytest.raises(ValueError, match="vocabulary"):
        generate(target, [[1, 2, 3]], DraftModel(other), max_new_tokens=4)
    assert isinstance(target.backend, TorchBackend)
    torch.testing.assert_close(target.embed.weight[:1], target.embed.weight[:1])

"""The embedded default model (SmolLM2-135M GGUF) against transformers' own load of it."""

import torch

from decoding.generate import generate


def test_logits_match_transformers_gguf_load(smol, smol_prompts, hf_smol):
    model, _ = smol
    from models.runner import ModelRunner, StepInput

    runner = ModelRunner(model, cache_tokens=1024)
    ids = smol_prompts[2]
    runner.add_sequence(0)
    ours = runner.step([StepInput(0, ids)])[0]
    with torch.no_grad():
        ref = hf_smol(torch.tensor([ids])).logits[0]
    # fp32; logits reach ~40 in magnitude, so this is ~3e-5 relative
    assert (ours - ref).abs().max() < 1e-3


def test_greedy_identical_to_transformers_generate(smol, smol_prompts, hf_smol):
    model, _ = smol
    prompts = smol_prompts[:3]
    batch = generate(model, prompts, max_new_tokens=40)  # ragged batch of 3
    for p, ours in zip(prompts, batch):
        with torch.no_grad():
            ref = hf_smol.generate(torch.tensor([p]), max_new_tokens=40, do_sample=False)[0, len(p):].tolist()
        assert ours.output_ids == ref
        assert generate(model, [p], max_new_tokens=40)[0].output_ids == ref


def test_triton_backend_same_greedy_tokens(smol, smol_prompts):
    """--kernel triton (interpreted here: slow, so few tokens and a small window) against
    --kernel torch on the default model: prefill, decode steps and lookahead+pld trees (window,
    pool n-grams and prompt lookup under one mask) through the Triton kernels."""
    from decoding import LookaheadConfig
    from decoding.methods import make_proposer
    from models.loader import load_model

    model, _ = smol
    triton_model, _ = load_model(backend="triton")
    assert triton_model.kv_cache_dtype() == torch.float32  # the Triton kernels read the rows' dtype
    p = smol_prompts[0]
    model.kv_dtype = torch.float32  # the same K/V numbers on both backends (the torch one takes fp16 by default)
    try:
        ref = generate(model, [p], max_new_tokens=8).pop().output_ids
    finally:
        model.kv_dtype = None
    small = LookaheadConfig(window=3, ngram=3, guesses=3)
    out = generate(triton_model, [p], make_proposer("lookahead+pld", config=small), max_new_tokens=8).pop()
    assert out.output_ids == ref and out.stats.step_tokens > 2 * out.stats.forwards  # trees were sent


def test_tuned_products_change_no_greedy_token(smol, smol_prompts):
    """The default model is loaded with tuned products (models/tune.py), whose form depends on
    the step's rows: a row's logits inside a 12-token step and alone differ by float rounding
    only, and greedy tokens equal those of plain F.linear."""
    from models.loader import load_model
    from models.runner import ModelRunner, StepInput

    model, _ = smol
    assert model.head_plan is not None
    plain, _ = load_model(tune=False, weights="fp32")
    p = smol_prompts[1]
    ref = generate(plain, [p], max_new_tokens=24)[0].output_ids
    assert generate(model, [p], max_new_tokens=24)[0].output_ids == ref
    steps = ModelRunner(model, cache_tokens=512)
    steps.add_sequence(0)
    steps.step([StepInput(0, p)])
    steps.commit({0: list(range(len(p)))})
    chunk = ref[:12]
    together = steps.step([StepInput(0, chunk)])[0]  # (12, V) one step of 12 rows
    alone = []
    for i, t in enumerate(chunk):  # the same rows one at a time (M = 1)
        alone.append(steps.step([StepInput(0, [t])])[0][0])
        steps.commit({0: [0]})
    alone = torch.stack(alone)
    assert (together - alone).abs().max() < 1e-3
    assert together.argmax(-1).tolist() == alone.argmax(-1).tolist() == ref[1:13]

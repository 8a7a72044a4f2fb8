"""Our forward against transformers' on tiny random Llama / Mistral / Qwen2 models (fp32)."""

import pytest
import torch

from helpers import ours_from_hf, tiny_hf_model
from models.config import ModelConfig
from models.runner import StepInput

TOL = 1e-4  # fp32 max abs error on logits

CASES = {
    "llama": dict(arch="llama"),
    "llama-untied-llama3-rope": dict(arch="llama", tie_word_embeddings=False, rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 32}),
    "llama-tied": dict(arch="llama", tie_word_embeddings=True),
    "mistral-window": dict(arch="mistral", sliding_window=6),  # shorter than the prompts
    "qwen2-bias": dict(arch="qwen2", tie_word_embeddings=True),
}


def hf_logits(hf, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf(torch.tensor([ids])).logits[0]


@pytest.mark.parametrize("case", list(CASES))
def test_prefill_then_decode_matches_transformers(case):
    kw = dict(CASES[case])
    hf = tiny_hf_model(kw.pop("arch"), **kw)
    runner = ours_from_hf(hf, block_size=4)
    g = torch.Generator().manual_seed(1)
    seqs = {s: torch.randint(0, 97, (n,), generator=g).tolist() for s, n in zip((3, 0, 7), (5, 17, 11))}
    for s in seqs:
        runner.add_sequence(s)
    # prefill: a ragged batch in one step, logits of every row
    outs = runner.step([StepInput(s, ids) for s, ids in seqs.items()])
    for (s, ids), out in zip(seqs.items(), outs):
        assert (out - hf_logits(hf, ids)).abs().max() < TOL, s
    runner.commit({s: list(range(len(ids))) for s, ids in seqs.items()})
    # decode: one token per step, then a 3-token causal chunk, through the shuffled paged cache
    for step in range(5):
        n = 3 if step == 3 else 1
        new = {s: torch.randint(0, 97, (n,), generator=g).tolist() for s in seqs}
        outs = runner.step([StepInput(s, new[s]) for s in seqs])
        for s, out in zip(seqs, outs):
            seqs[s] = seqs[s] + new[s]
            ref = hf_logits(hf, seqs[s])[-n:]
            assert (out - ref).abs().max() < TOL, (s, step)
        runner.commit({s: list(range(n)) for s in seqs})


def test_config_from_hf_rejects_unknown_architecture():
    with pytest.raises(ValueError, match="unsupported architecture"):
        ModelConfig.from_hf({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"})


def test_config_checks_heads():
    with pytest.raises(ValueError, match="num_kv_heads"):
        ModelConfig(vocab_size=10, hidden_size=64, intermediate_size=8, num_layers=1, num_heads=4, num_kv_heads=3)


@pytest.mark.parametrize("head_dim", [16, 64, 128])
def test_a_cpu_steps_rope_table_holds_rope_tables_rows(head_dim):
    """On the CPU in fp32 a planned step's cos / sin come from a table of every position (grown
    by doubling past the longest sequence, at least what it needs): bit for bit ``rope_tables``
    at every position, across the table's growth; no table for a step the torch backend did not
    plan. (The one-call stack reads the table by position: tests/test_kernel_skinny.py holds it
    to the per-op path, which indexes it.)"""
    from kernels.torch_plan import SeqPlan, StepPlan
    from models import llama

    model = ours_from_hf(tiny_hf_model("llama", seed=1, head_dim=head_dim)).model
    for length, size in ((5, 256), (300, 512), (301, 512), (1500, 1500), (40, 1500)):
        positions = torch.arange(length, dtype=torch.int32)
        plan = StepPlan([SeqPlan(0, 1, length, torch.zeros(1, dtype=torch.int32), 1, None, False)],
                        torch.zeros(1, dtype=torch.int64))
        table = model._rope_table(plan, torch.float32, positions[:1])
        assert table.shape == (2, size, 1, head_dim)
        ref = llama.rope_tables(positions, model.inv_freq, torch.float32)
        assert torch.equal(table[0, :length], ref[0]) and torch.equal(table[1, :length], ref[1])
    assert model._rope_table(None, torch.float32, positions) is None
    assert model._rope_table(plan, torch.bfloat16, positions) is None


def test_building_on_the_meta_device_leaves_torch_dynamo_unimported():
    """Every load builds the model on the meta device; an op there (nn.Embedding's init, the
    rotary frequencies) runs torch's Python reference ops, whose first use imports torch._dynamo
    (about 1 s of a command-line answer). In a fresh process: a load imports no torch._dynamo,
    and its model has the loaded numbers (the frequencies rope_inv_freq's)."""
    import subprocess
    import sys
    from pathlib import Path

    code = ("import sys, torch\n"
            "from models.loader import default_model_path, load_model\n"
            "from models.llama import rope_inv_freq\n"
            "before = 'torch._dynamo' in sys.modules\n"
            "model = load_model(default_model_path(), weights='native').model\n"
            "assert before or 'torch._dynamo' not in sys.modules, 'the load imported torch._dynamo'\n"
            "assert not before, 'imported before the load: the test cannot tell'\n"
            "assert torch.equal(model.inv_freq, rope_inv_freq(model.cfg))\n"
            "assert model.embed.weight.device.type == 'cpu' and model.embed.weight.isfinite().all()\n")
    here = Path(__file__).parent
    env = {**__import__("os").environ, "PYTHONPATH": f"{here}:{here.parent}"}
    done = subprocess.run([sys.executable, "-c", code], cwd=here.parent, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]


def test_a_model_built_on_a_device_is_initialised_as_before():
    """Built on a device that holds numbers, the embedding is nn.Embedding's own init (the same
    numbers for the same seed) and the rotary frequencies are computed."""
    from kernels.backend import get_backend
    from models.llama import Transformer, rope_inv_freq

    cfg = ModelConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_layers=1, num_heads=4, num_kv_heads=2)
    torch.manual_seed(3)
    model = Transformer(cfg, get_backend("torch"))
    torch.manual_seed(3)
    ref = torch.nn.Embedding(cfg.vocab_size, cfg.hidden_size)
    assert torch.equal(model.embed.weight, ref.weight) and torch.equal(model.inv_freq, rope_inv_freq(cfg))

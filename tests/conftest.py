import os

import pytest
import torch

# Triton decides at import time whether kernels run interpreted; without a GPU they must.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# The Triton kernels' own tests. On a GPU with Triton compiling (not interpreted) they run there:
# every tensor they make (and their random generators) is created on the GPU, the references run
# on the same inputs there, and a kernel launched with host tensors could not run anyway.
# Everything else in the suite is a CPU suite (on a GPU machine run it with TRITON_INTERPRET=1).
GPU_KERNEL_TESTS = {"test_kernel_ngram_match", "test_kernel_kv_ops", "test_kernel_tree_attention", "test_kernel_norm",
                    "test_kernel_checks",
                    "test_kernel_elementwise", "test_kernel_exact"}


def kernels_on_gpu() -> bool:
    return torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") != "1"


class _CudaGenerator(torch.Generator):
    """torch.Generator made on the GPU unless told otherwise. A class, not a function: modules
    imported while a test runs (torch.distributed, through transformers) use it in annotations."""

    def __new__(cls, device="cuda"):
        return super().__new__(cls, device=device)


@pytest.fixture(autouse=True)
def _kernel_tests_on_gpu(request, monkeypatch):
    if request.module.__name__.rpartition(".")[2] not in GPU_KERNEL_TESTS or not kernels_on_gpu():
        yield
        return
    monkeypatch.setattr(torch, "Generator", _CudaGenerator)
    torch.set_default_device("cuda")
    try:
        yield
    finally:
        torch.set_default_device(None)

# Real prompts for the default-model tests (chat, code, summarization, QA).
REAL_PROMPTS = [
    "What is the capital of France? Answer in one sentence.",
    "Write a Python function that returns the n-th Fibonacci number, with a docstring.",
    "Summarize in two sentences: The Amazon rainforest covers much of the Amazon basin of South America. "
    "It spans nine nations and holds the largest variety of species on Earth. Deforestation, driven by "
    "cattle ranching and farming, threatens it, and scientists warn that it may turn from a carbon sink "
    "into a carbon source.",
    "Read the text and answer the question. Text: The Eiffel Tower was built for the 1889 World's Fair "
    "in Paris and was designed by the company of Gustave Eiffel. Question: For which event was the Eiffel "
    "Tower built?",
]


@pytest.fixture(scope="session")
def smol():
    """The embedded default model with the torch backend (fp32, CPU) and its tokenizer (the
    quantized path, the default on a CPU with the kernels, has tests/test_quant_model.py)."""
    from models.loader import load_model

    return load_model(weights="fp32")


@pytest.fixture(scope="session")
def smol_prompts(smol):
    _, tok = smol
    return [tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                    tokenize=True, return_dict=False) for q in REAL_PROMPTS]


@pytest.fixture(scope="session")
def hf_smol():
    """transformers' own GGUF load of the default model (its reference implementation)."""
    from transformers import AutoModelForCausalLM

    from models.loader import default_model_path

    path = default_model_path()
    return AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name).eval()

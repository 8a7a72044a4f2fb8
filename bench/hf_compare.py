"""Hugging Face transformers ``generate`` on the same prompts: greedy and prompt lookup.

Used by ``bench/run.py --compare-hf``: same model file, same dtype, same device, same run.
A forward hook counts the model calls, so tau is measured the same way as ours: new tokens
per call after the one that processed the prompt (transformers' prompt lookup already
verifies drafts in that first call, which can only favour it slightly).
"""

import time
from pathlib import Path

import torch

HF_METHODS = ("hf", "hf-pld")


def load_hf_model(path: Path, dtype: torch.dtype, device: str):
    from transformers import AutoModelForCausalLM

    if path.suffix == ".gguf":
        model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=dtype)
    else:
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype)
    return model.to(device).eval()


@torch.inference_mode()
def hf_generate(model, prompt: list[int], method: str, max_new_tokens: int, eos: tuple[int, ...]) -> dict:
    calls = []
    handle = model.register_forward_hook(lambda *a: calls.append(1))
    kw = dict(max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=list(eos) or None,
              pad_token_id=eos[0] if eos else 0)
    if method == "hf-pld":
        kw.update(prompt_lookup_num_tokens=10, max_matching_ngram_size=3)
    ids = torch.tensor([prompt], device=model.device)
    try:
        if model.device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = model.generate(ids, attention_mask=torch.ones_like(ids), **kw)
        if model.device.type == "cuda":
            torch.cuda.synchronize()
        secs = time.perf_counter() - t0
    finally:
        handle.remove()
    new = out[0, len(prompt):].tolist()
    forwards = max(len(calls) - 1, 0)
    return {"output_ids": new, "new_tokens": len(new), "forwards": forwards, "time_s": secs,
            "step_tokens": None, "finish_reason": "eos" if new and new[-1] in eos else "length"}

"""Hugging Face transformers ``generate`` on the same prompts: greedy or sampled decoding
(``hf``), prompt lookup (``hf-pld``) and, with a draft model, assisted generation
(``hf-assisted``).

Used by ``bench/run.py --compare-hf``: same model file, same dtype, same device, same run,
the same sampling settings (temperature, top-k, top-p; the seed through ``torch.manual_seed``
before each call) and the same prompt-lookup knobs as ours (``--pld``: the longest n-gram is
``max_matching_ngram_size``, the draft length ``prompt_lookup_num_tokens``). A forward hook
counts the target model's calls, so tau is measured the same way as ours: new tokens per call
after the one that processed the prompt (transformers' prompt lookup and assisted generation
already verify drafts in that first call, which can only favour them slightly). A streamer
gives the time to the first token and the tokens each call brought.
"""

import time
from pathlib import Path
from typing import Callable, Optional

import torch
from transformers.generation.streamers import BaseStreamer

HF_METHODS = ("hf", "hf-pld")
HF_ASSISTED = "hf-assisted"


def load_hf_model(path: Path, dtype: torch.dtype, device: str):
    """A transformers model from a GGUF file (dequantised by transformers) or an HF folder."""
    from transformers import AutoModelForCausalLM

    if path.suffix == ".gguf":
        model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=dtype)
    else:
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype)
    return model.to(device).eval()


class _Stream(BaseStreamer):
    """Hands each batch of new tokens to ``on_tokens(0, tokens)``; transformers' first ``put``
    is the prompt, which is skipped."""

    def __init__(self, on_tokens: Callable[[int, list[int]], bool]):
        self.on_tokens, self.seen_prompt = on_tokens, False

    def put(self, value) -> None:
        if not self.seen_prompt:
            self.seen_prompt = True
            return
        self.on_tokens(0, value.reshape(-1).tolist())

    def end(self) -> None:
        pass


@torch.inference_mode()
def hf_generate(model, prompt: list[int], method: str, max_new_tokens: int, eos: tuple[int, ...], *,
                sampling=None, pld: tuple[int, int] = (3, 10), assistant=None,
                on_tokens: Optional[Callable[[int, list[int]], bool]] = None) -> dict:
    """One prompt with transformers. ``sampling``: a ``decoding.sampling.SamplingParams``
    (None or greedy: do_sample=False); ``pld``: (longest n-gram, draft length) for hf-pld;
    ``assistant``: the draft model for hf-assisted."""
    calls = []
    handle = model.register_forward_hook(lambda *a: calls.append(1))
    kw = dict(max_new_tokens=max_new_tokens, eos_token_id=list(eos) or None, pad_token_id=eos[0] if eos else 0)
    if sampling is None or sampling.greedy:
        kw.update(do_sample=False)
    else:
        kw.update(do_sample=True, temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p)
        if sampling.seed is not None:
            torch.manual_seed(sampling.seed)
    if method == "hf-pld":
        kw.update(prompt_lookup_num_tokens=pld[1], max_matching_ngram_size=pld[0])
    elif method == HF_ASSISTED:
        if assistant is None:
            raise ValueError("hf-assisted needs a draft model (--draft-model)")
        kw.update(assistant_model=assistant)
    elif method != "hf":
        raise ValueError(f"unknown transformers method {method!r}")
    if on_tokens is not None:
        kw.update(streamer=_Stream(on_tokens))
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

"""Text in, text out: a model with its tokenizer.

    from decoding import TextGenerator
    gen = TextGenerator.load()                       # the embedded default model
    out = gen.generate("Name three primary colours.", method="lookahead+pld", max_new_tokens=64)
    print(out[0].text)

Prompts are strings (the chat template is applied unless ``chat_template=False``) or chat
message lists; ``stop`` strings end a sequence as soon as they appear (the text is cut before
them); ``stream(index, piece)`` receives each sequence's new text as it is accepted; the EOS
token never reaches the text. Every other option is ``generate``'s.
"""

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence, Union

from decoding.generate import GenerationResult, generate
from decoding.methods import make_proposer
from decoding.proposer import Proposer
from decoding.sampling import SamplingParams
from decoding.stats import SeqStats

Prompt = Union[str, list[dict]]  # a user message, or chat messages [{"role": ..., "content": ...}]


@dataclass
class TextResult:
    text: str  # the answer, EOS and anything from a stop string on removed
    token_ids: list[int]  # every generated token (EOS included when it ended the sequence)
    finish_reason: str  # "eos" | "length" | "stop"
    prompt_tokens: int
    stats: SeqStats


class _Detokenizer:
    """A sequence's text as its tokens arrive; holds back an incomplete UTF-8 character."""

    def __init__(self, tokenizer, eos: set[int]):
        self.tok, self.eos = tokenizer, eos
        self.ids: list[int] = []
        self.text = ""

    def push(self, tokens: list[int]) -> str:
        self.ids += tokens
        ids = self.ids[:-1] if self.ids and self.ids[-1] in self.eos else self.ids
        text = self.tok.decode(ids, skip_special_tokens=True)
        if text.endswith("\ufffd"):  # the rest of a multi-byte character is still to come
            return ""
        new, self.text = text[len(self.text):], text
        return new


class TextGenerator:
    def __init__(self, model, tokenizer, chat_template: bool = True, cache_dir: Optional[Path] = None):
        self.model, self.tokenizer, self.chat_template = model, tokenizer, chat_template
        self.cache_dir = cache_dir

    @classmethod
    def load(cls, model: Optional[str] = None, **kw) -> "TextGenerator":
        """``models.loader.load_model(model, **kw)`` wrapped (default: the embedded model)."""
        from models.loader import DEFAULT_CACHE_DIR, load_model

        loaded = load_model(model, **kw)
        return cls(loaded.model, loaded.tokenizer, cache_dir=Path(kw.get("cache_dir", DEFAULT_CACHE_DIR)))

    def encode(self, prompt: Prompt) -> list[int]:
        if isinstance(prompt, str) and not self.chat_template:
            return self.tokenizer.encode(prompt, add_special_tokens=True)
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        if not isinstance(messages, list) or not all(isinstance(m, dict) and "content" in m for m in messages):
            raise ValueError("a prompt is a string or a list of chat messages {'role': ..., 'content': ...}")
        return self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                  return_dict=False)

    def generate(self, prompts: Union[Prompt, Sequence[Prompt]], method: Union[str, Proposer] = "ar", *,
                 max_new_tokens: int = 128, sampling: Optional[SamplingParams] = None, stop: Sequence[str] = (),
                 stream: Optional[Callable[[int, str], None]] = None, plan: bool = True,
                 **kw) -> list[TextResult]:
        """One result per prompt. ``method``: a method name or a proposer; ``plan``: size every
        step with the step planner from this device's measured step cost (not for "ar")."""
        single = isinstance(prompts, str) or (isinstance(prompts, list) and prompts and isinstance(prompts[0], dict))
        batch = [prompts] if single else list(prompts)
        if not batch:
            raise ValueError("prompts is empty: give at least one prompt")
        if any(not isinstance(s, str) or not s for s in stop):
            raise ValueError(f"stop must be a list of non-empty strings, got {list(stop)!r}")
        ids = [self.encode(p) for p in batch]
        proposer = make_proposer(method) if isinstance(method, str) else method
        planner = kw.pop("planner", None)
        if planner is None and plan and proposer.name != "ar":
            from decoding.options import planner_for
            from models.loader import DEFAULT_CACHE_DIR
            planner = planner_for(self.model, proposer.name, False, self.cache_dir or DEFAULT_CACHE_DIR)
        eos = set(self.model.cfg.eos_token_ids if kw.get("eos_token_ids") is None else kw["eos_token_ids"])
        texts = [_Detokenizer(self.tokenizer, eos) for _ in batch]
        cut: dict[int, int] = {}

        def on_tokens(i: int, tokens: list[int]) -> bool:
            piece = texts[i].push(tokens)
            hit = [texts[i].text.find(s) for s in stop if s in texts[i].text]
            if hit:
                cut[i] = min(hit)
                shown = len(texts[i].text) - len(piece)
                piece = texts[i].text[shown:cut[i]] if cut[i] > shown else ""
            if stream is not None and piece:
                stream(i, piece)
            return bool(hit)

        res: list[GenerationResult] = generate(self.model, ids, proposer, max_new_tokens=max_new_tokens,
                                               sampling=sampling, planner=planner, on_tokens=on_tokens, **kw)
        out = []
        for i, r in enumerate(res):
            ids_ = r.output_ids[:-1] if r.output_ids and r.output_ids[-1] in eos else r.output_ids
            text = self.tokenizer.decode(ids_, skip_special_tokens=True)
            out.append(TextResult(text[:cut[i]] if i in cut else text, r.output_ids, r.finish_reason,
                                  r.prompt_tokens, r.stats))
        return out

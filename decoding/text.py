"""Text in, text out: a model with its tokenizer.

    from decoding import TextGenerator
    gen = TextGenerator.load()                       # the embedded default model
    out = gen.generate("Name three primary colours.", method="lookahead+pld", max_new_tokens=64)
    print(out[0].text)

Prompts are strings (the chat template is applied unless ``chat_template=False``) or chat
message lists; ``stop`` strings end a sequence as soon as they appear (the text is cut before
them; one string is one stop string, not its characters); ``stream(index, piece)`` receives
each sequence's new text as it is accepted (an end that may begin a stop string is held back
until the next tokens tell), and the pieces add up to the result's text; the EOS token never
reaches the text. The draft
methods take ``draft_model=`` (a TextGenerator or ``load_model``'s result: its tokenizer is
compared with this one's before anything is generated). Every other option is ``generate``'s.
Every argument is checked before the step cost is measured or a token is generated
(decoding/inputs.py, the command line's checks and messages).
"""

import difflib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence, Union

from decoding import inputs
from decoding.generate import GenerationResult, check_prompts, generate
from decoding.methods import METHODS, make_proposer
from decoding.proposer import Proposer
from decoding.sampling import SamplingParams
from decoding.stats import SeqStats

Prompt = Union[str, list[dict]]  # a user message, or chat messages [{"role": ..., "content": ...}]
PASSED_ON = ("eos_token_ids", "planner", "runner", "prefill_chunk", "progress")  # generate's, taken as they are
SAMPLING_FIELDS = ("temperature", "top_k", "top_p", "seed")
# seconds a generator plans with a step-cost curve its process checked, before checking it again
# against the machine (models/cost.py step_cost's recheck_s): the machine drifts within the hour
RECHECK_S = 600.0


@dataclass
class TextResult:
    text: str  # the answer, EOS and anything from a stop string on removed
    token_ids: list[int]  # every generated token (EOS included when it ended the sequence)
    finish_reason: str  # "eos" | "length" | "stop" (a stop string appeared: also where the step that brought it
    # reached max_new_tokens or the EOS, as a draft method's many-token step can; one token at a time it would
    # have stopped there first)
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
        prompt = inputs.prompt(prompt)
        if isinstance(prompt, str) and not self.chat_template:
            return self.tokenizer.encode(prompt, add_special_tokens=True)
        if getattr(self.tokenizer, "chat_template", "") is None:
            raise ValueError("this model's tokenizer has no chat template: feed prompts as raw text (chat_template="
                             "False; on the command line --no-chat-template), or load a chat model")
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        return self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                  return_dict=False)

    def generate(self, prompts: Union[Prompt, Sequence[Prompt]], method: Union[str, Proposer] = "ar", *,
                 max_new_tokens: int = 128, sampling: Optional[SamplingParams] = None,
                 stop: Union[str, Sequence[str], None] = (), stream: Optional[Callable[[int, str], None]] = None,
                 plan: bool = True, draft_model=None, **kw) -> list[TextResult]:
        """One result per prompt. ``method``: a method name or a proposer; ``plan``: size every
        step with the step planner from this device's measured step cost (not for "ar");
        ``draft_model``: for "draft" and "draft+pld", a TextGenerator or ``load_model``'s result
        with the same tokenizer. Bad arguments are a ValueError before anything runs."""
        batch, _ = inputs.prompts(prompts)
        inputs.at_least(max_new_tokens, "max_new_tokens", 0)
        if sampling is not None and not isinstance(sampling, SamplingParams):
            inputs.fail("sampling", sampling, "a SamplingParams (e.g. SamplingParams(temperature=0.7, seed=0)) or None")
        stop = inputs.stop_strings(stop)
        if stream is not None and not callable(stream):
            inputs.fail("stream", stream, "a function stream(index, piece) or None")
        _check_passed_on(kw)
        proposer = self._proposer(method, draft_model)
        ids = [self.encode(p) for p in batch]
        cfg = self.model.cfg
        # the prompts against the context before the step cost is measured (that takes a while)
        check_prompts(ids, max_new_tokens, cfg.max_position_embeddings, cfg.vocab_size)
        planner = kw.pop("planner", None)
        if planner is None and plan and proposer.name != "ar":
            from decoding.options import planner_for
            from models.loader import DEFAULT_CACHE_DIR
            # a curve this process checked in the last RECHECK_S is not probed again: each call
            # paid 0.1-0.2 s for the probe (a one-token pld answer 0.15-0.18 s against ar's 0.06 on
            # the 2-core Emerald Rapids: bench/results/2026-11-28-cpu-side-off/NOTES.md)
            planner = planner_for(self.model, proposer.name, False, self.cache_dir or DEFAULT_CACHE_DIR,
                                  recheck_s=RECHECK_S)
        eos = set(self.model.cfg.eos_token_ids if kw.get("eos_token_ids") is None else kw["eos_token_ids"])
        texts = [_Detokenizer(self.tokenizer, eos) for _ in batch]
        cut: dict[int, int] = {}
        streamed = [0] * len(batch)  # characters of each text handed to stream

        def on_tokens(i: int, tokens: list[int]) -> bool:
            texts[i].push(tokens)
            text = texts[i].text
            hit = [text.find(s) for s in stop if s in text]
            if hit:
                cut[i] = min(hit)
            # what may go out: up to the stop string, or, while none appeared, all but an end
            # that may be the start of one (a newline streamed before the second of "\n\n"
            # arrives could not be taken back)
            upto = cut[i] if hit else len(text) - _stop_prefix(text, stop)
            if stream is not None and upto > streamed[i]:
                stream(i, text[streamed[i]:upto])
                streamed[i] = upto
            return bool(hit)

        res: list[GenerationResult] = generate(self.model, ids, proposer, max_new_tokens=max_new_tokens,
                                               sampling=sampling, planner=planner, on_tokens=on_tokens, **kw)
        out = []
        for i, r in enumerate(res):
            ids_ = r.output_ids[:-1] if r.output_ids and r.output_ids[-1] in eos else r.output_ids
            text = self.tokenizer.decode(ids_, skip_special_tokens=True)
            text = text[:cut[i]] if i in cut else text
            if stream is not None and len(text) > streamed[i]:  # what was held back, at the end
                stream(i, text[streamed[i]:])
            finish = "stop" if i in cut else r.finish_reason
            out.append(TextResult(text, r.output_ids, finish, r.prompt_tokens, r.stats))
        return out

    def _proposer(self, method, draft_model) -> Proposer:
        """``method`` (a name or a Proposer) as a proposer, with ``draft_model`` for the draft
        methods after comparing its tokenizer with this one's."""
        if isinstance(method, Proposer):
            if draft_model is not None:
                raise ValueError("draft_model goes with a method name ('draft', 'draft+pld'); a proposer you built "
                                 "holds its own draft model")
            return method
        if not isinstance(method, str) or method not in METHODS:
            inputs.fail("method", method, f"a Proposer or one of {', '.join(METHODS)}")
        if not method.startswith("draft"):
            if draft_model is not None:
                raise ValueError(f"draft_model is for the methods 'draft' and 'draft+pld'; method {method!r} does not "
                                 f"use one")
            return make_proposer(method)
        if draft_model is None:
            raise ValueError(f"method {method!r} needs draft_model= (TextGenerator.load(NAME) or load_model(NAME) of "
                             f"a smaller model with the same tokenizer)")
        model, tok = (draft_model.model, draft_model.tokenizer) if hasattr(draft_model, "tokenizer") else (None, None)
        if tok is None or not hasattr(tok, "get_vocab"):
            inputs.fail("draft_model", type(draft_model).__name__,
                        "a TextGenerator or load_model's result (the model with its tokenizer, to compare it with "
                        "this one's)")
        inputs.same_tokenizer(self.tokenizer, tok, "this TextGenerator's model", "draft_model")
        return make_proposer(method, draft_model=model)


def _stop_prefix(text: str, stop: list[str]) -> int:
    """The length of the longest end of ``text`` that begins a stop string (0: none)."""
    best = 0
    for s in stop:
        for k in range(min(len(s) - 1, len(text)), best, -1):
            if text.endswith(s[:k]):
                best = k
                break
    return best


def _check_passed_on(kw: dict) -> None:
    """What generate takes besides the named arguments; anything else is a mistake named now
    (not a TypeError after the step cost was measured)."""
    for k in kw:
        if k in PASSED_ON:
            continue
        if k in SAMPLING_FIELDS:
            raise ValueError(f"{k} is a sampling setting: pass sampling=SamplingParams({k}=...)")
        named = ("max_new_tokens", "sampling", "stop", "stream", "plan", "draft_model") + PASSED_ON
        near = difflib.get_close_matches(k, named, n=1)
        hint = f" (did you mean {near[0]}?)" if near else ""
        raise ValueError(f"TextGenerator.generate has no argument {k!r}{hint}; it takes {', '.join(named)}")

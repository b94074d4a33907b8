"""What generation returns to callers."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Usage:
    prompt_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens whose KV came from the radix cache
    completion_tokens: int = 0
    forward_passes: int = 0  # model forward passes this request took part in (prefill chunks and decodes)
    jump_forward_tokens: int = 0  # tokens appended without a forward pass (structured generation)

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def __add__(self, other: Usage) -> Usage:
        return Usage(*(a + b for a, b in zip(vars(self).values(), vars(other).values())))


@dataclass
class TokenLogprob:
    token_id: int
    token: str
    logprob: float
    top: list[tuple[int, str, float]] = field(default_factory=list)  # (id, text, logprob) alternatives


@dataclass
class Completion:
    text: str
    token_ids: list[int]
    finish_reason: str  # "stop" | "length" | "abort" | "error"
    logprobs: list[TokenLogprob] | None = None


@dataclass
class RequestOutput:
    """One prompt's result. `text`, `token_ids` and `finish_reason` are those of the first completion;
    `completions` holds all `n` of them."""

    prompt_token_ids: list[int]
    completions: list[Completion]
    usage: Usage

    @property
    def text(self) -> str:
        return self.completions[0].text

    @property
    def token_ids(self) -> list[int]:
        return self.completions[0].token_ids

    @property
    def finish_reason(self) -> str:
        return self.completions[0].finish_reason

    @property
    def logprobs(self) -> list[TokenLogprob] | None:
        return self.completions[0].logprobs


@dataclass
class StreamDelta:
    """A piece of streamed output: new text (and tokens) of completion `index`; `finish_reason` on its last delta."""

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None
    usage: Usage | None = None

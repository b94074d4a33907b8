"""What generation returns to callers."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agentkv.errors import IncompleteOutputError


@dataclass
class Usage:
    prompt_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens whose KV came from the radix cache
    completion_tokens: int = 0
    forward_passes: int = 0  # model forward passes this request took part in (prefill chunks and decodes)
    jump_forward_tokens: int = 0  # tokens appended without a forward pass (structured generation)
    draft_tokens: int = 0  # speculative decoding: draft tokens checked by the model
    accepted_draft_tokens: int = 0  # of those, kept (each a token made without a pass of its own)
    disk_cached_tokens: int = 0  # of cached_tokens, those read back from the disk tier (engine/disk/)
    closing_tokens: int = 0  # budget closing: tokens of the grammar's shortest completion that ended the output

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
    finish_reason: str  # "stop" | "length" | "abort" | "error" | "grammar_dead_end"
    logprobs: list[TokenLogprob] | None = None
    parser: Callable[[str], Any] | None = field(default=None, repr=False, compare=False)
    complete: bool = False  # a structured output that its grammar accepts as whole
    # engine.chat(tools=...): the calls the reply completed (one cut by max_tokens is left out) and the
    # text before them, with none of the tool-call format's markup
    tool_calls: list = field(default_factory=list)
    content: str | None = None
    reasoning: str | None = None  # engine.chat of a reasoning model: what it wrote in its block
    # budget closing ended the output (finish_reason "length"): its text is whole and matches the grammar,
    # but what the model had not yet written was filled with the grammar's shortest completion
    truncated: bool = False



    @property
    def parsed(self) -> Any:
        """With a schema: the validated object (a Pydantic instance for a model, a dict checked with
        jsonschema for a dict schema); with a regex or grammar: the text; otherwise None.
        Raises IncompleteOutputError when the output stopped before the grammar was complete."""
        if self.parser is None:
            return None
        if self.truncated:
            raise IncompleteOutputError(
                "max_tokens ran out, and budget closing ended the output with its grammar's shortest completion: "
                "the text parses, but its last values are fillers the model did not choose; raise max_tokens "
                "(the closed text is the error's partial text)", self.text, self.finish_reason)
        if not self.complete:
            raise IncompleteOutputError(
                f"the output ended before it was complete (finish_reason={self.finish_reason!r}); raise "
                "max_tokens, or remove stop strings that can occur inside it", self.text, self.finish_reason)
        return self.parser(self.text if self.content is None else self.content)


@dataclass(frozen=True)
class CacheMiss:
    """Where a prompt parted from a longer path the radix cache held: its first uncached token's index,
    what the cache held there and what the prompt has (up to 16 tokens each). A prompt that matched
    all it could, or met the end of what the cache held, has none."""

    token: int
    cached: list[int]
    sent: list[int]


@dataclass
class RequestOutput:
    """One prompt's result. `text`, `token_ids` and `finish_reason` are those of the first completion;
    `completions` holds all `n` of them."""

    prompt_token_ids: list[int]
    completions: list[Completion]
    usage: Usage
    cache_miss: CacheMiss | None = None  # why the prompt's cached part stopped short, where it did

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
    def tool_calls(self) -> list:
        return self.completions[0].tool_calls

    @property
    def content(self) -> str:
        """The reply's text without tool-call markup (the text itself where no tools were offered)."""
        c = self.completions[0]
        return c.text if c.content is None else c.content

    @property
    def logprobs(self) -> list[TokenLogprob] | None:
        return self.completions[0].logprobs

    @property
    def parsed(self) -> Any:
        """The first completion's validated object (see Completion.parsed)."""
        return self.completions[0].parsed


@dataclass
class StreamDelta:
    """A piece of streamed output: new text (and tokens) of completion `index`; its last delta has
    `finish_reason`, `usage` and the whole `completion` (whose `.parsed` validates a structured output)."""

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None
    usage: Usage | None = None
    completion: Completion | None = None
    cache_miss: CacheMiss | None = None  # (the last delta) as RequestOutput.cache_miss

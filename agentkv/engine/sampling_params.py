"""What a caller asks of one generation: how to sample, when to stop, what to return."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

from agentkv.errors import RequestError
from agentkv.grammar.composed import ComposedGrammar
from agentkv.grammar.schema.numbers import NUMBER_DIGITS
from agentkv.grammar.schema.style import JSON_STYLES


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int | None = 128  # None: until EOS or the context is full
    temperature: float = 1.0  # 0 is greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 disables
    min_p: float = 0.0
    seed: int | None = None  # same seed, same output, whatever else is in the batch
    repetition_penalty: float = 1.0  # >1 discourages tokens already in prompt or output (CTRL-style)
    frequency_penalty: float = 0.0  # OpenAI semantics: minus penalty * count of the token in the output
    presence_penalty: float = 0.0  # minus penalty once a token has appeared in the output
    # added to a token's logit before sampling, as OpenAI's logit_bias ({token id: bias in [-100, 100]});
    # held as sorted (id, bias) pairs so the params stay hashable
    logit_bias: tuple[tuple[int, float], ...] = ()
    stop: tuple[str, ...] = ()  # stop strings; the matched text is not returned
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: bool = False
    top_logprobs: int = 0  # alternatives per position, with logprobs=True
    n: int = 1  # completions per prompt; they share the prompt's KV
    skip_special_tokens: bool = True
    # Structured output: at most one of these. The output then always matches it (see docs/structured.md).
    json_schema: Any = field(default=None, hash=False)  # a dict, JSON text, a Pydantic model or a Python type
    regex: str | None = None  # the whole output matches this pattern
    grammar: str | ComposedGrammar | None = None  # a Lark grammar (llguidance dialect)
    jump_forward: bool = True  # append the tokens a grammar forces without a forward pass
    # A dict schema's objects take no keys beyond those declared where it leaves additionalProperties
    # unset (as xgrammar's strict mode; a small model otherwise invents keys). False: as the spec says.
    close_objects: bool = True
    # Every keyword of the grammar's schemas enforced exactly, or a GrammarError (naming the keyword and
    # its JSON pointer) before anything is generated. False: a keyword the grammar cannot enforce is
    # dropped from it and the finished output validated against the whole schema.
    strict: bool = False
    # Numbers in a JSON grammar have at most this many integer, fraction and exponent digits where the
    # schema leaves them unbounded (llama.cpp's bound: a model cannot run a number on until max_tokens);
    # a bound the schema gives is kept whole. None, or strict: exact to the spec, unbounded.
    number_digits: int | None = NUMBER_DIGITS
    # The separators JSON is written with (grammar/schema/style.py): "compact" (`{"a":1,"b":2}`), "spaced"
    # (`{"a": 1, "b": 2}`, json.dumps's), or "model": the model picks one at the first separator and holds
    # it. None: for tool calls, the style the model's chat template writes them in (where it writes them),
    # else "model".
    json_style: str | None = None
    # Budget closing: a structured output always closes within max_tokens. Where the shortest completion
    # of the output (in the tokenizer's tokens) would no longer fit what is left, the output is closed
    # with it instead (strings closed, required keys given their shortest values, brackets closed):
    # finish_reason "length", `truncated` set. A grammar whose shortest output does not fit max_tokens
    # is a RequestError before anything is generated. False: cut at max_tokens as it stands.
    budget_closing: bool = True
    # a reasoning model's block (<think>...</think>) is closed after this many output tokens, and the
    # answer follows (agentkv/chat/reasoning.py); None: it reasons as long as it likes within max_tokens
    max_reasoning_tokens: int | None = None
    # the LoRA adapter the request runs with: a name the engine loaded (Engine(lora=...), load_lora); None:
    # the base model. Its KV is cached apart from every other adapter's (keyed by the adapter's content)
    adapter: str | None = None
    extra: dict = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        # accept a single stop string and lists for convenience
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        elif self.stop is None:
            object.__setattr__(self, "stop", ())
        else:
            object.__setattr__(self, "stop", tuple(self.stop))
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids or ()))
        bias = self.logit_bias.items() if isinstance(self.logit_bias, dict) else self.logit_bias or ()
        try:
            object.__setattr__(self, "logit_bias", tuple(sorted((t, b) for t, b in bias)))
        except (TypeError, ValueError):
            raise RequestError(f"SamplingParams.logit_bias={self.logit_bias!r} is invalid: give "
                               "{token id: bias}") from None
        self.validate()

    def validate(self) -> None:
        def bad(name: str, why: str) -> RequestError:
            return RequestError(f"SamplingParams.{name}={getattr(self, name)!r} is invalid: {why}")

        if self.max_tokens is not None and (not isinstance(self.max_tokens, int) or self.max_tokens < 1):
            raise bad("max_tokens", "it must be a positive integer or None")
        if not self.temperature >= 0:
            raise bad("temperature", "it must be >= 0 (0 is greedy)")
        if not 0 < self.top_p <= 1:
            raise bad("top_p", "it must be in (0, 1]")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise bad("top_k", "it must be an integer >= 0 (0 disables it)")
        if not 0 <= self.min_p <= 1:
            raise bad("min_p", "it must be in [0, 1]")
        if not self.repetition_penalty > 0:
            raise bad("repetition_penalty", "it must be > 0 (1 disables it)")
        for name in ("frequency_penalty", "presence_penalty"):
            if not -2 <= getattr(self, name) <= 2:
                raise bad(name, "it must be in [-2, 2]")
        for t, b in self.logit_bias:
            if not isinstance(t, int) or isinstance(t, bool) or t < 0 or not isinstance(b, (int, float)) \
                    or isinstance(b, bool) or not -100 <= b <= 100:
                raise bad("logit_bias", "it maps token ids (integers >= 0) to biases in [-100, 100]")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise bad("stop", "stop strings must be non-empty strings")
        if not isinstance(self.top_logprobs, int) or not 0 <= self.top_logprobs <= 20:
            raise bad("top_logprobs", "it must be an integer in [0, 20]")
        if not isinstance(self.n, int) or not 1 <= self.n <= 64:
            raise bad("n", "it must be an integer in [1, 64]")
        if self.max_reasoning_tokens is not None and (not isinstance(self.max_reasoning_tokens, int)
                                                      or self.max_reasoning_tokens < 1):
            raise bad("max_reasoning_tokens", "it must be a positive integer or None")
        if self.number_digits is not None and (isinstance(self.number_digits, bool)
                                               or not isinstance(self.number_digits, int) or self.number_digits < 1):
            raise bad("number_digits", "it must be a positive integer or None (unbounded)")
        if self.json_style is not None and self.json_style not in JSON_STYLES:
            raise bad("json_style", f"choose one of {list(JSON_STYLES)}, or None (the model's template, else its "
                                    "choice)")
        if self.adapter is not None and (not isinstance(self.adapter, str) or not self.adapter):
            raise bad("adapter", "it must be a loaded LoRA adapter's name, or None for the base model")
        if self.seed is not None and not isinstance(self.seed, int):
            raise bad("seed", "it must be an integer or None")
        if sum(x is not None for x in (self.json_schema, self.regex, self.grammar)) > 1:
            raise RequestError("give at most one of SamplingParams.json_schema, regex and grammar")
        if self.regex is not None and not isinstance(self.regex, str):
            raise bad("regex", "it must be a string")
        if self.grammar is not None and not isinstance(self.grammar, (str, ComposedGrammar)):
            raise bad("grammar", "it must be Lark grammar text (or a ComposedGrammar)")

    @property
    def structured(self) -> bool:
        """True when the output is constrained by a schema, regex or grammar."""
        return self.json_schema is not None or self.regex is not None or self.grammar is not None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def with_(self, **changes) -> SamplingParams:
        unknown = set(changes) - {f.name for f in fields(self)}
        if unknown:
            raise RequestError(
                f"unknown sampling parameter(s) {sorted(unknown)}; known: {[f.name for f in fields(self)]}")
        return replace(self, **changes)

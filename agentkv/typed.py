"""Typed generation: `ak.generate` returns a validated object, `ak.stream` its partial objects.

    obj = ak.generate(messages, schema=Invoice)        # an Invoice instance, validated
    ak.generate(messages, schema=list[int] | None)     # any type Pydantic validates
    obj = await ak.agenerate(messages, schema=Invoice) # the same, from async code
    ak.generate(prompt, regex=r"\\d{3}-\\d{4}")           # a string matching the pattern
    ak.generate(prompt, choices=["yes", "no"])         # the option the model finds most likely
    for partial in ak.stream(messages, schema=Invoice): ...

A list of message dicts is rendered with the model's chat template; a string is used as raw prompt
text. Without `engine=`, a default engine (the embedded model on CPU) is created on first use.
Temperature and max_tokens default as the whole library does (agentkv/defaults.py).
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

from agentkv.chat.messages import is_messages
from agentkv.defaults import LIBRARY_MAX_TOKENS, LIBRARY_TEMPERATURE
from agentkv.engine import SamplingParams
from agentkv.errors import OutputValidationError, RequestError
from agentkv.syncio import iterate_sync

_default_engine = None
_default_lock = threading.Lock()


def default_engine():
    """The engine used when a call names none: `ak.Engine()` (the embedded model), made once."""
    global _default_engine
    with _default_lock:
        if _default_engine is None:
            from agentkv.engine import Engine  # here: the engine's module loads torch, `import agentkv` must not

            _default_engine = Engine()
        return _default_engine


RESAMPLES = 2  # an output failing a keyword its grammar relaxed is generated again at most this many times


def set_default_engine(engine) -> None:
    """Use `engine` wherever a call names none (e.g. one loaded with a bigger model)."""
    global _default_engine
    with _default_lock:
        _default_engine = engine


def generate(prompt: str | Sequence[dict], schema: Any = None, *, regex: str | None = None,
             choices: Sequence[str] | None = None, grammar: str | None = None, engine=None, **sampling: Any) -> Any:
    """One typed generation: a validated Pydantic instance for a model class (a value of the type
    for `list[int]`, `A | B`, ...), a dict (checked with jsonschema) for a dict schema, the text for
    a regex or grammar, the chosen option for `choices`, and plain text when none is given. Raises
    GrammarError for a schema that does not compile (with `strict=True`, also for one with a keyword
    the grammar cannot enforce exactly) and IncompleteOutputError (carrying the partial text) when
    max_tokens cut the output. Sampled (temperature > 0), an output that fails a keyword its grammar
    relaxed is generated again, at most RESAMPLES times, before OutputValidationError."""
    engine = engine or default_engine()
    if choices is not None:
        _choices_alone(schema, regex, grammar, sampling)
        return choose(engine, prompt, choices)
    params = _params(schema, regex, grammar, sampling)
    for attempt in range(RESAMPLES + 1):
        out = engine.chat(prompt, params) if is_messages(prompt) else engine.generate(prompt, params)
        try:
            return out.parsed if params.structured else out.text
        except OutputValidationError as e:
            params = _resample(params, e, attempt)


async def agenerate(prompt: str | Sequence[dict], schema: Any = None, *, regex: str | None = None,
                    choices: Sequence[str] | None = None, grammar: str | None = None, engine=None,
                    **sampling: Any) -> Any:
    """`generate` from async code: the engine batches concurrent calls."""
    import asyncio

    engine = engine or default_engine()
    if choices is not None:
        _choices_alone(schema, regex, grammar, sampling)
        return await asyncio.to_thread(choose, engine, prompt, choices)
    params = _params(schema, regex, grammar, sampling)
    for attempt in range(RESAMPLES + 1):
        out = await engine.agenerate(prompt, params)  # renders a list of messages
        try:
            return out.parsed if params.structured else out.text
        except OutputValidationError as e:
            params = _resample(params, e, attempt)


def _choices_alone(schema, regex, grammar, sampling: dict) -> None:
    if schema is not None or regex is not None or grammar is not None:
        raise RequestError("give `choices` alone, not with schema, regex or grammar")
    if sampling:  # scoring reads the model's logprobs of each option: no sampling option applies
        raise RequestError(f"`choices` picks the option the model finds most likely; {sorted(sampling)} "
                           "do not apply to it: remove them")


def stream(prompt: str | Sequence[dict], schema: Any = None, *, regex: str | None = None, grammar: str | None = None,
           engine=None, **sampling: Any) -> Iterator[Any]:
    """Like `generate`, yielding as the output grows: with a schema, partial objects holding only the
    top-level fields whose values are complete (then the validated whole); otherwise the text so far.
    Call from synchronous code; in async code use `astream`."""
    yield from iterate_sync(astream(prompt, schema, regex=regex, grammar=grammar, engine=engine, **sampling))


async def astream(prompt: str | Sequence[dict], schema: Any = None, *, regex: str | None = None,
                  grammar: str | None = None, engine=None, **sampling: Any) -> AsyncIterator[Any]:
    """The async form of `stream`."""
    engine = engine or default_engine()
    params = _params(schema, regex, grammar, sampling)
    text, last, done = "", None, None
    async for delta in engine.stream(prompt, params):  # renders a list of messages
        text += delta.text
        if delta.finish_reason is not None:
            done = delta
            break
        if params.json_schema is None:
            if delta.text:
                yield text
            continue
        fields = complete_fields(text)
        if fields and fields != last:
            last = fields
            yield _partial(params.json_schema, fields)
    if done is None:
        return
    if not params.structured:  # free text: its last piece
        if done.text:
            yield text
        return
    yield done.completion.parsed  # the whole output, validated (IncompleteOutputError when it was cut)


# ---- helpers ----------------------------------------------------------------------------------------


def _resample(params, error: OutputValidationError, attempt: int):
    """The parameters to generate again with after an output failed a keyword its grammar relaxed
    (as the server does: `strict=True` refuses such a schema up front instead); the error again
    where resampling cannot help: a validator of a model's own, greedy decoding (the same output),
    or the resamples spent."""
    if error.keyword is None or params.temperature == 0 or attempt == RESAMPLES:
        raise error
    return params.with_(seed=params.seed + 1) if params.seed is not None else params


def _params(schema, regex, grammar, sampling: dict):
    base = sampling.pop("params", None)
    if base is None:
        base = SamplingParams(temperature=LIBRARY_TEMPERATURE, max_tokens=LIBRARY_MAX_TOKENS)
    elif "max_tokens" not in sampling and base.max_tokens == SamplingParams().max_tokens:
        sampling["max_tokens"] = LIBRARY_MAX_TOKENS  # typed outputs end when their grammar does
    given = {"json_schema": schema, "regex": regex, "grammar": grammar}
    return base.with_(**{k: v for k, v in given.items() if v is not None}, **sampling)


def choose(engine, prompt, choices: Sequence[str]) -> str:
    """The option with the highest mean token logprob (SGLang's token-length-normalised select);
    every option is one prefill after the prompt, all sharing its KV."""
    choices = list(choices)
    if not choices or not all(isinstance(c, str) and c for c in choices):
        raise RequestError("`choices` must be a non-empty list of non-empty strings")
    scores = engine.score(prompt, choices)  # renders a list of messages
    means = [sum(s) / len(s) if s else -math.inf for s in scores]
    return choices[max(range(len(choices)), key=means.__getitem__)]


def complete_fields(text: str) -> dict[str, Any]:
    """The members of the JSON object that `text` begins, whose values are already complete.

    A number counts as complete only once something follows it (more digits could still come).
    """
    decoder = json.JSONDecoder()
    out: dict[str, Any] = {}
    i = _skip_ws(text, 0)
    if not text.startswith("{", i):
        return out
    i += 1
    while True:
        i = _skip_ws(text, i)
        if not text.startswith('"', i):
            return out
        try:
            key, i = decoder.raw_decode(text, i)
            i = _skip_ws(text, i)
            if not text.startswith(":", i):
                return out
            value, end = decoder.raw_decode(text, _skip_ws(text, i + 1))
        except json.JSONDecodeError:
            return out
        if isinstance(value, (int, float)) and not isinstance(value, bool) and _skip_ws(text, end) == len(text):
            return out
        out[key] = value
        i = _skip_ws(text, end)
        if not text.startswith(",", i):
            return out
        i += 1


def _skip_ws(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t\n\r":
        i += 1
    return i


def _partial(schema: Any, fields: dict[str, Any]) -> Any:
    """A Pydantic model instance holding just `fields` (each validated as its field's type), or the dict."""
    model_fields = getattr(schema, "model_fields", None)
    if model_fields is None:
        return dict(fields)
    from pydantic import TypeAdapter

    values = {}
    for name, info in model_fields.items():
        key = info.alias or name
        if key in fields:
            try:
                values[name] = TypeAdapter(info.annotation).validate_python(fields[key])
            except ValueError:  # a validator beyond the schema refused it: the final object will say so
                continue
    return schema.model_construct(_fields_set=set(values), **values)

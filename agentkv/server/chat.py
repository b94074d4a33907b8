"""/v1/chat/completions over one engine: responses and SSE streams (and the helpers
/v1/completions and /v1/responses share: prompt tokens, usage, SSE)."""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from agentkv.chat.calls import CallProgress
from agentkv.chat.carry import TokenCarry
from agentkv.chat.miss import describe
from agentkv.chat.reasoning import reply_grammar
from agentkv.chat.turn import Turn
from agentkv.engine import SamplingParams
from agentkv.engine.outputs import Usage
from agentkv.errors import GrammarError, OutputValidationError, PromptTooLongError, RequestError
from agentkv.grammar.schema.validation import schema_check
from agentkv.server.history import chat_reply_back, warm_next_turn
from agentkv.server.protocol import (
    APIError,
    ChatRequest,
    bad_request,
    call_id,
    chat_tools,
    check_max_tokens,
    finish_reason,
    invalid_output,
    logprobs_json,
    response_schema,
    structural_tag,
    template_kwargs,
    template_messages,
    tool_calls_json,
    wants_strict,
)
from agentkv.server.sessions import Sessions, marked_prefix


class ChatPlan:
    """One chat request made ready to run: its prompt, parameters, and how to read its outputs."""

    def __init__(self, engine, req: ChatRequest, carry: TokenCarry | None = None):
        self.engine, self.req, self.carry = engine, req, carry
        specs, defs, mode = chat_tools(req)
        schema = response_schema(req)
        output = None if schema is None else ({} if schema is True else schema)
        turn = Turn(engine.tool_format, tuple(specs), tuple(defs), mode if specs else "none", output,
                    req.parallel_tool_calls, reasoning=engine.reasoning)
        self.fmt = turn.fmt  # the engine's format, bound to the offered tools
        self.bare_messages = template_messages(req, self.fmt)  # (without the tool definitions a format adds)
        self.messages = turn.messages(self.bare_messages)
        self.template_tools = turn.template_tools
        self.prompt = _render(engine, self.messages, self.template_tools, req)
        # a reasoning model thinks first, free of the grammar, unless the prompt turned reasoning off
        self.turn = turn.after(self.prompt)
        self.reasoning = engine.reasoning
        sampling = req.sampling(None)
        if req.max_completion_tokens is not None:
            sampling["max_tokens"] = req.max_completion_tokens
        sampling["logprobs"] = req.logprobs
        sampling["strict"] = wants_strict(req)
        if req.max_reasoning_tokens is not None:
            sampling["max_reasoning_tokens"] = req.max_reasoning_tokens
        if req.top_logprobs is not None:
            if not req.logprobs:
                raise APIError(400, "top_logprobs needs logprobs: true", "top_logprobs")
            sampling["top_logprobs"] = req.top_logprobs
        sampling["json_style"] = self.turn.json_style(req.json_style)  # (the template's style, else the model's)
        self.calls_possible = self.turn.calls_possible
        self.output_schema = self.turn.output_schema
        self.tag = structural_tag(req)
        if self.tag is not None:  # free text, each tag exactly (after any reasoning)
            if "regex" in sampling or "grammar" in sampling:
                raise APIError(400, "regex / grammar cannot be combined with response_format", "response_format")
            sampling["grammar"] = reply_grammar(self.tag.grammar(), self.reasoning, self.turn.state)
        elif specs or (schema is not None and self.turn.state != "off"):
            if "regex" in sampling or "grammar" in sampling:
                what = "tools" if specs else "response_format"
                raise APIError(400, f"regex / grammar cannot be combined with {what}", what)
            grammar = self.turn.grammar(req.close_objects, sampling["json_style"])
            if grammar is not None:
                sampling["grammar"] = grammar
        elif schema is not None:
            if "regex" in sampling or "grammar" in sampling:
                raise APIError(400, "regex / grammar cannot be combined with response_format", "response_format")
            sampling["json_schema"] = schema
            sampling["close_objects"] = req.close_objects
        try:
            self.params = SamplingParams(**sampling)
        except RequestError as e:
            raise bad_request(e) from None

    def prompt_ids(self) -> list[int]:
        """The prompt's tokens (what the engine is given: a continued conversation's carried tokens,
        then the new text's), its max_tokens checked against the context (a prompt over the context
        itself is the engine's 413)."""
        ids = self.carry.encode(self.prompt) if self.carry is not None else self.prompt
        param = "max_completion_tokens" if self.req.max_completion_tokens is not None else "max_tokens"
        self.ids = _prompt_tokens(self.engine, ids, self.params.max_tokens, param)
        return self.ids

    def cache_miss(self, miss) -> dict | None:
        """Where the prompt parted from a longer cached path, named (chat/miss.py); None where it
        did not."""
        if miss is None:
            return None
        tok = self.engine.tokenizer
        return describe(miss, self.ids, lambda ids: tok.decode(ids, skip_special_tokens=False), self.messages,
                        self.bare_messages, self.template_tools, self.engine.render, self.reasoning,
                        **template_kwargs(self.req))

    def message(self, completion, call_prefix: str) -> tuple[dict, str]:
        """(the response message, its finish_reason) of one completion: the calls it completed (a call
        cut by max_tokens dropped), the text before them with none of the format's markup, each
        call's arguments and a finished JSON output checked against their whole schemas (what the
        grammar relaxed; an output that fails is a 422 carrying it and the keyword: `generate_checked`
        resamples first)."""
        try:
            reply = self.turn.read_text(completion.text, cut=completion.finish_reason == "length")
            text, calls = reply.content, reply.calls
            if self.tag is not None:
                self.tag.check(text, completion.finish_reason)
            if not calls and completion.complete and self.output_schema is not None:
                try:
                    value = json.loads(text)
                except json.JSONDecodeError:
                    pass  # free text beside the output (tool_choice auto): not JSON, nothing to check
                else:
                    failure = schema_check(self.output_schema).failure(value)
                    if failure is not None:
                        raise OutputValidationError(f"the output does not validate against its schema: "
                                                    f"{failure.message}", completion.text, completion.finish_reason,
                                                    failure.keyword, failure.pointer)
        except OutputValidationError as e:
            raise invalid_output(e) from None
        shown = tool_calls_json(calls, call_prefix) + self.cut_call(completion, reply.answer, call_prefix, len(calls))
        msg: dict[str, Any] = {"role": "assistant", "content": (text or None) if shown else text}
        if reply.reasoning is not None:
            msg["reasoning_content"] = reply.reasoning
        if shown:
            msg["tool_calls"] = shown
        return msg, finish_reason(completion.finish_reason, bool(shown))

    def cut_call(self, completion, answer: str, call_prefix: str, k: int) -> list[dict]:
        """The call max_tokens cut (budget closing off), as OpenAI returns one: its arguments as far as
        they were written, under finish_reason "length"; none where no call was cut after its name."""
        if completion.finish_reason != "length" or completion.truncated or not self.calls_possible:
            return []
        progress = self.fmt.progress(answer)
        if len(progress) <= k or progress[-1].done or not progress[-1].name:
            return []
        p = progress[-1]
        return [{"id": p.id or call_id(call_prefix, k), "type": "function",
                 "function": {"name": p.name, "arguments": p.arguments_text}}]

    def split(self, text: str, final: bool = True) -> tuple[str | None, str]:
        """(the reasoning, the answer) of a reply (still being written, unless `final`)."""
        return self.turn.split(text, final)


async def hint(sessions: Sessions | None, plan: ChatPlan) -> None:
    """The request's cache_control hint, pinned before it runs (sessions.py)."""
    if sessions is not None:
        await sessions.hinted(plan.messages, plan.template_tools, marked_prefix(plan.req.messages, plan.req.tools),
                              plan.params.adapter)


async def generate_checked(engine, plan: ChatPlan, ids: list[int], prefix: Callable[[int], str], resamples: int):
    """(the output, each completion's (message, finish_reason), how many times it was resampled): an
    output that fails a keyword its grammar relaxed is generated again, up to `resamples` times, its
    usage counted; after that the 422 stands. (A stream cannot take back what it sent: it ends with
    the 422 as its last event instead.) `prefix(i)`: the call ids' prefix of completion i."""
    usage, params, miss = None, plan.params, None
    for attempt in range(resamples + 1):
        out = await _run(engine.agenerate(ids, params))
        usage = out.usage if usage is None else usage + out.usage
        miss = out.cache_miss if attempt == 0 else miss  # (a resample meets its own first try in the cache)
        try:
            read = [plan.message(c, prefix(i)) for i, c in enumerate(out.completions)]
        except APIError as e:
            if e.code != "invalid_model_output" or attempt == resamples:
                raise
            if params.seed is not None:  # a seeded request would write the same output again
                params = params.with_(seed=params.seed + 1)
            continue
        return dataclasses.replace(out, usage=usage, cache_miss=miss), read, attempt
    raise AssertionError("unreachable")  # pragma: no cover


async def chat_completion(engine, req: ChatRequest, model: str, resamples: int = 0,
                          sessions: Sessions | None = None, replies: TokenCarry | None = None) -> dict:
    """`replies`: the server's carry of its replies' tokens (a transcript sent back meets them)."""
    plan = ChatPlan(engine, req, replies)
    rid = _id("chatcmpl")
    await hint(sessions, plan)
    out, read, resampled = await generate_checked(engine, plan, plan.prompt_ids(), lambda i: f"{rid[-8:]}_{i}",
                                                  resamples)
    for c in out.completions if replies is not None else ():
        replies.written(plan.prompt, plan.ids, c)
    start = warm_next_turn(plan, chat_reply_back(read[0][0]), out.completions[0], replies)
    if sessions is not None:
        await sessions.keep(req.prompt_cache_key, start or plan.ids + out.completions[0].token_ids,
                            plan.params.adapter)
    choices = [{"index": i, "message": msg, "logprobs": logprobs_json(c.logprobs), "finish_reason": reason,
                **truncated(c)} for i, (c, (msg, reason)) in enumerate(zip(out.completions, read))]
    return {"id": rid, "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": choices, "usage": _usage(out.usage, resampled, plan.cache_miss(out.cache_miss))}


async def chat_stream(engine, req: ChatRequest, model: str, metrics, started: float, done,
                      sessions: Sessions | None = None, replies: TokenCarry | None = None) -> AsyncIterator[str]:
    """Server-sent events; the first is computed before this returns, so a request that cannot run
    fails with its HTTP status instead of inside a 200 stream. `done()` runs when the stream ends,
    however it ends (a client that goes away included)."""
    plan = ChatPlan(engine, req, replies)
    rid, created = _id("chatcmpl"), int(time.time())
    await hint(sessions, plan)
    deltas = engine.stream(plan.prompt_ids(), plan.params)
    first = await _run(deltas.__anext__())

    def chunk(index: int, delta: dict, reason: str | None = None, logprobs=None, extra: dict | None = None) -> str:
        body = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
                "choices": [{"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": reason,
                             **(extra or {})}]}
        return _sse(body)

    async def events() -> AsyncIterator[str]:
        completed: list[bool] = []
        try:
            async for event in stream_events(completed):
                yield event
        finally:
            if not completed:  # the client went away (499, as nginx logs it)
                metrics.request_done("/v1/chat/completions", 499, time.perf_counter() - started)
            done()

    async def stream_events(completed: list[bool]) -> AsyncIterator[str]:
        texts: dict[int, str] = {}
        sent: dict[int, int] = {}
        thought_sent: dict[int, int] = {}
        streamed: dict[int, list[int]] = {}  # per choice, how much of each call's arguments went out
        usage = None
        last = time.perf_counter()
        metrics.first_token(last - started)
        for i in range(plan.params.n):
            yield chunk(i, {"role": "assistant", "content": ""})
        async for d in chain(first, deltas):
            now = time.perf_counter()
            if d is not first:
                metrics.between_tokens(now - last, len(d.token_ids))
            last = now
            texts[d.index] = texts.get(d.index, "") + d.text
            thought, full = plan.split(texts[d.index], final=False)
            if thought and len(thought) > thought_sent.get(d.index, 0):  # reasoning streams on its own field
                yield chunk(d.index, {"reasoning_content": thought[thought_sent.get(d.index, 0):]})
                thought_sent[d.index] = len(thought)
            # with tools, text stops where the calls start (and holds back what may begin them)
            safe = plan.fmt.content(full) if plan.calls_possible else plan.fmt.text(full, final=False)
            start = sent.get(d.index, 0)
            if len(safe) > start:
                yield chunk(d.index, {"content": safe[start:]})
                sent[d.index] = len(safe)
            if plan.calls_possible and d.finish_reason is None:
                # each call's name as soon as it is written, then its arguments as they grow
                for delta in call_deltas(plan.fmt.progress(full), streamed.setdefault(d.index, []),
                                         f"{rid[-8:]}_{d.index}"):
                    yield chunk(d.index, {"tool_calls": [delta]})
            if d.finish_reason is not None:
                try:
                    msg, reason = plan.message(d.completion, f"{rid[-8:]}_{d.index}")
                except APIError as e:  # the output failed its check: the stream ends with the error
                    yield _sse(e.body())
                    metrics.request_done("/v1/chat/completions", e.status, time.perf_counter() - started)
                    completed.append(True)
                    return
                calls = msg.get("tool_calls")
                # text held back while it might have begun a call or a marker, and was none
                went = {"reasoning_content": (thought or "")[:thought_sent.get(d.index, 0)],
                        "content": safe[:sent.get(d.index, 0)]}
                for field, out in went.items():
                    final = msg.get(field) or ""
                    if len(final) > len(out) and final.startswith(out) and not (field == "content" and calls):
                        yield chunk(d.index, {field: final[len(out):]})
                if calls:  # what the stream has not sent of them yet
                    done = [CallProgress(c["function"]["name"], c["function"]["arguments"], True, c["id"])
                            for c in calls]
                    for delta in call_deltas(done, streamed.setdefault(d.index, []), f"{rid[-8:]}_{d.index}"):
                        yield chunk(d.index, {"tool_calls": [delta]})
                # a streamed choice's logprobs come whole, with its finish_reason
                yield chunk(d.index, {}, reason, logprobs_json(d.completion.logprobs), truncated(d.completion))
                usage = d.usage if usage is None else _add(usage, d.usage, same_prompt=True)
                if replies is not None:
                    replies.written(plan.prompt, plan.ids, d.completion)
                if d.index == 0:
                    start = warm_next_turn(plan, chat_reply_back(msg), d.completion, replies)
                    if sessions is not None:
                        await sessions.keep(req.prompt_cache_key, start or plan.ids + d.completion.token_ids,
                                            plan.params.adapter)
        if req.include_usage and usage is not None:
            yield _sse({"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
                        "choices": [], "usage": _usage(usage)})
        yield "data: [DONE]\n\n"
        metrics.request_done("/v1/chat/completions", 200, time.perf_counter() - started,
                             _usage(usage) if usage is not None else None)
        completed.append(True)

    return events()


def _prompt_tokens(engine, prompt, max_tokens: int | None, param: str = "max_tokens") -> list[int]:
    """A prompt's tokens (text or ids), `max_tokens` checked against the context it leaves (a prompt
    over the context itself is the engine's 413)."""
    ids = engine.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
    if len(ids) < engine.context_length:
        check_max_tokens(max_tokens, len(ids), engine.context_length, param)
    return ids


# ---- helpers -------------------------------------------------------------------------------------------


async def _run(awaitable):
    """Await an engine call; its RequestErrors become 400s (413 for a prompt over the context)."""
    try:
        return await awaitable
    except PromptTooLongError as e:
        raise APIError(413, str(e), "messages", code="context_length_exceeded") from None
    except GrammarError as e:
        raise APIError(400, str(e), "response_format") from None
    except RequestError as e:
        raise bad_request(e) from None


async def chain(first, rest):
    """`first`, then every item of the async iterator `rest`."""
    yield first
    async for item in rest:
        yield item


def _render(engine, messages: list[dict], tools, req: ChatRequest) -> str:
    """The prompt; a template that fails on the request's chat_template_kwargs is a 400 naming them."""
    kwargs = template_kwargs(req)
    try:
        return engine.render(messages, tools=tools, **kwargs)
    except RequestError as e:
        raise bad_request(e) from None
    except Exception as e:  # noqa: BLE001 - the template's own error, caused by the variables given
        if not kwargs:
            raise
        raise APIError(400, f"the chat template failed with these chat_template_kwargs: {type(e).__name__}: {e}",
                       "chat_template_kwargs") from None


def call_deltas(progress: list[CallProgress], streamed: list[int], prefix: str) -> list[dict]:
    """OpenAI's tool-call stream deltas for calls written this far: a call's id and name first, then
    its arguments' new text. `streamed` (per call, how much of its arguments went out) is updated."""
    out = []
    for k, p in enumerate(progress):
        if k == len(streamed):
            out.append({"index": k, "id": p.id or call_id(prefix, k), "type": "function",
                        "function": {"name": p.name, "arguments": ""}})
            streamed.append(0)
        if len(p.arguments_text) > streamed[k]:  # the text only grows: the grammar wrote it
            out.append({"index": k, "function": {"arguments": p.arguments_text[streamed[k]:]}})
            streamed[k] = len(p.arguments_text)
    return out


def truncated(completion) -> dict:
    """A choice's `truncated: true` where budget closing ended its output (finish_reason "length", the
    output whole and valid, its last values the grammar's shortest): nothing where it did not."""
    return {"truncated": True} if completion.truncated else {}


def _usage(u, resampled: int = 0, cache_miss: dict | None = None) -> dict:
    out = {"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
           "total_tokens": u.prompt_tokens + u.completion_tokens,
           "prompt_tokens_details": {"cached_tokens": u.cached_tokens,
                                     # of those, read back from the engine's disk tier (kv_dir)
                                     "disk_cached_tokens": u.disk_cached_tokens}}
    if cache_miss is not None:  # where the prompt parted from a longer cached path, and why
        out["prompt_tokens_details"]["cache_miss"] = cache_miss
    if resampled:  # outputs generated again after failing a relaxed keyword (their tokens counted above)
        out["resampled"] = resampled
    if u.draft_tokens:  # speculative decoding: OpenAI's fields for predicted tokens kept and not
        out["completion_tokens_details"] = {"accepted_prediction_tokens": u.accepted_draft_tokens,
                                            "rejected_prediction_tokens": u.draft_tokens - u.accepted_draft_tokens}
    if u.closing_tokens:  # budget closing: the grammar's shortest completion ended an output max_tokens cut
        out.setdefault("completion_tokens_details", {})["closing_tokens"] = u.closing_tokens
    return out


def _add(a, b, same_prompt: bool):
    """Usage of two outputs: completions of one prompt count the prompt once."""
    if not same_prompt:
        return a + b
    return Usage(a.prompt_tokens, a.cached_tokens, a.completion_tokens + b.completion_tokens,
                 max(a.forward_passes, b.forward_passes), a.jump_forward_tokens + b.jump_forward_tokens,
                 a.draft_tokens + b.draft_tokens, a.accepted_draft_tokens + b.accepted_draft_tokens,
                 a.disk_cached_tokens, a.closing_tokens + b.closing_tokens)


def _sse(body: dict) -> str:
    return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"


def _id(kind: str) -> str:
    return f"{kind}-{uuid.uuid4().hex[:24]}"

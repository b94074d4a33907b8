"""/v1/completions: plain prompts (text, token ids, or a list of them), echo, logprobs, streams;
the helpers it shares with chat (prompt tokens, usage, SSE) are chat.py's."""

from __future__ import annotations

import asyncio
import time

from agentkv.engine import SamplingParams
from agentkv.errors import RequestError
from agentkv.server.chat import _add, _id, _prompt_tokens, _run, _sse, _usage, chain
from agentkv.server.protocol import APIError, CompletionRequest, bad_request, finish_reason


def _completion_params(req: CompletionRequest):
    if req.suffix is not None:
        raise APIError(400, "suffix (fill-in-the-middle) is not supported", "suffix")
    sampling = req.sampling(16)  # OpenAI's default for this endpoint
    if req.logprobs is not None:
        sampling.update(logprobs=True, top_logprobs=req.logprobs)
    try:
        return SamplingParams(**sampling)
    except RequestError as e:
        raise bad_request(e) from None


async def completion(engine, req: CompletionRequest, model: str) -> dict:
    prompts, params = _prompts(req), _completion_params(req)
    ids = [_prompt_tokens(engine, p, params.max_tokens) for p in prompts]
    outs = await asyncio.gather(*(_run(engine.agenerate(p, params)) for p in ids))  # batched by the engine
    choices, usage = [], None
    for p, out in zip(prompts, outs):
        usage = out.usage if usage is None else _add(usage, out.usage, same_prompt=False)
        prefix = (p if isinstance(p, str) else engine.tokenizer.decode(p)) if req.echo else ""
        for c in out.completions:
            choices.append({"index": len(choices), "text": prefix + c.text, "logprobs": _legacy_logprobs(c.logprobs),
                            "finish_reason": finish_reason(c.finish_reason, False)})
    return {"id": _id("cmpl"), "object": "text_completion", "created": int(time.time()), "model": model,
            "choices": choices, "usage": _usage(usage)}


async def completion_stream(engine, req: CompletionRequest, model: str, metrics, started: float, done):
    """Server-sent events of one prompt's completions (echo first, logprobs with the last chunk)."""
    prompts, params = _prompts(req), _completion_params(req)
    if len(prompts) != 1:
        raise APIError(400, "a streamed completion takes one prompt; send the others as their own requests", "prompt")
    rid, created = _id("cmpl"), int(time.time())
    deltas = engine.stream(_prompt_tokens(engine, prompts[0], params.max_tokens), params)
    first = await _run(deltas.__anext__())
    metrics.first_token(time.perf_counter() - started)

    def chunk(index: int, text: str, reason: str | None = None, logprobs=None) -> str:
        return _sse({"id": rid, "object": "text_completion", "created": created, "model": model,
                     "choices": [{"index": index, "text": text, "logprobs": logprobs, "finish_reason": reason}]})

    async def events():
        usage, finished = None, False
        try:
            if req.echo:
                p = prompts[0]
                for i in range(params.n):
                    yield chunk(i, p if isinstance(p, str) else engine.tokenizer.decode(p))
            async for d in chain(first, deltas):
                if d.text:
                    yield chunk(d.index, d.text)
                if d.finish_reason is not None:
                    yield chunk(
                        d.index, "", finish_reason(d.finish_reason, False), _legacy_logprobs(d.completion.logprobs))
                    usage = d.usage if usage is None else _add(usage, d.usage, same_prompt=True)
            if req.include_usage and usage is not None:
                yield _sse({"id": rid, "object": "text_completion", "created": created, "model": model,
                            "choices": [], "usage": _usage(usage)})
            yield "data: [DONE]\n\n"
            finished = True
            metrics.request_done("/v1/completions", 200, time.perf_counter() - started, _usage(usage))
        finally:
            if not finished:
                metrics.request_done("/v1/completions", 499, time.perf_counter() - started)
            done()

    return events()


def _prompts(req: CompletionRequest) -> list:
    p = req.prompt
    if isinstance(p, str):
        return [p]
    if p and all(isinstance(t, int) for t in p):
        return [p]
    if not p:
        raise APIError(400, "prompt is empty", "prompt")
    return list(p)


def _legacy_logprobs(logprobs) -> dict | None:
    if logprobs is None:
        return None
    offsets, pos = [], 0
    for t in logprobs:
        offsets.append(pos)
        pos += len(t.token)
    return {"tokens": [t.token for t in logprobs], "token_logprobs": [t.logprob for t in logprobs],
            "top_logprobs": [{s: v for _, s, v in t.top} for t in logprobs], "text_offset": offsets}

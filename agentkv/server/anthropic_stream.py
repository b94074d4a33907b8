"""/v1/messages streamed: Anthropic's events (message_start, each content block's start, deltas and
stop, message_delta, message_stop) from the engine's deltas, the blocks written one at a time as
the reply grows: thinking, then text, then each call with its input's JSON as it is written.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

from agentkv.chat.carry import TokenCarry
from agentkv.server.anthropic import MessagesRequest, error_body, message_id, plan_of, sent_back, stop_of, usage
from agentkv.server.chat import ChatPlan, _run, chain
from agentkv.server.history import warm_next_turn
from agentkv.server.protocol import APIError, call_id


async def stream_message(engine, req: MessagesRequest, model: str, metrics, started: float, done,
                         close_objects: bool = True, replies: TokenCarry | None = None) -> AsyncIterator[str]:
    """Anthropic's events: message_start, each content block's start, deltas and stop (thinking,
    text, then the calls with their input's JSON as it grows), message_delta, message_stop."""
    plan = plan_of(engine, req, close_objects, replies)
    ids = plan.prompt_ids()
    deltas = engine.stream(ids, plan.params)
    first = await _run(deltas.__anext__())
    mid = message_id()
    metrics.first_token(time.perf_counter() - started)
    blocks_out = BlockStream(mid[-8:])

    async def events() -> AsyncIterator[str]:
        status = 499
        try:
            yield event("message_start", message={
                "id": mid, "type": "message", "role": "assistant", "model": model, "content": [],
                "stop_reason": None, "stop_sequence": None,
                "usage": {"input_tokens": len(ids), "output_tokens": 0}})
            yield event("ping")
            text, last = "", time.perf_counter()
            async for d in chain(first, deltas):
                now = time.perf_counter()
                if d is not first:
                    metrics.between_tokens(now - last, len(d.token_ids))
                last = now
                text += d.text
                thought, answer = plan.split(text, final=False)
                for e in blocks_out.grow(plan, thought or "", answer, final=False):
                    yield e
                if d.finish_reason is None:
                    continue
                try:
                    msg, reason = plan.message(d.completion, mid[-8:])
                except APIError as e:  # the output failed its check: the stream ends with the error
                    status = e.status
                    yield event("error", error=error_body(e)["error"])
                    return
                for e in blocks_out.finish(msg):
                    yield e
                if replies is not None:
                    replies.written(plan.prompt, ids, d.completion)
                warm_next_turn(plan, sent_back(msg, engine.reasoning), d.completion, replies)
                stop = stop_of(engine, req, d.completion, reason)
                yield event("message_delta", delta=stop, usage=usage(d.usage))
                yield event("message_stop")
                status = 200
                metrics.request_done("/v1/messages", 200, time.perf_counter() - started)
        finally:
            if status != 200:
                metrics.request_done("/v1/messages", status, time.perf_counter() - started)
            done()

    return events()


class BlockStream:
    """The content blocks of a reply as it is written, one open at a time: thinking, then text, then
    each call (its id and name at its start, its input's JSON text as it grows)."""

    def __init__(self, prefix: str):
        self.prefix = prefix  # of the calls' ids, as the final message names them
        self.index, self.kind = -1, None  # the open block
        self.sent = {"thinking": 0, "text": 0}
        self.calls: list[int] = []  # per call, how much of its arguments went out

    def grow(self, plan: ChatPlan, thought: str, answer: str, final: bool) -> list[str]:
        out = []
        if len(thought) > self.sent["thinking"] and self.kind in (None, "thinking"):
            out += self._open("thinking", {"type": "thinking", "thinking": "", "signature": ""})
            out.append(self._delta({"type": "thinking_delta", "thinking": thought[self.sent["thinking"]:]}))
            self.sent["thinking"] = len(thought)
        safe = plan.fmt.content(answer) if plan.calls_possible and not final else plan.fmt.text(answer, final)
        if len(safe) > self.sent["text"] and not self.calls:
            out += self._open("text", {"type": "text", "text": ""})
            out.append(self._delta({"type": "text_delta", "text": safe[self.sent["text"]:]}))
            self.sent["text"] = len(safe)
        if plan.calls_possible and not final:
            out += self._calls([(p.name, p.arguments_text, p.id) for p in plan.fmt.progress(answer)])
        return out

    def finish(self, msg: dict) -> list[str]:
        """What the final message holds that the stream has not sent (text held back while it might
        have begun a call, a call's last arguments), and the last block's stop."""
        out = []
        thought = msg.get("reasoning_content") or ""
        if len(thought) > self.sent["thinking"] and self.kind in (None, "thinking"):
            out += self._open("thinking", {"type": "thinking", "thinking": "", "signature": ""})
            out.append(self._delta({"type": "thinking_delta", "thinking": thought[self.sent["thinking"]:]}))
        content = msg.get("content") or ""
        if len(content) > self.sent["text"] and not self.calls:
            out += self._open("text", {"type": "text", "text": ""})
            out.append(self._delta({"type": "text_delta", "text": content[self.sent["text"]:]}))
        out += self._calls([(c["function"]["name"], c["function"]["arguments"], c["id"])
                           for c in msg.get("tool_calls") or []])
        if self.kind is not None:
            out.append(event("content_block_stop", index=self.index))
        return out

    def _calls(self, calls: list[tuple[str, str, str]]) -> list[str]:
        out = []
        for k, (name, arguments, written_id) in enumerate(calls):
            if k == len(self.calls):
                out += self._open(f"call {k}", {"type": "tool_use", "id": written_id or call_id(self.prefix, k),
                                                "name": name,
                                                "input": {}})
                self.calls.append(0)
            if len(arguments) > self.calls[k]:  # the text only grows: the grammar wrote it
                out.append(self._delta({"type": "input_json_delta", "partial_json": arguments[self.calls[k]:]}))
                self.calls[k] = len(arguments)
        return out

    def _open(self, kind: str, block: dict) -> list[str]:
        if self.kind == kind:
            return []
        out = [event("content_block_stop", index=self.index)] if self.kind is not None else []
        self.index, self.kind = self.index + 1, kind
        return out + [event("content_block_start", index=self.index, content_block=block)]

    def _delta(self, delta: dict) -> str:
        return event("content_block_delta", index=self.index, delta=delta)


def event(kind: str, **fields: Any) -> str:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **fields}, ensure_ascii=False)}\n\n"

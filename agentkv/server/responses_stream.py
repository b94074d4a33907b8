"""A response's output items as they are written: the Responses API's typed stream events.

Items open in the order the reply writes them (a reasoning block, then text, then each call), each
with `response.output_item.added`, its deltas, its `.done` events and `response.output_item.done`;
their ids and output indices are those of the final response (responses_items.output_items).
Text that may still turn into a call or a marker is held back (the format's `content`), and comes
out at the end if it did not.
"""

from __future__ import annotations

import json

from agentkv.server.protocol import call_id as chat_call_id
from agentkv.server.responses_items import call_item, message_item, reasoning_item


class ItemStream:
    def __init__(self, plan, rid: str):
        self.plan, self.key = plan, rid.removeprefix("resp_")
        self.seq = 0
        self.indices: dict[str, int] = {}  # "reasoning", "message", "call0", ... -> output index
        self.sent: dict[str, str] = {}  # what went out of each item's text
        self.open: str | None = None
        self.closed: set[str] = set()
        self.items: dict[str, dict] = {}

    def event(self, kind: str, **fields) -> str:
        body = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return f"event: {kind}\ndata: {json.dumps(body, ensure_ascii=False)}\n\n"

    # ---- while the reply grows ----------------------------------------------------------------------

    def grow(self, text: str) -> list[str]:
        plan, out = self.plan, []
        thought, answer = plan.split(text, final=False)
        fmt = plan.reasoning
        if thought is not None and (plan.turn.state == "inside" or text.lstrip().startswith(fmt.open)):
            out += self._write("reasoning", thought)
        content = plan.fmt.content(answer) if plan.calls_possible else plan.fmt.text(answer, final=False)
        if content:
            out += self._write("message", content)
        if plan.calls_possible:
            for k, p in enumerate(plan.fmt.progress(answer)):
                out += self._write(f"call{k}", p.arguments_text, p.name, p.id or None)
        return out

    def finish(self, final: list[dict]) -> list[str]:
        """Every final item opened, its remaining text sent (what was held back) and closed. (A call
        cut by max_tokens, opened while it was written, is closed and not in the final output.)"""
        out = []
        for k, item in enumerate(final):
            if item["type"] == "function_call":
                name = f"call{sum(i['type'] == 'function_call' for i in final[:k])}"
                out += self._write(name, item["arguments"], item["name"], item["call_id"])
            else:
                out += self._write(item["type"], item["content"][0]["text"])
        return out + self._close()

    # ---- items ----------------------------------------------------------------------------------------

    def _write(self, name: str, text: str, call_name: str = "", call_id: str | None = None) -> list[str]:
        out = []
        if name in self.closed:
            return out
        if name not in self.indices:
            out += self._close()
            out += self._add(name, call_name, call_id)
        went = self.sent[name]
        if len(text) > len(went) and text.startswith(went):
            out.append(self._delta(name, text[len(went):]))
            self.sent[name] = text
        return out

    def _add(self, name: str, call_name: str, call_id: str | None) -> list[str]:
        index = self.indices[name] = len(self.indices)
        self.sent[name], self.open = "", name
        if name == "reasoning":
            item = {**reasoning_item(self.key, ""), "content": [], "status": "in_progress"}
        elif name == "message":
            item = message_item(self.key, "", "in_progress")
        else:
            k = int(name[4:])
            item = call_item(self.key, k, call_id or chat_call_id(self.key[-8:], k), call_name, "", "in_progress")
        self.items[name] = item
        out = [self.event("response.output_item.added", output_index=index, item=item)]
        if name == "message":
            out.append(self.event("response.content_part.added", item_id=item["id"], output_index=index,
                                  content_index=0, part=_part("")))
        return out

    def _delta(self, name: str, delta: str) -> str:
        item, index = self.items[name], self.indices[name]
        kind = {"reasoning": "response.reasoning_text.delta", "message": "response.output_text.delta"}.get(
            name, "response.function_call_arguments.delta")
        fields = {"item_id": item["id"], "output_index": index, "delta": delta}
        if name in ("reasoning", "message"):
            fields["content_index"] = 0
        if name == "message":
            fields["logprobs"] = []
        return self.event(kind, **fields)

    def _close(self) -> list[str]:
        name, self.open = self.open, None
        if name is None:
            return []
        self.closed.add(name)
        item, index, text = self.items[name], self.indices[name], self.sent[name]
        out = []
        if name == "reasoning":
            out.append(self.event("response.reasoning_text.done", item_id=item["id"], output_index=index,
                                  content_index=0, text=text))
            item.update(content=[{"type": "reasoning_text", "text": text}], status="completed")
        elif name == "message":
            out.append(self.event("response.output_text.done", item_id=item["id"], output_index=index,
                                  content_index=0, text=text, logprobs=[]))
            out.append(self.event("response.content_part.done", item_id=item["id"], output_index=index,
                                  content_index=0, part=_part(text)))
            item.update(content=[_part(text)], status="completed")
        else:
            out.append(self.event("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                                  name=item["name"], arguments=text))
            item.update(arguments=text, status="completed")
        out.append(self.event("response.output_item.done", output_index=index, item=item))
        return out


def _part(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}

"""The prompt-prefix side of the Engine: chat templates rendered (with the tool format's variables),
the prefix every conversation of a system prompt shares, and prefixes prefilled into the radix
cache or pinned there. A mixin of `Engine` (engine.py), which supplies the tokenizer, the tool
format, the radix tree and the engine thread."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

from agentkv.chat.messages import is_messages
from agentkv.chat.miss import describe
from agentkv.chat.turn import Turn
from agentkv.engine.kv_owner import MISS_TOKENS
from agentkv.engine.outputs import CacheMiss
from agentkv.engine.radix_cache import PinHandle, _common_len
from agentkv.engine.request import Request
from agentkv.engine.sampling_params import SamplingParams
from agentkv.errors import PinBudgetError, RequestError

Messages = Sequence[dict[str, Any]]


class Prefixes:
    def render(self, messages: Messages, *, tools: Sequence[dict] | None = None, add_generation_prompt: bool = True,
               **template_kwargs: Any) -> str:
        """`messages` rendered with the chat template (given `template_kwargs`, e.g. Qwen3's
        `enable_thinking`, over those the tool format sets)."""
        if tools is not None:  # `ak.tool` objects carry their OpenAI-style definition
            tools = [getattr(t, "definition", t) for t in tools]
        return self.tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tools=tools,
                                                  **{**self.tool_format.template_kwargs, **template_kwargs})

    def conversation_prefix(self, messages: Messages, *, tools: Sequence[dict] | None = None,
                            **template_kwargs: Any) -> list[int]:
        """The tokens every conversation that starts with `messages` begins with: the messages
        rendered alone, cut where a following turn would tokenize them differently (what to pin
        for a system prompt and tool definitions)."""
        alone = self.tokenizer.encode(self.render(messages, tools=tools, add_generation_prompt=False,
                                                  **template_kwargs))
        probe = self.tokenizer.encode(self.render([*messages, {"role": "user", "content": "?"}], tools=tools,
                                                  **template_kwargs))
        return alone[: _common_len(alone, probe)]

    def explain_miss(self, before: Messages, after: Messages, *, tools: Sequence[Any] | None = None,
                     after_tools: Sequence[Any] | None = None, **template_kwargs: Any) -> dict | None:
        """Why the conversation `after` would miss what `before` left in the cache: where their
        prompts (rendered as chat renders them, with `tools`, and `after_tools` for `after` where
        they differ, in the model's format) part, named as a response's
        `usage.prompt_tokens_details.cache_miss` names it; None where `after` starts with all of
        `before`'s prompt but its generation prompt."""
        def plan(given):
            return Turn.plan(self.tool_format, given or [], "auto" if given else "none")

        def ids(messages: Messages, turn) -> list[int]:
            return self.tokenizer.encode(self.render(turn.messages(list(messages)), tools=turn.template_tools,
                                                     **template_kwargs))  # (nothing runs: any length)

        turn = plan(after_tools if after_tools is not None else tools)
        old, new = ids(before, plan(tools)), ids(after, turn)
        n = _common_len(old, new)
        if n >= len(old) - 1 or n >= len(new) - 1:  # (the last token's logits are always computed)
            return None
        miss = CacheMiss(n, old[n : n + MISS_TOKENS], new[n : n + MISS_TOKENS])
        return describe(miss, new, lambda t: self.tokenizer.decode(t, skip_special_tokens=False),
                        turn.messages(list(after)), list(after), turn.template_tools, self.render, self.reasoning,
                        **template_kwargs)

    def prefill(self, prefix: str | Messages | Sequence[int], *, wait: bool = True, adapter: str | None = None) -> int:
        """Compute the KV of `prefix` into the radix cache (not pinned: it may be evicted), so that
        requests starting with it skip its prefill, e.g. the branches of a fork. Returns its length
        in tokens. A list of messages is rendered without a generation prompt. `wait=False` queues
        the prefill and returns at once (a warm-up: one that fails is logged, not raised). `adapter`:
        a loaded LoRA adapter's name, whose requests then find it (None: the base model's)."""
        if not self._tree.keeps_kv:
            raise RequestError("prefill warms the radix cache; create the Engine with enable_radix_cache=True")
        ids = self._prefix_ids(prefix, None)
        done = self._prefill(ids, lambda r: None, self.adapters.resolve(adapter))
        if wait:
            done.result()
        else:
            done.add_done_callback(_log_failure)
        return len(ids)

    def pin(self, prefix: str | Messages | Sequence[int], *, tools: Sequence[dict] | None = None,
            ttl_s: float | None = None, adapter: str | None = None) -> PinHandle:
        """Compute the KV of `prefix` (text, token ids, or messages rendered without a generation prompt)
        and keep it resident until `unpin`, or with `ttl_s`, until that many seconds pass without a
        request whose prompt starts with it (each renews it; `stats()["pin_expiries"]` counts the
        ends). Raises PinBudgetError over the pin budget. `adapter`: the LoRA adapter whose requests
        it is for (an adapter's KV is its own; None: the base model's)."""
        if ttl_s is not None and not ttl_s > 0:
            raise RequestError(f"ttl_s must be a positive number of seconds, not {ttl_s!r}")
        if not self._tree.keeps_kv:  # (before the prefill, which would compute the prefix for nothing)
            raise RequestError("pins need the radix cache; create the Engine with enable_radix_cache=True")
        ids = self._prefix_ids(prefix, tools)
        budget = self._tree.pin_budget
        if len(ids) > budget:
            raise PinBudgetError(
                f"the prefix has {len(ids)} tokens, over the pin budget of {budget}; raise pin_budget_fraction")
        lora = self.adapters.resolve(adapter)
        # on the engine thread, right after the prefill put the prefix into the tree: pin it before
        # any later step could evict it
        return self._prefill(ids, lambda r: self._tree.pin(ids, ttl_s, ns=r.cache_ns), lora).result()

    def _repin(self, ids: list[int], ttl_s: float | None, left_s: float | None, ns: str | None) -> PinHandle | None:
        """A pin an earlier run kept (engine/disk/lifetime.py), made again: its prefix prefilled (read back
        from the disk tier, where it was written through when pinned) and pinned with what was left of
        its lease. An adapter's pin only where an adapter of the same content is loaded."""
        lora = self.adapters.by_hash(ns) if ns is not None else None
        if ns is not None and lora is None:
            return None
        return self._prefill(ids, lambda r: self._tree.pin(ids, ttl_s, left_s, r.cache_ns), lora).result()

    def _prefix_ids(self, prefix, tools) -> list[int]:
        if is_messages(prefix):
            prefix = self.render(prefix, tools=tools, add_generation_prompt=False)
        return self._encode(prefix)

    def _prefill(self, ids: list[int], then, adapter=None) -> Future:
        """Prefill `ids` as a request of its own (of LoRA `adapter`); the future gets `then(request)`, called
        on the engine thread as soon as the prefill is done."""
        req = Request(ids, SamplingParams(max_tokens=1, temperature=0.0), 0, frozenset(), 1, prefill_only=True,
                      adapter=adapter)
        result: Future = Future()

        def on_update(r: Request) -> None:
            if not r.finished:
                return
            if r.error is not None:
                result.set_exception(r.error)
                return
            try:
                result.set_result(then(r))
            except Exception as e:
                result.set_exception(e)

        req.on_update = on_update
        self._core.submit([req])
        return result

    def pins(self) -> list[PinHandle]:
        """The pins held now (a pin whose time to live ran out is not among them)."""
        return self._core.call(lambda: self._tree.pins).result()

    def unpin(self, handle: PinHandle, wait: bool = True) -> None:
        """Release a pin. `wait=False` only posts it to the engine thread: what a finalizer, which
        may run on any thread (the engine's own included), must do."""
        done = self._core.call(lambda: self._tree.unpin(handle))
        if wait:
            done.result()

    def flush_cache(self) -> int:
        """Evict every prefix no pin or running request holds from the KV pool (to the disk tier, where
        the engine has one, and waits until it is written); returns how many tokens left the pool."""
        freed = self._core.call(lambda: self._tree.evict(self._tree.evictable_size)).result()
        if self._tier is not None:
            self._tier.flush()
        return freed


def _log_failure(done: Future) -> None:
    if done.exception() is not None:
        logging.getLogger("agentkv").debug("agentkv: a warm-up prefill failed: %s", done.exception())

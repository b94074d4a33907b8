"""`Engine`: the public API over the engine loop (generate, chat, stream, pin, stats)."""

from __future__ import annotations

import asyncio
import atexit
import dataclasses
import logging
import random
import threading
import time
import weakref
from collections.abc import AsyncIterator, Sequence
from typing import Any

from agentkv.chat.formats import format_class, tool_format_for
from agentkv.chat.formats.template_style import template_json_style
from agentkv.chat.messages import is_messages
from agentkv.chat.reasoning import ReasoningFormat
from agentkv.chat.turn import Turn
from agentkv.engine.assembly import build_components
from agentkv.engine.config import build_config, resolve_device
from agentkv.engine.constrained import GrammarSupport, check_budget, output_parser
from agentkv.engine.core import EngineCore
from agentkv.engine.disk.lifetime import save_at_close, warm_at_start
from agentkv.engine.lora import Adapters
from agentkv.engine.lora.methods import LoraMethods
from agentkv.engine.memory import free_memory
from agentkv.engine.outputs import Completion, RequestOutput, StreamDelta, Usage
from agentkv.engine.prefixes import Prefixes
from agentkv.engine.request import ReasoningBudget, Request
from agentkv.engine.sampling_params import SamplingParams
from agentkv.engine.tokenizer import template_text
from agentkv.errors import PromptTooLongError, RequestError

Prompt = str | Sequence[int]
Messages = Sequence[dict[str, Any]]


class Engine(Prefixes, LoraMethods):
    """An LLM engine with a radix-cached KV pool and continuous batching, served by a background thread.

    `Engine()` loads the embedded SmolLM2-135M-Instruct; `Engine(model=path)` an HF directory or GGUF
    file. `device` and `dtype` "auto" (the defaults) pick a CUDA GPU with bf16 where torch sees one,
    else the CPU with fp32 (logged once, on the `agentkv` logger). Keyword options go to
    `EngineConfig`, `CacheConfig` or `SchedulerConfig` by name, e.g.
    `Engine(num_slots=4096, max_step_tokens=1024, enable_radix_cache=False)`. `lora={name: path}` serves
    LoRA adapters beside the base model (requests name one with `adapter=`; docs/lora.md).
    """

    def __init__(self, model: str | None = None, *, device: str = "auto", dtype: str = "auto", **options: Any):
        chosen = device, dtype
        device, dtype = resolve_device(device, dtype)
        if "auto" in chosen:
            logging.getLogger("agentkv").info("agentkv: the engine runs on %s in %s", device, dtype)
        self.config = cfg = build_config(model, device, dtype, options)
        if cfg.tool_format is not None:
            format_class(cfg.tool_format)  # a name that is not a format fails before the model loads

        if cfg.scheduler.speculative and cfg.overlap_schedule:
            raise RequestError("speculative decoding and overlap_schedule do not combine yet (a pass's input "
                               "depends on how much of the last draft was kept): leave overlap_schedule unset")
        overlap = cfg.overlap_schedule if cfg.overlap_schedule is not None else (
            device.startswith("cuda") and not cfg.scheduler.speculative)

        self._core = EngineCore(lambda: build_components(cfg, model, device, dtype, overlap),
                                build_on_worker=overlap and device == "cpu" and cfg.tensor_parallel == 1)
        parts = self._core.parts
        self.tokenizer, self.model_config, self.context_length = (parts.tokenizer, parts.model_config,
                                                                  parts.context_length)
        self._pool, self._tree, self._tier = parts.pool, parts.tree, parts.tier
        self.adapters = Adapters(self.model_config, cfg.max_loras, device)
        try:
            for name, path in cfg.lora:
                self.adapters.load(name, path)
        except BaseException:
            self._core.close()
            raise
        if cfg.chat_template is not None:
            self.tokenizer.chat_template = template_text(cfg.chat_template)
        fmt = tool_format_for(self.tokenizer, cfg.tool_format)  # how this model calls tools
        if self.tokenizer.chat_template:  # ... and the JSON style its template writes calls in (None: unsaid)
            fmt = dataclasses.replace(fmt, json_style=template_json_style(self.tokenizer.apply_chat_template))
        self.tool_format = fmt
        self.reasoning = ReasoningFormat.for_template(self.tokenizer.chat_template)  # None: it does not reason
        # the format's and the reasoning's markup, where they are special tokens, decode to their text
        markers = self.reasoning.markers if self.reasoning else ()
        self.tokenizer.keep_specials(self.tool_format.special_markers + markers)
        self._grammars = GrammarSupport(self.tokenizer)
        self._rng = random.Random(cfg.seed) if options.get("seed") is not None else random.SystemRandom()
        _live_engines.add(self)
        if self._tier is not None:
            room = int(self._pool.capacity * cfg.cache.kv_warm_fraction)
            threading.Thread(target=warm_at_start, args=(self._core, self._tier, room, self._repin),
                             name="agentkv-kv-warm", daemon=True).start()

    # ---- generation -----------------------------------------------------------------------------

    def generate(self, prompt: Prompt | Sequence[Prompt], params: SamplingParams | None = None, *, schema: Any = None,
                 **sampling: Any):
        """Complete a prompt (text or token ids), or a list of prompts (batched; list in, list out).

        `schema=` (a Pydantic model class, a JSON Schema dict or text) is `json_schema=`: the output then
        matches it, and `out.parsed` is the validated object."""
        batch = _is_batch(prompt)
        prompts = list(prompt) if batch else [prompt]
        params = self._params(params, sampling, schema)
        groups = [self._make_requests(self._encode(p), params) for p in prompts]
        self._run_to_end([r for g in groups for r in g])
        outs = [self._output(g) for g in groups]
        return outs if batch else outs[0]

    def chat(self, messages: Messages, params: SamplingParams | None = None, *, tools: Sequence[Any] | None = None,
             tool_choice: str = "auto", schema: Any = None, chat_template_kwargs: dict | None = None,
             **sampling: Any) -> RequestOutput:
        """Generate the assistant's reply to `messages` rendered with the model's chat template.

        With `tools` (`@ak.tool` functions or OpenAI tool definitions) the reply is generated under
        the model's tool-call format: each completion's `tool_calls` are the calls it completed
        (arguments matching their tool's schema; `finish_reason` "tool_calls", or "length" where
        max_tokens cut a later one) and its `content` the text before them. `tool_choice`: "auto",
        "required", "none" or a tool's name. A reasoning model (`<think>`) reasons first, free of the
        grammar (`reasoning` of each completion), unless `chat_template_kwargs` turn it off."""
        kwargs = chat_template_kwargs or {}
        if not tools and self.reasoning is None:
            params = self._chat_params(self._params(params, sampling, schema))
            return self.generate(self.render(messages, **kwargs), params)
        turn = Turn.plan(self.tool_format, tools or [], tool_choice if tools else "none", schema, self.reasoning)
        params = self._params(params, sampling)
        prompt = self.render(turn.messages(messages), tools=turn.template_tools, **kwargs)
        turn = turn.after(prompt)
        return turn.read(self.generate(prompt, turn.params(params)))

    async def agenerate(
        self, prompt: Prompt | Messages, params: SamplingParams | None = None, *, schema: Any = None, **sampling: Any
    ) -> RequestOutput:
        result: list[RequestOutput] = []
        async for _ in self._run_async(prompt, self._params(params, sampling, schema), False, result):
            pass
        return result[0]

    async def stream(self, prompt: Prompt | Messages, params: SamplingParams | None = None, *, schema: Any = None,
                     **sampling: Any) -> AsyncIterator[StreamDelta]:
        """Yield text deltas as they become stable (stop strings and partial characters held back)."""
        async for delta in self._run_async(prompt, self._params(params, sampling, schema), True, []):
            yield delta

    def score(self, prompt: Prompt | Messages, continuations: Sequence[str | Sequence[int]]) -> list[list[float]]:
        """The model's logprob of each token of each continuation after `prompt` (one prefill each,
        all sharing the prompt's KV through the radix cache). Continuations are tokenized on their
        own and appended to the prompt's tokens: the prompt's tokens are never changed."""
        if is_messages(prompt):
            prompt = self.render(prompt)
        ids = self._encode(prompt)
        conts = [self._encode(c) for c in continuations]
        longest = max((len(c) for c in conts), default=0)
        if len(ids) + longest >= min(self.context_length, self._pool.capacity):
            raise PromptTooLongError(
                f"prompt plus continuation is {len(ids) + longest} tokens, over the context; shorten them")
        reqs = [
            Request(ids + c, SamplingParams(max_tokens=1), 0, frozenset(), 1, prefill_only=True, score_from=len(ids))
            for c in conts
        ]
        self._run_to_end(reqs)
        for r in reqs:
            if r.error is not None:
                raise r.error
        return [r.token_scores for r in reqs]

    @property
    def grammar_compiler(self):
        """The engine's `GrammarCompiler` (built from its tokenizer on first use; caches grammars)."""
        return self._grammars.compiler

    @grammar_compiler.setter
    def grammar_compiler(self, compiler) -> None:
        """Share one compiler (and its cache) between engines that use the same tokenizer."""
        self._grammars.use(compiler)

    async def _run_async(
        self, prompt, params: SamplingParams, want_deltas: bool, result: list) -> AsyncIterator[StreamDelta]:
        if is_messages(prompt):
            prompt, params = self.render(prompt), self._chat_params(params)
        group = self._make_requests(self._encode(prompt), params, stream=want_deltas)
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Request] = asyncio.Queue()
        for r in group:
            r.on_update = lambda r: loop.call_soon_threadsafe(queue.put_nowait, r)
        self._core.submit(group)
        sent_text = {r.rid: 0 for r in group}
        sent_tokens = {r.rid: 0 for r in group}
        closed: set[int] = set()
        try:
            while len(closed) < len(group):
                r = await queue.get()
                if r.error is not None:
                    raise r.error
                if r.rid in closed:
                    continue
                # One reading of the request's state for this update: the engine thread moves on while
                # the consumer holds a delta, and a request that finished meanwhile must still send
                # its last delta (finished first: its text is final by the time it is set).
                finished = r.finished
                if want_deltas:
                    text = r.stable_text()
                    if len(text) > sent_text[r.rid] or finished:
                        delta = StreamDelta(
                            group.index(r), text[sent_text[r.rid] :], r.output_ids[sent_tokens[r.rid] :],
                            r.finish_reason if finished else None, r.usage if finished else None,
                            _completion(r, output_parser(params)) if finished else None,
                            group[0].cache_miss if finished else None,
                        )
                        sent_text[r.rid], sent_tokens[r.rid] = len(text), len(r.output_ids)
                        yield delta
                if finished:
                    closed.add(r.rid)
        except BaseException:
            self._core.abort([r for r in group if not r.finished])  # a disconnecting client frees its KV
            raise
        result.append(self._output(group))

    def _run_to_end(self, reqs: list[Request]) -> None:
        """Submit `reqs` and wait until every one has finished (Ctrl-C aborts them)."""
        if not reqs:
            return
        done = threading.Event()
        remaining = [len(reqs)]
        lock = threading.Lock()

        def on_update(r: Request) -> None:
            if r.finished:
                with lock:
                    remaining[0] -= 1
                    if remaining[0] == 0:
                        done.set()

        for r in reqs:
            r.on_update = on_update
        self._core.submit(reqs)
        try:
            done.wait()
        except KeyboardInterrupt:
            self._core.abort(reqs)
            raise

    # ---- introspection and lifetime ----------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        def read() -> dict[str, Any]:
            s, t = self._core.scheduler, self._tree
            st = dataclasses.asdict(s.stats)
            st.update(
                cache_hit_rate=st["cached_prompt_tokens"] / st["prompt_tokens"] if st["prompt_tokens"] else 0.0,
                waiting=len(s.waiting),
                running=len(s.running),
                free_slots=self._pool.num_free,
                total_slots=self._pool.capacity,
                cached_tokens=t.total_size,
                evictable_tokens=t.evictable_size,
                protected_tokens=t.protected_size,
                pinned_tokens=t.pinned_size,
                pin_budget=t.pin_budget,
                evicted_tokens=t.num_evicted_tokens,
                pins=len(t.pins),
                pin_expiries=t.leases.expired,
                weight_bytes=self._core.runner.model.weight_bytes(),
                free_memory_bytes=free_memory(self.config.device),
                kv_bytes=self._pool.nbytes,
            )
            if self._tier is not None:
                st.update(self._tier.stats())
            st.update(self._grammars.stats())
            return st

        return self._core.call(read).result()

    def close(self) -> None:
        """Stop the engine. With a disk tier, the pool's prefixes are written there first, the most recently
        used first, within `kv_flush_timeout` seconds: a restart on the same kv_dir finds them."""
        if self._tier is not None:
            deadline = save_at_close(self._core, self._tier, self.config.cache.kv_flush_timeout)
        self._core.close()
        if self._tier is not None:
            self._tier.close(max(deadline - time.monotonic(), 0.1))  # what it was writing reaches the disk
        _live_engines.discard(self)

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- helpers ----------------------------------------------------------------------------------

    def _params(self, params: SamplingParams | None, overrides: dict[str, Any], schema: Any = None) -> SamplingParams:
        params = params or SamplingParams()
        if schema is not None:
            overrides = {**overrides, "json_schema": schema}
        return params.with_(**overrides) if overrides else params

    def _chat_params(self, params: SamplingParams) -> SamplingParams:
        """A chat's parameters: JSON in the style the model's template writes calls in, unless they name
        one (as on the server's chat route; chat/turn.py does the same for tools)."""
        if params.json_style is None and self.tool_format.json_style is not None:
            return params.with_(json_style=self.tool_format.json_style)
        return params

    def _encode(self, prompt: Prompt) -> list[int]:
        if isinstance(prompt, str):
            ids = self.tokenizer.encode(prompt)
        elif isinstance(prompt, (list, tuple)) and all(isinstance(t, int) for t in prompt):
            ids = list(prompt)
            bad = [t for t in ids if not 0 <= t < self.model_config.vocab_size]
            if bad:
                raise RequestError(
                    f"token ids {bad[:5]} are outside the vocabulary [0, {self.model_config.vocab_size})")
        else:
            raise RequestError(f"a prompt must be a string or a list of token ids, got {type(prompt).__name__}")
        if not ids:
            raise RequestError("the prompt is empty; give at least one token of text")
        if len(ids) >= self.context_length:
            raise PromptTooLongError(
                f"the prompt has {len(ids)} tokens but the context holds {self.context_length}; shorten it "
                "(or raise context_length up to the model's limit)"
            )
        if len(ids) + 1 > self._pool.capacity:
            raise PromptTooLongError(
                f"the prompt has {len(ids)} tokens but the KV pool holds {self._pool.capacity}; raise num_slots")
        return ids

    def _make_requests(self, ids: list[int], params: SamplingParams, stream: bool = False) -> list[Request]:
        outside = [t for t, _ in params.logit_bias if t >= self.model_config.vocab_size]
        if outside:
            raise RequestError(f"SamplingParams.logit_bias names token ids {outside[:5]} outside the vocabulary "
                               f"[0, {self.model_config.vocab_size})")
        limit = min(self.context_length, self._pool.capacity) - len(ids)
        max_new = limit if params.max_tokens is None else min(params.max_tokens, limit)
        eos = self.tokenizer.eos_ids
        grammar = self._grammars.compile(params)  # GrammarError here, before anything is queued
        if grammar is not None and params.budget_closing:
            check_budget(grammar, max_new, params.max_tokens is None)
        budget = self._reasoning_budget(ids, params)
        adapter = self.adapters.resolve(params.adapter)  # UnknownAdapterError before anything is queued
        out = []
        for i in range(params.n):
            seed = params.seed + i if params.seed is not None else self._rng.getrandbits(63)
            out.append(Request(ids, params, seed, eos, max_new, stream=stream, grammar=grammar, reasoning=budget,
                               adapter=adapter))
        return out

    def _reasoning_budget(self, ids: list[int], params: SamplingParams) -> ReasoningBudget | None:
        if params.max_reasoning_tokens is None:
            return None
        if self.reasoning is None:
            raise RequestError("max_reasoning_tokens is set, but this model's chat template has no reasoning markers "
                               "(<think>); leave it unset")
        state = self.reasoning.state(self.tokenizer.decode(ids[-16:], skip_special_tokens=False))
        if state == "off":
            return None
        return ReasoningBudget(self.reasoning, params.max_reasoning_tokens, state == "inside")

    def _output(self, group: list[Request]) -> RequestOutput:
        for r in group:
            if r.error is not None:
                raise r.error
        usage = Usage(
            prompt_tokens=len(group[0].prompt_ids),
            cached_tokens=group[0].usage.cached_tokens,
            completion_tokens=sum(r.usage.completion_tokens for r in group),
            forward_passes=max(r.usage.forward_passes for r in group),
            jump_forward_tokens=sum(r.usage.jump_forward_tokens for r in group),
            draft_tokens=sum(r.usage.draft_tokens for r in group),
            accepted_draft_tokens=sum(r.usage.accepted_draft_tokens for r in group),
            disk_cached_tokens=group[0].usage.disk_cached_tokens,
            closing_tokens=sum(r.usage.closing_tokens for r in group),
        )
        parser = output_parser(group[0].params)
        return RequestOutput(list(group[0].prompt_ids), [_completion(r, parser) for r in group], usage,
                             group[0].cache_miss)


def _completion(r: Request, parser) -> Completion:
    return Completion(r.text, list(r.output_ids), r.finish_reason or "abort", r.logprobs if r.params.logprobs else None,
                      parser, r.grammar_complete, truncated=r.truncated)


def _is_batch(prompt: Any) -> bool:
    return isinstance(prompt, (list, tuple)) and bool(prompt) and not isinstance(prompt[0], int)


_live_engines: weakref.WeakSet[Engine] = weakref.WeakSet()


@atexit.register
def _close_engines() -> None:
    for e in list(_live_engines):
        e.close()

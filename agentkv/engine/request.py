"""A request's state inside the engine: its tokens, its KV bookkeeping, its output so far."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from agentkv.engine.outputs import CacheMiss, TokenLogprob, Usage
from agentkv.engine.sampling_params import SamplingParams
from agentkv.errors import GrammarError
from agentkv.grammar import CompiledGrammar, Matcher

if TYPE_CHECKING:
    from agentkv.chat.reasoning import ReasoningFormat
    from agentkv.engine.lora.adapter import LoraAdapter
    from agentkv.engine.radix_cache import TreeNode
    from agentkv.engine.speculative import Speculation
    from agentkv.engine.tokenizer import Tokenizer

_ids = itertools.count()
DECODE_CONTEXT = 4  # earlier tokens decoded again with new ones (see Request._decode)
PREFIX_BLOCK = 16  # tokens per block of `Request.prefix_hashes`


@dataclass(frozen=True)
class ReasoningBudget:
    """A reasoning block closed after `tokens` output tokens (agentkv/chat/reasoning.py); `opened`: the
    prompt opened it, else the reply may."""

    fmt: ReasoningFormat
    tokens: int
    opened: bool


@dataclass(eq=False)
class Request:
    prompt_ids: list[int]
    params: SamplingParams
    seed: int
    eos_ids: frozenset[int]
    max_new_tokens: int  # params.max_tokens, capped by the context length
    prefill_only: bool = False  # compute the prompt's KV and finish (pins)
    stream: bool = False  # keep `text` current after every token
    on_update: Callable[[Request], None] | None = None  # called by the engine thread after each step
    grammar: CompiledGrammar | None = None  # compiled on the caller's thread; the output must match it
    score_from: int | None = None  # a scoring request: the logprob of each of all_ids[score_from:] is kept
    reasoning: ReasoningBudget | None = None  # closed when spent, unless the reply closed it or never opened it
    adapter: LoraAdapter | None = None  # its LoRA adapter (held until it ends, even where it is unloaded meanwhile)
    rid: int = field(default_factory=lambda: next(_ids))

    output_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    # KV bookkeeping (owned by the scheduler)
    row: int | None = None  # row in the request-to-slot table while admitted
    kv_len: int = 0  # tokens of all_ids whose K/V are in the pool
    prefix_len: int = 0  # of those, tokens shared with the radix tree (locked at last_node)
    pending: int = 0  # slots placed for passes in flight, not yet counted in kv_len
    inflight: int = 0  # output tokens sampled by passes not yet processed (overlap: up to two)
    future_row: int = -1  # this request's sampling row in the latest scheduled pass
    last_node: TreeNode | None = None
    admitted_once: bool = False
    disk_prefetch: dict | None = None  # the disk tier's reads started while it waits (kv_owner.prefetch)
    disk_tokens: int = 0  # prompt tokens read back from the disk tier before its first admission
    usage: Usage = field(default_factory=Usage)
    cache_miss: CacheMiss | None = None  # where its prompt parted from a longer cached path (first admission)
    # output state
    text: str = ""
    finish_reason: str | None = None
    error: BaseException | None = None
    matcher: Matcher | None = None  # made on the engine thread by start_grammar
    token_scores: list[float] = field(default_factory=list)  # logprobs of all_ids[score_from:]
    cut_short: bool = False  # a stop string or stop token id ended the text before its grammar did
    truncated: bool = False  # budget closing ended the output with its grammar's shortest completion
    closed_at: int | None = None  # of all_ids, where that completion starts (K/V computed past it is not its own)
    speculation: Speculation | None = None  # drafting state, made by the scheduler when speculation is on

    def __post_init__(self) -> None:
        self.usage.prompt_tokens = len(self.prompt_ids)
        self._all = list(self.prompt_ids)  # prompt + output, appended to (read it, never change it)
        self._decoded = 0  # output tokens whose text is `_decoded_text` (a whole number of characters)
        self._decoded_text = ""
        self._seen: set[int] = set()  # seen_ids() over all_ids[:_seen_upto]
        self._seen_upto = 0
        self._prefix_hashes: list[int] = []

    @property
    def all_ids(self) -> list[int]:
        if len(self._all) != len(self.prompt_ids) + len(self.output_ids):  # output_ids was set, not appended to
            self._all = self.prompt_ids + self.output_ids
        return self._all

    def seen_ids(self) -> list[int]:
        """The distinct token ids of prompt + output (the repetition penalty's), kept as tokens are
        appended rather than rebuilt from the whole sequence on every step."""
        ids = self.all_ids
        if self._seen_upto > len(ids):  # output_ids was set anew
            self._seen, self._seen_upto = set(), 0
        self._seen.update(ids[self._seen_upto :])
        self._seen_upto = len(ids)
        return list(self._seen)

    def prefix_hashes(self) -> list[int]:
        """Entry i identifies all_ids[: PREFIX_BLOCK * (i + 1)] (a chained hash of whole blocks, made
        once per block): two requests share their first k blocks when their k-th entries are equal."""
        ids, hashes = self.all_ids, self._prefix_hashes
        for i in range(len(hashes), len(ids) // PREFIX_BLOCK):  # (an adapter's blocks apart from the others')
            hashes.append(hash((hashes[-1] if hashes else self.cache_ns,
                                *ids[i * PREFIX_BLOCK : (i + 1) * PREFIX_BLOCK])))
        return hashes

    @property
    def cache_ns(self) -> str | None:
        """The radix cache's namespace of its KV: its adapter's content hash (None: the base model's)."""
        return None if self.adapter is None else self.adapter.hash

    @property
    def seq_len(self) -> int:
        """Tokens of the sequence, counting sampled tokens still in flight (their ids are not known yet)."""
        return len(self.prompt_ids) + len(self.output_ids) + self.inflight

    @property
    def computed(self) -> int:
        """Tokens whose K/V is in the pool or being computed by a pass in flight: the next pass starts here."""
        return self.kv_len + self.pending

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def remaining_tokens(self) -> int:
        return max(self.max_new_tokens - len(self.output_ids) - self.inflight, 0)

    @property
    def grammar_complete(self) -> bool:
        """The output ended because its grammar was complete (read once the request has finished).
        An output cut by max_tokens is never complete, even where its grammar could end there."""
        m = self.matcher
        return (m is not None and self.finish_reason == "stop" and not self.cut_short
                and (m.is_terminated() or m.can_terminate()))

    def start_grammar(self, tokenizer: Tokenizer) -> None:
        """On the engine thread before the first pass: the matcher, and the text the grammar forces
        at the very start (prefilled together with the prompt)."""
        if self.grammar is not None:
            self.matcher = Matcher(self.grammar)
            self.jump_forward(tokenizer)

    def append_token(self, token_id: int, tokenizer: Tokenizer) -> None:
        """Record a sampled token and decide whether the request is finished."""
        if self.matcher is not None and not self.matcher.accept_token(token_id):
            raise AssertionError(f"token {token_id} was sampled outside the grammar's mask")
        self._append([token_id], tokenizer)

    def jump_forward(self, tokenizer: Tokenizer) -> int:
        """Append the tokens forced next: the end of a reasoning block whose budget is spent, and what
        the grammar forces (canonical, see Matcher.jump_forward_tokens); they are computed in the
        next pass's extend. Returns how many were appended."""
        if self.finished:
            return 0
        closed = self._close_reasoning(tokenizer)
        if self.matcher is None or not self.params.jump_forward or self.finished:
            return closed
        toks = self.matcher.jump_forward_tokens()[: self.remaining_tokens]
        if not toks:
            return closed
        self.append_forced(toks, tokenizer)
        return closed + len(toks)

    def append_forced(self, toks: list[int], tokenizer: Tokenizer) -> None:
        """Append a run of tokens the grammar forces (jump-forward's, or a draft's that held them)."""
        if not self.matcher.accept_tokens(toks):
            raise AssertionError(f"the grammar refused its own forced tokens {toks}")
        self.usage.jump_forward_tokens += len(toks)
        self._append(toks, tokenizer)

    def _close_reasoning(self, tokenizer: Tokenizer) -> int:
        """With a reasoning budget: once the reply has written that many tokens inside its block,
        append the block's end (where the grammar takes it here: not inside a character)."""
        b = self.reasoning
        if b is None or len(self.output_ids) < b.tokens:
            return 0
        if not b.opened:
            head = tokenizer.decode(self.output_ids[:16], skip_special_tokens=False).lstrip()
            if not head.startswith(b.fmt.open):
                self.reasoning = None  # the reply answers without a block
                return 0
        if b.fmt.close in tokenizer.decode(self.output_ids, skip_special_tokens=False):  # once, when spent
            self.reasoning = None  # it closed the block itself
            return 0
        ids = tokenizer.encode(b.fmt.close_text, add_bos=False)
        if len(ids) > self.remaining_tokens or (self.matcher is not None and not self.matcher.accept_tokens(ids)):
            return 0
        self.reasoning = None
        self._append(ids, tokenizer)
        return len(ids)

    def end_at_dead_end(self, tokenizer: Tokenizer) -> None:
        """The grammar allows no token here (and cannot end): stop with a finish reason that says so,
        or with the error that emptied the mask (Matcher.error)."""
        self._update_text(tokenizer, None)
        if self.matcher is not None and self.matcher.error is not None:
            self.error = self.matcher.error
            self.finish_reason = "error"
            return
        self.finish_reason = "grammar_dead_end"

    def _closing(self, ids: list[int]) -> list[int] | None:
        """Budget closing (SamplingParams.budget_closing), with the matcher just past `ids`: where the
        shortest completion from there no longer fits the tokens left after them, they are taken back
        and the shortest completion from before them is returned, to be appended instead. It fits: it
        was checked with every token appended, and before the first (constrained.check_budget). None
        where `ids` stand."""
        m = self.matcher
        if m is None or not self.params.budget_closing or m.is_terminated():
            return None
        left = self.max_new_tokens - len(self.output_ids) - len(ids)
        text = m.completion_bytes()
        if text is None or len(text) <= left:  # (every token writes at least a byte: it fits)
            return None
        after = m.completion_tokens()
        if after is not None and len(after) <= left:
            return None
        try:
            m.rollback(len(ids))
        except GrammarError:  # (a forced run longer than the matcher keeps: cut at max_tokens as before)
            return None
        closing = m.completion_tokens()
        if closing is None or len(closing) > left + len(ids) or not m.accept_tokens(closing):
            m.accept_tokens(ids)  # (nothing closes it here after all: cut at max_tokens as before)
            return None
        self.truncated = True
        self.closed_at = len(self.all_ids)
        self.usage.closing_tokens += len(closing)
        return closing

    def _append(self, ids: list[int], tokenizer: Tokenizer) -> None:
        """`text` is updated before `finish_reason`: a streaming reader on another thread that sees the
        request finished must also see its final text."""
        p = self.params
        closing = self._closing(ids)
        if closing is not None:
            ids = closing
            if not ids:  # the output may end where it stood: it ends there
                self.finish_reason = self._update_text(tokenizer, "length") or "length"
                return
        cut = next((i for i, t in enumerate(ids) if t in p.stop_token_ids), None)
        if cut is not None:
            ids = ids[: cut + 1]
            self.cut_short = ids[-1] not in self.eos_ids
        self.output_ids.extend(ids)
        self._all.extend(ids)
        self.usage.completion_tokens = len(self.output_ids)
        last, reason = ids[-1], None
        # with a grammar, EOS ends the output even under ignore_eos: nothing may follow it
        if self.truncated:
            reason = "length"
        elif cut is not None or (last in self.eos_ids and (not p.ignore_eos or self.matcher is not None)):
            reason = "stop"
        elif self.matcher is not None and self.matcher.must_terminate():
            reason = "stop"  # the grammar is complete and allows nothing more: no pass spent on EOS
        elif len(self.output_ids) >= self.max_new_tokens:
            reason = "length"
        if p.stop or self.stream or reason is not None:
            reason = self._update_text(tokenizer, reason) or reason
        self.finish_reason = reason

    def _update_text(self, tokenizer: Tokenizer, reason: str | None) -> str | None:
        """Decode the output into `text` (the new tokens only); returns "stop" when a stop string
        ended it."""
        ids = self.output_ids
        if reason == "stop" and ids and (ids[-1] in self.eos_ids or ids[-1] in self.params.stop_token_ids):
            ids = ids[:-1]  # the stop token is not part of the text
        text = self._decode(tokenizer, ids)
        stopped = None
        if self.params.stop and reason != "stop":
            # search only where a new match can be: a stop string may span the last few tokens
            start = max(len(self.text) - max(len(s) for s in self.params.stop), 0)
            hits = [(i, s) for s in self.params.stop if (i := text.find(s, start)) >= 0]
            if hits:
                text = text[: min(hits)[0]]
                stopped = "stop"
                self.cut_short = True
        self.text = text
        return stopped

    def _decode(self, tokenizer: Tokenizer, ids: list[int]) -> str:
        """The text of `ids` (the output so far), decoding only what follows the last whole
        character: a window of a few earlier tokens gives the decoder the context it reads at a
        text's start (SentencePiece drops a leading space), and their own text is cut off again."""
        skip = self.params.skip_special_tokens
        done = min(self._decoded, len(ids))
        start = max(done - DECODE_CONTEXT, 0)
        head = tokenizer.decode(ids[start:done], skip_special_tokens=skip)
        tail = tokenizer.decode(ids[start:], skip_special_tokens=skip)
        if not tail.startswith(head):
            self._decoded, self._decoded_text = 0, ""  # text the window cannot extend: decode it all
            return self._decode(tokenizer, ids) if done else tail
        text = self._decoded_text + tail[len(head):]
        if not text.endswith("\ufffd"):  # a whole number of characters: the next decode starts here
            self._decoded, self._decoded_text = len(ids), text
        return text

    def stable_text(self) -> str:
        """Text that can be streamed now: held back while it could still turn into a stop string
        or ends inside a multi-byte character."""
        if self.finished:
            return self.text
        text = self.text.rstrip("\ufffd")
        if self.params.stop:
            hold = max(len(s) for s in self.params.stop) - 1
            for k in range(min(hold, len(text)), 0, -1):
                if any(s.startswith(text[-k:]) for s in self.params.stop):
                    return text[:-k]
        return text


class PrefixSet:
    """The prefixes of the requests in progress (prefilling in this batch or in one in flight), by
    block hash: whether a waiting request shares n tokens with one of them costs one set lookup,
    not a scan of every pair (the dedup check; SGLang keeps a small radix tree for it)."""

    def __init__(self, reqs: list[Request]):
        self.hashes: set[int] = set()
        for r in reqs:
            self.add(r)

    def add(self, r: Request) -> None:
        self.hashes.update(r.prefix_hashes())

    def holds(self, r: Request, n: int) -> bool:
        """Whether one of them begins with r's first n tokens (rounded up to whole blocks)."""
        block = -(-n // PREFIX_BLOCK) - 1
        hashes = r.prefix_hashes()
        return block < len(hashes) and hashes[block] in self.hashes

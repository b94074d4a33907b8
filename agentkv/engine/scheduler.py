"""Decides what each forward pass computes; owns the queues (who holds which KV slot: kv_owner.py).

One step's batch holds a decode token for every running request that has finished its prefill,
then prefill chunks (extends) under a per-step token budget: first the one request whose prefill is
mid-way, then waiting requests in longest-prefix-match order. A request is admitted only when its
uncached tokens plus a reservation for its future tokens fit in free + evictable memory; when decode
memory runs out anyway, a request is retracted (its KV goes to the radix tree, it waits again, and
resumes later from whatever of it is still cached).
"""

from __future__ import annotations

from collections import deque

import torch

from agentkv.engine.batch import ScheduledBatch, SchedulerStats
from agentkv.engine.config import SchedulerConfig
from agentkv.engine.disk import DiskTier
from agentkv.engine.inflight import InFlight
from agentkv.engine.kv_owner import KVOwner
from agentkv.engine.memory import KVPool, ReqToTokenPool
from agentkv.engine.null_cache import PrefixCache
from agentkv.engine.request import PrefixSet, Request
from agentkv.engine.speculative import Draft, Drafter


class Scheduler:
    def __init__(self, cfg: SchedulerConfig, pool: KVPool, req_pool: ReqToTokenPool, tree: PrefixCache,
                 tier: DiskTier | None = None):
        self.cfg = cfg
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.chunked: Request | None = None  # at most one request is mid-prefill across steps
        self.new_token_ratio = cfg.new_token_ratio
        self.stats = SchedulerStats()
        self.flight = InFlight()  # what passes scheduled and not yet processed owe (overlap)
        self.kv = KVOwner(pool, req_pool, tree, self.flight, tier)  # who holds which slot
        self.drafter = Drafter(cfg.speculative_tokens, tree) if cfg.speculative else None

    # the memory (the KV pool, the slot table, the prefix cache) is the KV owner's; read here
    @property
    def pool(self) -> KVPool:
        return self.kv.pool

    @property
    def req_pool(self) -> ReqToTokenPool:
        return self.kv.req_pool

    @property
    def tree(self) -> PrefixCache:
        return self.kv.tree

    # ---- queue ---------------------------------------------------------------------------------

    def add(self, req: Request) -> None:
        if self.waiting or self.running:  # it will wait: what a disk tier holds of it is read meanwhile
            self.kv.prefetch(req)  # (an idle engine admits it at once, reading straight into one buffer)
        self.waiting.append(req)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def abort(self, req: Request, reason: str = "abort") -> None:
        """Remove `req` wherever it is and free its memory. Safe to call twice."""
        if req in self.waiting:
            self.waiting.remove(req)
        if req in self.running:
            self.running.remove(req)
        if self.chunked is req:
            self.chunked = None
        self.kv.release(req)
        if req.finish_reason is None:
            req.finish_reason = reason

    # ---- building a batch ----------------------------------------------------------------------

    def schedule(self) -> ScheduledBatch | None:
        self.new_token_ratio = max(self.cfg.min_new_token_ratio, self.new_token_ratio - self.cfg.new_token_ratio_decay)
        # running requests past their prefill: one decode token each, or the jump-forward tokens
        # appended since their last pass plus the sampled one (an extend)
        # (with overlap, `computed` counts the pass in flight, and a request whose token in flight is
        # its last allowed one waits for it instead of spending a row that would be thrown away)
        active = self._make_room([r for r in self.running if r is not self.chunked and r.computed < r.seq_len
                                  and not (r.inflight and r.remaining_tokens == 0)])
        decodes = [r for r in active if r.computed == r.seq_len - 1]
        jumps = [r for r in active if r.computed < r.seq_len - 1]
        # drafts are the running requests' work, as their decodes are: before any prefill, within the step's
        # tokens, and the prefills (a chunk, an admission) take what is left
        budget = self.cfg.max_step_tokens - len(decodes) - sum(r.seq_len - r.computed for r in jumps)
        drafted = self._drafts(decodes, active, budget) if self.drafter else {}
        if drafted:  # a request with a draft extends its last token and the draft (after the decodes)
            decodes = [r for r in decodes if r not in drafted]
        reqs: list[Request] = list(decodes)
        ext_lens = [1] * len(decodes)
        locs = [self.kv.alloc(len(decodes))] if decodes else []
        if decodes:  # every decode row's slot in one indexed write, not one write per row
            rows = torch.tensor([r.row for r in decodes], dtype=torch.int64)
            cols = torch.tensor([r.computed for r in decodes], dtype=torch.int64)
            self.req_pool.write_cells(rows, cols, locs[0])
        budget = self.cfg.max_step_tokens - len(decodes)
        for r in jumps + list(drafted):  # short runs, always whole: splitting them would cost a pass each
            n = r.seq_len - r.computed + len(drafted.get(r, ()))
            locs.append(self.kv.place(r, n))
            reqs.append(r)
            ext_lens.append(n)
            budget -= n

        if self.chunked is not None and budget > 0:
            r = self.chunked
            # its next chunk takes what memory is left: decodes may have used what its admission counted on
            room = self.pool.num_free + self.tree.evictable_size
            n = min(r.seq_len - r.computed, budget, room)
            if n > 0:
                locs.append(self.kv.place(r, n))
                reqs.append(r)
                ext_lens.append(n)
                budget -= n
                if r.computed + n == r.seq_len:
                    self.chunked = None
        if self.chunked is None and budget > 0 and self.waiting:
            self._admit(budget, len(decodes), reqs, ext_lens, locs)

        if not reqs:
            return None
        out = torch.cat(locs) if len(locs) > 1 else locs[0]
        batch = ScheduledBatch(reqs, ext_lens, len(decodes), out, len(jumps) + len(drafted))
        batch.drafts = {i: drafted[r] for i, r in enumerate(reqs) if r in drafted}
        self.flight.launch(batch)
        return batch

    def _drafts(self, decodes: list[Request], active: list[Request], budget: int) -> dict[Request, list[int]]:
        """Drafts for the decoding requests, at most `budget` tokens, within the slots left once every
        running request has its next token's and a prompt mid-prefill its next chunk's (evicting cached
        prefixes for drafts is not worth it)."""
        spare = self.pool.num_free - sum(r.seq_len - r.computed for r in active)
        if self.chunked is not None:
            spare -= min(self.chunked.seq_len - self.chunked.computed, budget)
        return self.drafter.drafts(decodes, min(spare, budget))

    def _admit(self, budget: int, num_decodes: int, reqs: list[Request], ext_lens: list[int],
               locs: list[torch.Tensor]) -> None:
        clip = self.cfg.max_tokens_clip
        # future tokens already promised: running requests' remaining output (scaled by the adaptive ratio)
        reserved = sum(min(r.remaining_tokens, clip) for r in self.running) * self.new_token_ratio
        # requests prefilling in this batch or in one still in flight (their prefix is not in the tree yet)
        in_progress = reqs[num_decodes:] + [
            o for b in self.flight.batches for o in b.reqs[b.num_decodes + b.num_jumps :]]
        shared: PrefixSet | None = None  # made when a request first needs the check
        for r in self._ordered_waiting():
            if r.inflight:
                continue  # retracted while its token was in flight: admitted once that token is known
            if budget <= 0 or self.req_pool.num_free == 0:
                break
            restored = self.kv.restore(r)  # (a disk tier's continuation of its cached prefix, into the tree)
            if not r.admitted_once:
                r.disk_tokens += restored
            # matched here, not in the ordering (which only measured, changing nothing): admitting the
            # requests before this one may have evicted part of what it saw
            prefix_slots, node = self.kv.match(r, touch=False)
            prefix = len(prefix_slots)
            # only a request with a long uncached part can share it with one in progress
            if self.tree.keeps_kv and r.seq_len - prefix > self.cfg.dedup_min_tokens:
                shared = shared if shared is not None else PrefixSet(in_progress)
                if shared.holds(r, prefix + self.cfg.dedup_min_tokens):
                    # another request in progress computes the same long prefix: wait, then reuse it
                    self.stats.deferred_by_dedup += 1
                    continue
            if node is not None:
                self.tree.lock(node)  # lock first: its own prefix must not count as evictable room
            uncached = r.seq_len - prefix
            future = min(r.remaining_tokens, clip) * self.new_token_ratio
            room = self.pool.num_free + self.tree.evictable_size - reserved
            if uncached + future > room:
                if node is not None:
                    self.tree.unlock(node)
                break  # keep the order: nothing behind a request that does not fit jumps it
            self.waiting.remove(r)
            if node is not None:
                self.tree.touch(node)  # admitted: now its prefix counts as used
                self.kv.write_through(node)  # (used again: worth keeping on disk, should the process die)
            self._start(r, prefix_slots, node)
            n = min(uncached, budget)
            locs.append(self.kv.place(r, n))
            reqs.append(r)
            ext_lens.append(n)
            self.running.append(r)
            in_progress.append(r)
            if shared is not None:
                shared.add(r)
            budget -= n
            reserved += (uncached - n) + future
            if n < uncached:
                self.chunked = r
                break

    def _ordered_waiting(self) -> list[Request]:
        waiting = list(self.waiting)
        if len(waiting) > self.cfg.lpm_max_queue:
            return waiting  # FCFS: matching every request costs more than it saves on long queues
        # how much of each is cached, measured without a split or an LRU use: waiting keeps nothing warm
        matched = {r.rid: self.tree.cached_length(r.all_ids, KVOwner.matchable_len(r), r.cache_ns) for r in waiting}
        return sorted(waiting, key=lambda r: -matched[r.rid])  # stable: FCFS among equals

    def _start(self, r: Request, prefix_slots: torch.Tensor, node) -> None:
        self.kv.start(r, prefix_slots, node)
        if not r.admitted_once:
            r.admitted_once = True
            r.usage.cached_tokens = min(len(prefix_slots), len(r.prompt_ids))
            r.usage.disk_cached_tokens = min(r.disk_tokens, r.usage.cached_tokens)
            r.cache_miss = self.kv.miss(r, len(prefix_slots))
            self.stats.prompt_tokens += len(r.prompt_ids)
            self.stats.cached_prompt_tokens += r.usage.cached_tokens

    def _make_room(self, active: list[Request]) -> list[Request]:
        """Evict, then retract the latest-admitted requests, until every running request has slots
        for the tokens it computes next.

        A prompt mid-prefill is not among them: its chunk takes what is left, and waits a step when
        nothing is (the decodes' next shortfall retracts one of them). Retracting it instead could
        admit it again while a pass in flight still computes its last chunk."""
        while active:
            short = sum(r.seq_len - r.computed for r in active) - self.pool.num_free
            if short > 0:
                self.tree.evict(short)
                short = sum(r.seq_len - r.computed for r in active) - self.pool.num_free
            if short <= 0:
                break
            self.retract(active.pop())  # the most recently admitted: least work lost
        return active

    def retract(self, r: Request) -> None:
        self.stats.retractions += 1
        self.running.remove(r)
        self.kv.release(r)
        self.waiting.appendleft(r)
        self.new_token_ratio = min(1.0, self.new_token_ratio + 0.1)

    # ---- after the forward pass -------------------------------------------------------------------

    def process(self, batch: ScheduledBatch, tokens: list[int], tokenizer, logprobs: list | None = None,
                after: ScheduledBatch | None = None, made: dict[int, list[int]] | None = None) -> list[Request]:
        """Advance each request by its computed tokens and sampled token (-1: the grammar allowed
        none; one per live sampling row), then append what its grammar forces next; returns the
        finished requests. `after` is the pass launched since (overlap): a request that finished
        here, or whose grammar forced tokens here, gets no token from it. `made`: for a sampling row
        whose request checked a draft, the tokens the pass made (the kept draft, then one more)."""
        self._retire(batch)
        self.stats.forward_passes += 1
        finished = []
        jumps_end = batch.num_decodes + batch.num_jumps
        k = -1
        for i, (r, n, samples) in enumerate(zip(batch.reqs, batch.extend_lens, batch.sampling)):
            k += samples
            if r.finished:
                continue  # aborted, or finished by the pass before this one (its memory is already free)
            draft = batch.drafts.get(i)
            if draft is not None:
                self._verified(r, draft, made[k])
            else:
                self.flight.computed(r, n)
            r.usage.forward_passes += 1
            if i < batch.num_decodes or draft is not None:
                self.stats.decode_tokens += 1
            elif i < jumps_end:
                self.stats.jump_forward_tokens_computed += n - 1
                self.stats.decode_tokens += 1
            else:
                self.stats.prefill_tokens_computed += n
            if samples:
                if not batch.live[k]:
                    continue  # its grammar forced tokens after the previous one: this sample is stale
                lps = (logprobs[k] if draft is not None else [logprobs[k]]) if logprobs else None
                self._take(r, made[k] if draft is not None else [tokens[k]], tokenizer, lps, after,
                           draft.forced if draft is not None else ())
                if draft is not None:
                    self._give_back_past_end(r)
            elif r.prefill_only and r.kv_len == r.seq_len:
                r.finish_reason = "stop"
            else:
                continue  # mid-prefill: the next chunk comes in a later step
            if r.finished:
                self._drop(r)
                finished.append(r)
                if self.drafter:
                    self.drafter.learn(r)
            elif i >= jumps_end and r.row is not None:
                self.kv.cache_prefix(r)  # share the prompt with requests that arrive from now on
        return finished

    def _verified(self, r: Request, draft: Draft, made: list[int]) -> None:
        """A pass checked r's last token and `draft`: the K/V of the last token and the kept draft
        tokens count; the slots of the rest are freed now. (The grammar's forced tokens in a draft
        count as jump-forward's, not as drafted.)"""
        kept = len(made) - 1
        self.flight.computed(r, 1 + kept)
        rejected = len(draft) - kept
        self.kv.give_back(r, r.kv_len, r.kv_len + rejected)
        r.pending -= rejected
        forced_kept = sum(1 for j in draft.forced if j < kept)
        self.stats.jump_forward_tokens_computed += forced_kept
        drafted, kept = len(draft) - len(draft.forced), kept - forced_kept
        self.drafter.verified(r, drafted, kept)
        r.usage.draft_tokens += drafted
        r.usage.accepted_draft_tokens += kept
        self.stats.draft_tokens += drafted
        self.stats.accepted_draft_tokens += kept

    def _give_back_past_end(self, r: Request) -> None:
        """A kept draft that held the request's end: the K/V computed for draft tokens after it goes
        back to the pool (after budget closing, all past where the closing text starts: the tokens the
        draft had there were taken back)."""
        end = len(r.all_ids) if r.closed_at is None else min(len(r.all_ids), r.closed_at)
        extra = r.kv_len - end
        if extra > 0:
            self.kv.give_back(r, end, r.kv_len)
            r.kv_len -= extra

    def _take(self, r: Request, made: list[int], tokenizer, logprobs: list | None, after: ScheduledBatch | None,
              forced: frozenset[int] | tuple = ()) -> None:
        """Append the tokens a pass made for r (its sampled token; after a draft, the kept draft
        tokens before it, of which those at `forced` are a forced run the grammar took as a whole)
        up to one that ends r (-1: the grammar allowed nothing), then the tokens the grammar forces
        after them. `logprobs`: the entry of each token made (None: none asked; forced ones get none)."""

        def advance() -> bool:
            j = 0
            while j < len(made):
                if j in forced:  # appended as jump-forward appends it: a run at once
                    end = next(e for e in range(j, len(made) + 1) if e not in forced)
                    r.append_forced(made[j:end], tokenizer)
                    j = end
                else:
                    if logprobs is not None and logprobs[j] is not None:
                        r.logprobs.append(logprobs[j])
                    if made[j] < 0:
                        r.end_at_dead_end(tokenizer)
                        return True
                    r.append_token(made[j], tokenizer)
                    j += 1
                if r.finished:
                    return True
            return r.jump_forward(tokenizer) > 0

        self.flight.take(r, after, advance)

    def fail(self, batch: ScheduledBatch, error: BaseException) -> list[Request]:
        """A pass that raised: its unfinished requests end with `error` and free their memory."""
        self._retire(batch)
        failed = [r for r in batch.reqs if not r.finished]
        for r in failed:
            r.error = error
            self.abort(r, "error")
        return failed

    def _retire(self, batch: ScheduledBatch) -> None:
        for row in self.flight.retire(batch):
            self.req_pool.free(row)

    def _drop(self, r: Request) -> None:
        if r in self.running:
            self.running.remove(r)
        elif r in self.waiting:  # retracted while its last token was in flight
            self.waiting.remove(r)
        self.kv.release(r)

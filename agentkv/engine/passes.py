"""Running scheduled passes: the forward pass and sampling, in step with the engine loop or overlapped.

A pass is launched (its inputs read from the scheduler's batch), planned (which sampling rows still
want a token, and their grammar masks), and collected (tokens, logprobs, scoring logits). Without
overlap, collecting runs the pass on the engine thread while the masks are filled on the mask
thread. With overlap, a worker thread runs the forward pass as soon as the pass is launched, while
the engine thread processes the previous pass's tokens and then plans this one: the worker waits
for the plan only before sampling. Passes run in launch order on the worker, so a pass reads the
K/V and sampled tokens of the pass before it, and slots freed by the host are written again only
by a later pass.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch

from agentkv.engine.batch import ScheduledBatch
from agentkv.engine.constrained import MaskWorker
from agentkv.engine.outputs import TokenLogprob
from agentkv.engine.runner import ForwardInputs, ModelRunner
from agentkv.engine.sampler import sample
from agentkv.engine.speculative import kept_prefix
from agentkv.engine.trace import phase


@dataclass
class Plan:
    live: list[bool]  # per sampling row of the batch: sample it
    masks: Future | None  # MaskWorker.start over the live rows' requests


@dataclass
class PassResult:
    tokens: list[int]  # per sampling row; -1 where the grammar allowed nothing; 0 for rows not live
    logprobs: list  # per sampling row, its TokenLogprob or None; a row that checked a draft: one per token made
    scores: list[float]  # the logprob of the token after each of the batch's score_positions
    made: dict[int, list[int]] = field(default_factory=dict)  # sampling row -> tokens made from its draft


@dataclass
class Pass:
    batch: ScheduledBatch
    inputs: ForwardInputs
    score_targets: list[int]  # the token after each of the batch's score_positions
    drafts: list[list[int]]  # per sampling row: the draft its request checks (mostly none)
    positions: list[int]  # per sampling row: where the token it makes goes in its request's sequence
    plan: Future = field(default_factory=Future)  # set by the engine thread: a Plan
    result: Future | None = None  # with overlap: the worker's PassResult


class PassRunner:
    def __init__(self, runner: ModelRunner, tokenizer: Any, vocab_size: int, overlap: bool,
                 worker: ThreadPoolExecutor | None = None):
        """`worker`: the forward thread for overlap when the caller made it (the model was built on it)."""
        self.runner, self.tokenizer, self.overlap = runner, tokenizer, overlap or worker is not None
        self.masks = MaskWorker(vocab_size)
        self._worker = worker or (ThreadPoolExecutor(1, thread_name_prefix="agentkv-forward") if overlap else None)
        self._prev_tokens: torch.Tensor | None = None  # worker state: the last pass's sampled tokens
        # told (requests, tokens computed, seconds) of each pass of running requests only (no prompt in it):
        # the drafter's PassCosts
        self.observe: Callable[[int, int, float], None] | None = None
        # on CUDA the passes run on a stream of their own: the host's work on the default stream
        # (e.g. grammar masks uploaded by the mask thread) never queues behind a pass
        self._stream = torch.cuda.Stream(runner.device) if str(runner.device).startswith("cuda") else None

    def launch(self, batch: ScheduledBatch) -> Pass:
        targets = [r.all_ids[pos + 1] for r, pos in batch.score_positions]
        sampling = [i for i, s in enumerate(batch.sampling) if s]
        drafts = [batch.drafts.get(i, []) for i in sampling]
        positions = [batch.starts[i] + batch.extend_lens[i] - len(d) for i, d in zip(sampling, drafts)]
        p = Pass(batch, self.runner.prepare(batch), targets, drafts, positions)
        if self._worker is not None:
            p.result = self._worker.submit(self._run, p)
        return p

    def plan(self, p: Pass) -> None:
        """Decide the rows to sample (a request that finished or jumped since it was scheduled wants
        none) and start their grammar masks."""
        reqs = p.batch.sampling_reqs
        live = [ok and not r.finished for ok, r in zip(p.batch.live, reqs)]
        p.plan.set_result(Plan(live, self.masks.start([r for ok, r in zip(live, reqs) if ok],
                                                      [d for ok, d in zip(live, p.drafts) if ok])))

    def collect(self, p: Pass) -> PassResult:
        """The pass's result (running it here without overlap). Raises what the pass raised."""
        if p.result is None:
            return self._run(p)
        return p.result.result()

    def drain(self, p: Pass) -> None:
        """Wait for a pass whose result is no longer wanted (the engine is failing or closing)."""
        if not p.plan.done():
            p.plan.set_result(Plan([False] * sum(p.batch.sampling), None))
        try:
            self.collect(p)
        except Exception:
            pass  # its requests are failed by the caller either way

    def _rescore(self, approx: torch.Tensor | None, logit_rows: list[int]):
        """sample's `rescore` for a pass whose logits were the int8 projection's (`approx`: its rows'
        normed states), its sampled rows being those `logit_rows` of them; None where they were exact."""
        if approx is None:
            return None
        return lambda rows, ids: self.runner.exact_logits(approx[[logit_rows[r] for r in rows]], ids)

    def _sample_drafts(self, p: Pass, logits: torch.Tensor, rows: list[int], allowed, approx) -> PassResult:
        """A pass in which requests check drafts (speculation, never with overlap): sampling row k
        has a logits row for its last token and one per draft token. Each row makes its token as
        any row does; the draft is kept as far as those tokens are the draft's."""
        reqs, n = p.batch.sampling_reqs, len(p.drafts)
        starts = [0]
        for d in p.drafts:
            starts.append(starts[-1] + 1 + len(d))
        index, row_reqs, row_drafts, row_positions, row_before, first = [], [], [], [], [], {}
        for k in rows:
            first[k], d = len(index), p.drafts[k]
            for j in range(1 + len(d)):
                index.append(starts[k] + j)
                row_reqs.append(reqs[k])
                row_drafts.append(d[j] if j < len(d) else -1)
                row_positions.append(p.positions[k] + j)
                row_before.append(d[:j])
        out = sample(logits[index], row_reqs, self.tokenizer, allowed, logits[starts[-1]:], p.score_targets,
                     row_positions, row_drafts, row_before, rescore=self._rescore(approx, index),
                     kernels=self.runner.kernels)
        tokens, logprobs, made = [0] * n, [None] * n, {}
        for k in rows:  # (a row the grammar allowed nothing makes -1: not a draft token)
            a, d = first[k], p.drafts[k]
            kept = kept_prefix(out.accepted[a : a + len(d)])
            made[k] = d[:kept] + [out.tokens[a + kept]]
            # a draft's row: the logprob entry of each token made (None where the request asked for none)
            tokens[k], logprobs[k] = made[k][-1], out.logprobs[a : a + kept + 1] if d else out.logprobs[a]
        return PassResult(tokens, logprobs, out.scores, made)

    def close(self) -> None:
        self.masks.close()
        if self._worker is not None:
            self._worker.shutdown(wait=True, cancel_futures=True)  # idle by now: the last pass was drained
        self.runner.close()

    def _run(self, p: Pass) -> PassResult:
        start = time.perf_counter()
        if self._stream is None:
            out = self._compute(p)
        else:
            with torch.cuda.stream(self._stream):
                out = self._compute(p)
        b = p.batch
        if self.observe is not None and b.num_decodes + b.num_jumps == len(b.reqs):
            self.observe(len(b.reqs), sum(b.extend_lens), time.perf_counter() - start)
        return out

    def _compute(self, p: Pass) -> PassResult:
        try:
            with phase("forward"):
                logits = self.runner.forward(p.inputs, self._prev_tokens)
            approx = self.runner.approx_rows  # (this pass's: the next forward runs after this returns)
        except BaseException:
            self._prev_tokens = None
            plan = p.plan.result()  # wait for the masks too: they read matchers the host moves next
            if plan.masks is not None:
                plan.masks.exception()
            raise
        with phase("masks"):  # (waits for the host's plan and the grammar masks it started)
            plan: Plan = p.plan.result()
            allowed = plan.masks.result() if plan.masks is not None else None
        rows = [k for k, ok in enumerate(plan.live) if ok]
        reqs = p.batch.sampling_reqs
        n = len(plan.live)
        if any(p.drafts):
            return self._sample_drafts(p, logits, rows, allowed, approx)
        live = logits[: len(rows)] if len(rows) == n else logits[rows]  # no copy when all are
        with phase("sample"):
            out = sample(live, [reqs[k] for k in rows], self.tokenizer, allowed, logits[n:], p.score_targets,
                         [p.positions[k] for k in rows], rescore=self._rescore(approx, rows),
                         kernels=self.runner.kernels)
        tokens = [0] * n
        logprobs: list[TokenLogprob | None] = [None] * n
        for k, t, e in zip(rows, out.tokens, out.logprobs):
            tokens[k], logprobs[k] = t, e
        if self.overlap:  # only a pass launched before this one was processed reads them (on the device)
            picked = out.on_device.clamp(min=0)
            if len(rows) < n:  # a row not live reads 0 (the pass that reads it throws its token away)
                index = torch.tensor(rows, dtype=torch.int64, device=logits.device)
                picked = torch.zeros(n, dtype=torch.int64, device=logits.device).index_put_((index,), picked)
            self._prev_tokens = picked
        return PassResult(tokens, logprobs, out.scores)

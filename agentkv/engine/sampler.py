"""Turn a batch of logits into one token per request, on the device, and read the result back once.

Everything a pass samples is computed where the logits are (penalties, grammar masks, filters,
noise, picks, logprobs, scores) and packed into one tensor that `read_host` copies to the host: the
one device-to-host read of a pass (tests/engine/test_device_reads.py holds the engine to it).

Noise is counter-based: the token at position t of a request's sequence races the exponential noise
-log(U), where U is SplitMix64 of a key made from (seed, t) and the token's index. The noise is a
function of the seed and the position alone (never of the batch, the row or the device), so a seed
reproduces an output whatever is batched beside it, and every row's noise is made in one vectorized
computation.

A row asked about a draft token d (speculative decoding, engine/speculative.py) keeps d when the
token it makes is d. With the race, that is the exact rule for a deterministic draft: d is kept with
probability p(d), and otherwise the token is the race's winner among the others, i.e. drawn from p
without d, renormalized. And it is the coupling under which a token is the same with or without the
draft: speculation changes no output, sampled or greedy.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from agentkv.engine.outputs import TokenLogprob
from agentkv.engine.penalties import apply_penalties
from agentkv.engine.request import Request
from agentkv.kernels.cpu_quant import RESCORE_TOP
from agentkv.kernels.token_mask import apply_token_bitmask

M64 = (1 << 64) - 1
GOLDEN, MIX1, MIX2 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
NOISE_CHUNK = 1 << 19  # noise elements made at a time (bounds the int64 temporaries)


def _signed(x: int) -> int:
    x &= M64
    return x - (1 << 64) if x >> 63 else x


def _mix64(z: int) -> int:
    """SplitMix64's finalizer, on Python ints."""
    z = ((z ^ (z >> 30)) * MIX1) & M64
    z = ((z ^ (z >> 27)) * MIX2) & M64
    return z ^ (z >> 31)


def noise_key(seed: int, position: int) -> int:
    """The key of the noise for the token at `position` of a request's sequence (a signed int64)."""
    return _signed(_mix64((_mix64(seed & M64) + position * GOLDEN) & M64))


def _shr(z: torch.Tensor, k: int) -> torch.Tensor:
    """Logical right shift of int64 (torch's >> is arithmetic)."""
    return (z >> k) & ((1 << (64 - k)) - 1)


def exponential_noise(keys: torch.Tensor, vocab: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """[len(keys), vocab] standard exponential noise: row i is SplitMix64's stream from keys[i]
    (int64, on the device the noise is wanted on), token v its (v + 1)-th value, 23 bits of it."""
    step = torch.arange(1, vocab + 1, dtype=torch.int64, device=keys.device) * _signed(GOLDEN)
    out = torch.empty(len(keys), vocab, dtype=dtype, device=keys.device)
    rows = max(1, NOISE_CHUNK // max(vocab, 1))
    for a in range(0, len(keys), rows):
        z = keys[a : a + rows, None] + step[None, :]
        z ^= _shr(z, 30)
        z *= _signed(MIX1)
        z ^= _shr(z, 27)
        z *= _signed(MIX2)
        z ^= _shr(z, 31)
        out[a : a + rows] = exponential_from_bits(_shr(z, 41), dtype)
    return out


def exponential_from_bits(bits: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """-log(U) for U = (bits + 0.5) / 2**23, `bits` in [0, 2**23): U is exact in float32 (whatever
    `dtype` the noise is wanted in) and strictly inside (0, 1), so the noise is finite and positive
    (a noise of 0 would turn a masked token's 0 / 0 into NaN, which argmax picks)."""
    return (-torch.log((bits.to(torch.float32) + 0.5) * 2.0 ** -23)).to(dtype)


@dataclass
class Sampled:
    tokens: list[int]  # per row; -1 where the grammar allowed nothing
    logprobs: list[TokenLogprob | None]  # per row, for requests that asked
    on_device: torch.Tensor  # the tokens [rows] where the logits are (what a pass in flight reads next)
    scores: list[float]  # logprob of each score target
    accepted: list[bool] = field(default_factory=list)  # per row, with drafts: its draft token is kept


def _draw(logits: torch.Tensor, reqs: Sequence[Request], rows: list[int], positions: Sequence[int]) -> torch.Tensor:
    """A sampled token for each of `rows` of `logits` (their requests `reqs`; `positions`: where in
    its sequence each row's token goes): tempered, filtered, and raced against the noise of the
    request's seed at that position."""
    index = torch.tensor(rows, dtype=torch.int64, device=logits.device)
    temps = torch.tensor([r.params.temperature for r in reqs], dtype=logits.dtype, device=logits.device)
    tempered = logits[index] / temps[:, None]
    filtered = [k for k, r in enumerate(reqs) if r.params.top_k or r.params.top_p < 1.0 or r.params.min_p > 0.0]
    if filtered:  # (every filtered row in one pass of batched ops: a loop made a sort and ~10 ops per row)
        at = torch.tensor(filtered, dtype=torch.int64, device=logits.device)
        tempered[at] = filter_rows(tempered[at], *zip(*((reqs[k].params.top_k, reqs[k].params.top_p,
                                                          reqs[k].params.min_p) for k in filtered)))
    probs = tempered.softmax(-1)
    keys = torch.tensor([noise_key(r.seed, pos) for r, pos in zip(reqs, positions)], dtype=torch.int64,
                        device=logits.device)
    return (probs / exponential_noise(keys, probs.shape[1], probs.dtype)).argmax(-1)


def filter_rows(logits: torch.Tensor, top_k: Sequence[int], top_p: Sequence[float],
                min_p: Sequence[float]) -> torch.Tensor:
    """Logits [n, V] with -inf outside each row's top-k, then nucleus, then min-p set (of the tempered
    distribution); a row's 0 / 1.0 / 0.0 turns its filter off. Row by row the same ops, so a row's set is
    the same whatever rows are beside it."""
    dev, vocab = logits.device, logits.shape[1]
    if any(0 < k < vocab for k in top_k):  # the k-th largest value stays, and every value equal to it
        ks = [k if 0 < k < vocab else vocab for k in top_k]
        kth = torch.topk(logits, max(ks)).values.gather(1, torch.tensor(ks, device=dev)[:, None] - 1)
        kth[torch.tensor([k == vocab for k in ks], device=dev)] = float("-inf")
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if any(p < 1.0 for p in top_p):
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True, stable=True)
        probs = sorted_logits.softmax(-1)
        # drop a token when the mass before it already reaches top_p (the top token always stays)
        limit = torch.tensor([p if p < 1.0 else float("inf") for p in top_p], dtype=probs.dtype, device=dev)
        drop = (probs.cumsum(-1) - probs) >= limit[:, None]
        logits = logits.masked_fill(torch.zeros_like(drop).scatter_(1, order, drop), float("-inf"))
    if any(m > 0.0 for m in min_p):
        probs = logits.softmax(-1)
        floor = torch.tensor(min_p, dtype=probs.dtype, device=dev)[:, None] * probs.max(-1, keepdim=True).values
        logits = logits.masked_fill(probs < floor, float("-inf"))
    return logits


def _filter(logits: torch.Tensor, top_k: int, top_p: float, min_p: float) -> torch.Tensor:
    """Logits [V] with -inf outside the top-k / nucleus / min-p set (filter_rows on one row)."""
    return filter_rows(logits[None], [top_k], [top_p], [min_p])[0]


def read_host(packed: torch.Tensor) -> list[float]:
    """The pass's one device-to-host read."""
    return packed.tolist()


def _rescored(masked: torch.Tensor, rows: list[int], rescore) -> torch.Tensor:
    """`masked` [n, V] (disallowed tokens -inf) with each row's RESCORE_TOP best allowed tokens exact."""
    top = masked.topk(min(RESCORE_TOP, masked.shape[1]), dim=-1)
    ids = torch.where(torch.isneginf(top.values), -1, top.indices)  # fewer allowed: the rest stay -inf
    exact = rescore(rows, ids)
    return masked.scatter(1, top.indices, torch.where(ids < 0, top.values, exact.to(masked.device)))


def _masked(logits: torch.Tensor, masks: tuple[list[int], torch.Tensor], rescore, kernels) -> tuple:
    """The batch's logits with the grammar's masks applied to their rows (the rest as they are), each
    masked row's RESCORE_TOP best allowed tokens re-scored where `rescore` is given, and the [B] bool
    tensor of rows that allow a token. With the native kernels (CPU) the mask and the best tokens are one
    C call a pass (NativeKernels.mask_logits); the torch ops are the same computation."""
    rows, bitmask = masks
    dev, every = logits.device, rows == list(range(logits.shape[0]))
    index = torch.tensor(rows, dtype=torch.int64, device=dev)
    if kernels is not None and dev.type == "cpu" and logits.dtype == torch.float32:
        masked = logits.clone() if every else logits[index]  # (a copy: the logits may be an inference tensor)
        rows_alive, ids, _ = kernels.mask_logits(masked, bitmask, RESCORE_TOP if rescore is not None else 0)
        if rescore is not None:
            at = (ids >= 0).nonzero(as_tuple=True)
            masked.index_put_((at[0], ids[at]), rescore(rows, ids)[at])
    else:
        masked, rows_alive = apply_token_bitmask(logits if every else logits[index], bitmask)
        if rescore is not None:
            masked = _rescored(masked, rows, rescore)
    if every:
        return masked, rows_alive.to(dev)
    alive = torch.ones(logits.shape[0], dtype=torch.bool, device=dev).index_put_((index,), rows_alive.to(dev))
    return logits.index_put((index,), masked), alive  # out of place: the logits may be an inference tensor


def sample(logits: torch.Tensor, reqs: Sequence[Request], tokenizer,
           masks: tuple[list[int], torch.Tensor] | None = None,
           score_logits: torch.Tensor | None = None, score_targets: Sequence[int] = (),
           positions: Sequence[int] | None = None, drafts: Sequence[int] | None = None,
           before: Sequence[list[int]] | None = None,
           rescore: Callable[[list[int], torch.Tensor], torch.Tensor] | None = None, kernels=None) -> Sampled:
    """One token per row of `logits` [B, V] (fp32), and its logprob entry for requests that asked;
    with `score_logits` [S, V], the logprob of each of `score_targets` under its row. The requests are
    not changed: the token and logprob are recorded when the pass is processed (with overlap that is
    later, on another thread).

    `masks` = (rows, bitmask [len(rows), ceil(V / 32)] int32): the grammar's allowed tokens for those
    rows; a row that allows no token gets -1. Logprobs are the model's, before the mask.

    `positions`: per row, where its token goes in its request's sequence (the noise's counter;
    default: right after the sequence). `drafts` (speculation): per row, the draft token that
    follows it in the pass, or -1; `accepted` says per row whether the token made is that draft token.
    `before` (speculation): per row, the draft tokens before it (the penalties count them).
    `rescore(rows, ids)`: the exact logits [len(rows), R] of tokens ids [len(rows), R] (-1: none),
    where `logits` are an int8 projection's whose rows' top logits alone are exact: after a grammar's
    mask, its rows' RESCORE_TOP best allowed tokens are re-scored, so the constrained choice is the
    exact logits' too. `kernels`: the native CPU kernels, which apply the masks in one call (`_masked`).
    """
    dev = logits.device
    if not reqs and not score_targets:
        return Sampled([], [], torch.empty(0, dtype=torch.int64, device=dev), [], [])
    lp_rows = [i for i, r in enumerate(reqs) if r.params.logprobs]
    raw_logprobs = logits[lp_rows].log_softmax(-1) if lp_rows else None
    if any(r.params.repetition_penalty != 1.0 or r.params.frequency_penalty or r.params.presence_penalty
           or r.params.logit_bias for r in reqs):
        logits = logits.clone()
        apply_penalties(logits, reqs, before)
    alive = None
    if masks is not None:
        logits, alive = _masked(logits, masks, rescore, kernels)
    # max(-1).indices: the same first index of the maximum as argmax, 3x faster on CPU (162 vs 524 us, 16 x 49k)
    picks = logits.max(-1).indices
    drawn = [i for i, r in enumerate(reqs) if not r.params.greedy]
    if drawn:  # the sampled rows together: one filter pass, one softmax, one noise, one argmax
        if positions is None:
            positions = [r.seq_len for r in reqs]
        picks = picks.index_put((torch.tensor(drawn, dtype=torch.int64, device=dev),),
                                _draw(logits, [reqs[i] for i in drawn], drawn, [positions[i] for i in drawn]))
    tokens = picks if alive is None else torch.where(alive, picks, -1)
    accepted = tokens == torch.tensor(drafts, dtype=torch.int64, device=dev) if drafts is not None else None

    # pack what the host needs into one tensor (float64 holds every token id exactly)
    parts = [tokens.to(torch.float64)]
    if accepted is not None:
        parts.append(accepted.to(torch.float64))
    top_k = max((reqs[i].params.top_logprobs for i in lp_rows), default=0)
    if raw_logprobs is not None:
        chosen = raw_logprobs.gather(1, tokens[lp_rows].clamp(min=0)[:, None])
        parts.append(chosen.to(torch.float64).flatten())
        if top_k:
            vals, ids = torch.topk(raw_logprobs, top_k)
            parts += [ids.to(torch.float64).flatten(), vals.to(torch.float64).flatten()]
    if score_targets:
        targets = torch.tensor(score_targets, dtype=torch.int64, device=dev)
        parts.append(score_logits.log_softmax(-1).gather(1, targets[:, None]).to(torch.float64).flatten())
    values = read_host(torch.cat(parts))

    B = len(reqs)
    out = [int(t) for t in values[:B]]
    at = B
    kept = [False] * B
    if accepted is not None:
        kept, at = [v > 0 for v in values[B : 2 * B]], 2 * B
    entries: list[TokenLogprob | None] = [None] * B
    if raw_logprobs is not None:
        chosen_lp, at = values[at : at + len(lp_rows)], at + len(lp_rows)
        n = len(lp_rows) * top_k
        top_ids, top_vals = values[at : at + n], values[at + n : at + 2 * n]
        at += 2 * n
        for j, i in enumerate(lp_rows):
            if out[i] < 0:
                continue
            k = reqs[i].params.top_logprobs
            top = [(int(t), _text(tokenizer, int(t)), v)
                   for t, v in zip(top_ids[j * top_k : j * top_k + k], top_vals[j * top_k : j * top_k + k])]
            entries[i] = TokenLogprob(out[i], _text(tokenizer, out[i]), chosen_lp[j], top)
    return Sampled(out, entries, tokens, values[at:], kept)


def _text(tokenizer, token: int) -> str:
    return tokenizer.decode([token], skip_special_tokens=False)

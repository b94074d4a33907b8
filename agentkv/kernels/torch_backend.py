"""The reference attention backend in plain torch: correct everywhere, the CPU path.

Decodes take one of two routes, chosen per pass:

- padded: each request's slots gathered into a padded [B, L] index, masked past its length;
- shared: when the decoding requests share KV (agents on one system prompt, `n` forks), the union
  of their slots is gathered once and every query attends to it through a membership mask. The
  shared prefix is then read once per layer instead of once per request.

A single decoding request whose slots are one run (a fresh pool hands slots out in order) reads its
K/V in place, without the gather.

Extends run one request at a time with a causal mask offset by the cached prefix.

A sliding window (a layer's `window`) masks keys more than `window - 1` positions before each query:
the masks of a window are made once per pass, on the first layer that has it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from agentkv.kernels.base import AttentionBackend, AttentionMetadata

# take the shared route when the union holds at most this share of the padded slot count
SHARED_MAX_RATIO = 0.5


class TorchAttentionBackend(AttentionBackend):
    name = "torch"

    def prepare(self, meta: AttentionMetadata) -> None:
        self.meta = meta
        nd = meta.num_decodes
        dev = meta.req_to_token.device
        self.shared_slots = self.decode_run = None
        self._windowed: dict[int, tuple] = {}  # window -> (decode mask, extend masks) of this pass
        if nd:
            lens = torch.tensor(meta.seq_lens[:nd], dtype=torch.int64, device=dev)
            max_len = max(meta.seq_lens[:nd])
            slots = meta.req_to_token[meta.req_rows[:nd], :max_len]  # [nd, L]
            pad = torch.arange(max_len, device=dev)[None, :] >= lens[:, None]
            self._lens, self._pad, self._inverse = lens, pad, None
            if nd > 1:
                unique, inverse = torch.unique(slots.masked_fill(pad, 0), return_inverse=True)
                if unique.numel() <= SHARED_MAX_RATIO * nd * max_len:
                    self._inverse = inverse
                    # mask [nd, U]: 0 where the union's slot belongs to the request, -inf elsewhere
                    mask = torch.full((nd, unique.numel()), float("-inf"), device=dev)
                    mask.scatter_(1, inverse, 0.0)
                    self._mask_padding_slot(unique, mask)
                    self.shared_slots, self.shared_mask = unique, mask
            if self.shared_slots is None:  # the padded route
                # past a request's length the table may hold slots not written yet (the next pass's,
                # with overlap): read slot 0 there, whose K/V is finite, since 0 * NaN under the mask is NaN
                self.decode_slots = slots.masked_fill(pad, 0)
                # additive mask: 0 where the slot belongs to the request, -inf past its length
                self.decode_mask = None
                if pad.any():
                    self.decode_mask = torch.zeros(nd, 1, 1, max_len, device=dev)
                    self.decode_mask.masked_fill_(pad[:, None, None, :], float("-inf"))
                elif nd == 1 and meta.req_to_token is meta.host_table:  # (on the CPU: reading it costs no sync)
                    run = meta.host_table[meta.rows()[0], :max_len]
                    if int(run[-1]) - int(run[0]) == max_len - 1 and bool((run[1:] - run[:-1] == 1).all()):
                        # one run of slots: 30 layers' two gathers less a step at batch 1 (~0.5 ms of 25, bf16)
                        self.decode_run = int(run[0])
        self.extends = self._plan_extends(meta, range(nd, len(meta.seq_lens)))

    @staticmethod
    def _plan_extends(meta: AttentionMetadata, requests) -> list:
        """(token offset, slots [S], extend_len, causal mask or None) for each of `requests` (indices)."""
        offsets = [0]
        for ext in meta.extend_lens:
            offsets.append(offsets[-1] + ext)
        plans = []
        for i in requests:
            seq, ext = meta.seq_lens[i], meta.extend_lens[i]
            slots = meta.req_to_token[meta.req_rows[i], :seq]
            mask = None
            if ext > 1:
                # new token j (position prefix + j) sees slots 0 .. prefix + j
                mask = torch.ones(ext, seq, dtype=torch.bool, device=slots.device).tril_(diagonal=seq - ext)
            plans.append((offsets[i], slots, ext, mask))
        return plans

    @staticmethod
    def _mask_padding_slot(unique: torch.Tensor, mask: torch.Tensor) -> None:
        # Padding positions were mapped to slot 0 and may have unmasked its column; slot 0 is never a
        # real slot (the pool reserves it), so mask its column for every request.
        mask.masked_fill_((unique == 0)[None, :], float("-inf"))

    def forward(self, q, k, v, k_cache, v_cache, scale, window=0, softcap=0.0, sinks=None):
        meta = self.meta
        k_cache.index_copy_(0, meta.out_cache_loc, k.to(k_cache.dtype))
        v_cache.index_copy_(0, meta.out_cache_loc, v.to(v_cache.dtype))
        T, H, D = q.shape
        nd = meta.num_decodes
        decoded = None
        decode_mask, extends = self._masks(window)
        if decode_mask is not None and decode_mask.dtype != q.dtype:
            decode_mask = self._cast_decode_mask(window, q.dtype)
        if nd and self.shared_slots is not None:
            decoded = self._decode_shared(q[:nd], k_cache, v_cache, scale, decode_mask, softcap, sinks)
        elif nd:
            nd_, L = self.decode_slots.shape
            if self.decode_run is not None:  # views of the pool: [1, KVH, L, D]; a window reads its last keys
                first = self.decode_run + (L - window if 0 < window < L else 0)
                kd = k_cache[first : self.decode_run + L].transpose(0, 1).unsqueeze(0)
                vd = v_cache[first : self.decode_run + L].transpose(0, 1).unsqueeze(0)
            else:
                flat = self.decode_slots.reshape(-1)  # index_select: ~2.5x faster than advanced indexing here
                kd = k_cache.index_select(0, flat).view(nd_, L, *k_cache.shape[1:]).transpose(1, 2)  # [nd, KVH, L, D]
                vd = v_cache.index_select(0, flat).view(nd_, L, *v_cache.shape[1:]).transpose(1, 2)
            # The query heads sharing a KV head attend as that head's G queries (one position, so no
            # causal mask among them): [nd, KVH, G, D]. Measured for 16 requests of 100 tokens: 66 us
            # against 110 for one query per head with enable_gqa.
            kvh = k_cache.shape[1]
            qd = q[:nd].reshape(nd, kvh, H // kvh, D)
            if softcap or sinks is not None:  # (SDPA has no soft cap, nor sinks)
                sink = None if sinks is None else sinks.view(kvh, H // kvh)[None, :, :, None]
                o = _manual(qd, kd.to(q.dtype), vd.to(q.dtype), scale, softcap, decode_mask, sink)
            else:
                o = F.scaled_dot_product_attention(qd, kd.to(q.dtype), vd.to(q.dtype), attn_mask=decode_mask,
                                                   scale=scale)
            decoded = o.reshape(nd, H, D)
        if not extends:  # a decode-only pass: no output buffer to copy into
            return decoded.reshape(T, H * D)
        out = torch.empty(T, H, D, dtype=q.dtype, device=q.device)
        if decoded is not None:
            out[:nd] = decoded
        self._attend_extends(q, k_cache, v_cache, scale, out, extends, softcap, sinks)
        return out.reshape(T, H * D)

    # ---- sliding windows ------------------------------------------------------------------------------

    def _masks(self, window: int) -> tuple:
        """(the decodes' mask, the extends' plans) for `window` (0: the pass's own, unwindowed)."""
        if not window:
            return (self.shared_mask if self.shared_slots is not None else self.decode_mask
                    if self.meta.num_decodes else None), self.extends
        if window not in self._windowed:
            self._windowed[window] = (self._window_decode_mask(window), self._window_extends(window))
        return self._windowed[window]

    def _cast_decode_mask(self, window: int, dtype) -> torch.Tensor:
        """The decodes' mask in the scores' dtype, cast once per pass, not once per layer."""
        if not window and self.shared_slots is not None:
            self.shared_mask = self.shared_mask.to(dtype)
            return self.shared_mask
        if not window:
            self.decode_mask = self.decode_mask.to(dtype)
            return self.decode_mask
        mask, extends = self._windowed[window]
        self._windowed[window] = (mask.to(dtype), extends)
        return self._windowed[window][0]

    def _window_decode_mask(self, window: int):
        """The decodes' mask with keys before each request's last `window` masked too."""
        nd = self.meta.num_decodes
        if not nd:
            return None
        lens, pad = self._lens, self._pad
        old = torch.arange(pad.shape[1], device=pad.device)[None, :] < (lens[:, None] - window)
        if self.shared_slots is not None:  # membership in the union, of the slots inside the window
            seen = torch.zeros(pad.shape, device=pad.device).masked_fill_(pad | old, float("-inf"))
            mask = torch.full(self.shared_mask.shape, float("-inf"), device=pad.device)
            mask.scatter_reduce_(1, self._inverse, seen, reduce="amax")  # 0 where any position inside has the slot
            self._mask_padding_slot(self.shared_slots, mask)
            return mask
        if self.decode_run is not None:  # read in place from the window's first key on: no mask
            return None
        hidden = pad | old
        if not hidden.any():
            return self.decode_mask
        mask = torch.zeros(nd, 1, 1, pad.shape[1], device=pad.device)
        return mask.masked_fill_(hidden[:, None, None, :], float("-inf"))

    def _window_extends(self, window: int) -> list:
        """The extends' plans with each new token's keys limited to its last `window` positions."""
        plans = []
        for offset, slots, ext, mask in self.extends:
            seq = slots.shape[0]
            if seq > window:
                # new token j (position seq - ext + j) sees positions seq - ext + j - window + 1 .. seq - ext + j
                causal = mask if mask is not None else torch.ones(ext, seq, dtype=torch.bool, device=slots.device)
                mask = causal & torch.ones_like(causal).triu_(diagonal=seq - ext - window + 1)
            plans.append((offset, slots, ext, mask))
        return plans

    def _attend_extends(self, q, k_cache, v_cache, scale, out, extends, softcap=0.0, sinks=None) -> None:
        """Fills out [T, H, D] at the tokens of `extends`, one SDPA call per request."""
        for offset, slots, ext, mask in extends:
            qe = q[offset : offset + ext].transpose(0, 1).unsqueeze(0)  # [1, H, ext, D]
            ke = k_cache.index_select(0, slots).transpose(0, 1).unsqueeze(0).to(q.dtype)  # [1, KVH, S, D]
            ve = v_cache.index_select(0, slots).transpose(0, 1).unsqueeze(0).to(q.dtype)
            if softcap or sinks is not None:
                g = qe.shape[1] // ke.shape[1]
                additive = (
                    None if mask is None else torch.zeros(mask.shape, dtype=q.dtype).masked_fill_(~mask, float("-inf")))
                sink = None if sinks is None else sinks.view(1, -1, 1, 1)
                o = _manual(qe, ke.repeat_interleave(g, 1), ve.repeat_interleave(g, 1), scale, softcap, additive, sink)
            else:
                o = F.scaled_dot_product_attention(qe, ke, ve, attn_mask=mask, scale=scale, enable_gqa=True)
            out[offset : offset + ext] = o[0].transpose(0, 1)

    def _decode_shared(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, scale: float,
                       mask: torch.Tensor, softcap: float = 0.0, sinks: torch.Tensor | None = None) -> torch.Tensor:
        B, H, D = q.shape
        kvh = k_cache.shape[1]
        g = H // kvh
        ku = k_cache.index_select(0, self.shared_slots).to(q.dtype).permute(1, 2, 0)  # [KVH, D, U]
        vu = v_cache.index_select(0, self.shared_slots).to(q.dtype).transpose(0, 1)  # [KVH, U, D]
        qg = q.view(B, kvh, g, D).permute(1, 0, 2, 3).reshape(kvh, B * g, D)  # [KVH, B*G, D]
        scores = torch.bmm(qg, ku).mul_(scale).view(kvh, B, g, -1)  # [KVH, B, G, U]
        if softcap:
            scores = torch.tanh(scores / softcap) * softcap
        scores += mask[None, :, None, :]
        probs = _softmax(scores, None if sinks is None else sinks.view(kvh, 1, g, 1)).reshape(kvh, B * g, -1)
        o = torch.bmm(probs, vu)  # [KVH, B*G, D]
        return o.view(kvh, B, g, D).permute(1, 0, 2, 3).reshape(B, H, D)


def _manual(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, softcap: float,
            mask: torch.Tensor | None, sink: torch.Tensor | None = None) -> torch.Tensor:
    """Attention with Gemma 2's soft cap on the scores (0: none) or gpt-oss's sinks: q [..., M, D], k and
    v [..., S, D] (heads matched), `mask` additive (-inf where hidden) broadcasting to [..., M, S],
    `sink` each head's logit broadcasting to [..., M, 1]."""
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    if softcap:
        scores = torch.tanh(scores / softcap) * softcap
    if mask is not None:
        scores = scores + mask
    return torch.matmul(_softmax(scores, sink), v)


def _softmax(scores: torch.Tensor, sink: torch.Tensor | None) -> torch.Tensor:
    """softmax over the last dim; with `sink` (broadcasting to [..., 1]), one more logit in each sum
    that no value follows (gpt-oss's attention sinks), dropped after."""
    if sink is None:
        return scores.softmax(-1)
    whole = torch.cat([scores, sink.to(scores.dtype).expand(*scores.shape[:-1], 1)], dim=-1)
    return whole.softmax(-1)[..., :-1]

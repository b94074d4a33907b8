"""What passes in flight owe the host: overlap scheduling's bookkeeping, in one place.

With overlap, pass n+1 is scheduled and launched before pass n's tokens are known, so the host
keeps, until a pass is processed:
- per request, `pending`: slots placed for its new tokens in passes not yet processed (they count
  in `computed`, not yet in `kv_len`), and `inflight`: tokens sampled for it by those passes (they
  count in `seq_len`; their ids are not known yet);
- per batch, `placeholders`: new tokens whose id a pass in flight samples, by that pass's sampling
  row (the forward pass reads them on the device, `PassRunner._prev_tokens`), and `live`: whether
  each sampling row's token is still wanted (not when the request finished, or its grammar forced
  tokens, after the pass was launched);
- slot-table rows released while a pass in flight still reads them, freed when it is processed.

The scheduler calls `launch` when it builds a batch, `computed` / `take` / `retire` when a pass
is processed, and `pending_slots` / `hold_row` when it releases a request.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agentkv.engine.batch import ScheduledBatch
    from agentkv.engine.request import Request


class InFlight:
    def __init__(self):
        self.batches: list[ScheduledBatch] = []  # scheduled and not yet processed, in launch order
        self.held_rows: list[tuple[int, int]] = []  # (row, launch seq) freed once that pass is processed
        self._launched = 0

    def launch(self, batch: ScheduledBatch) -> None:
        """Fix what the pass computes and count it as in flight on its requests."""
        self._launched += 1
        batch.seq = self._launched
        batch.starts = [r.computed for r in batch.reqs]
        # (a draft's tokens are input the pass checks: not part of the sequence)
        lens = [n - len(batch.drafts.get(i, ())) for i, n in enumerate(batch.extend_lens)]
        batch.sampling = [s + n == r.seq_len and not r.prefill_only for r, s, n in zip(batch.reqs, batch.starts, lens)]
        k = 0
        for i, (r, n, samples) in enumerate(zip(batch.reqs, batch.extend_lens, batch.sampling)):
            if r.computed + lens[i] > len(r.prompt_ids) + len(r.output_ids):
                batch.placeholders.append((i, r.future_row))  # its last input token is still being sampled
            r.pending += n
            if samples:
                r.inflight += 1
                r.future_row = k
                k += 1
        batch.live = [True] * k
        self.batches.append(batch)

    def computed(self, r: Request, n: int) -> None:
        """A processed pass computed n of r's tokens: their slots hold K/V now."""
        if r.row is not None:  # not retracted since
            r.kv_len += n
            r.pending -= n

    def take(self, r: Request, after: ScheduledBatch | None, advance: Callable[[], bool]) -> None:
        """r's oldest token in flight is known: `advance()` appends it (and whatever its grammar
        forces after it) and says whether that finished r or forced tokens. Then a token r has in
        `after` (the pass launched since) is stale: its row is marked not live."""
        r.inflight -= 1
        ahead, r.inflight = r.inflight, 0  # a token the next pass samples is not part of the text yet
        moved = advance()
        if ahead and moved:
            assert after is not None, "a token in flight belongs to the pass launched after this one"
            after.live[after.sampling_reqs.index(r)] = False  # its K/V for this token still counts
        else:
            r.inflight = ahead

    def retire(self, batch: ScheduledBatch) -> list[int]:
        """The pass has been processed, or has failed (perhaps after it was retired, while being
        processed): the rows released while it was in flight, free now."""
        if batch not in self.batches:
            return []
        self.batches.remove(batch)
        free = [row for row, seq in self.held_rows if seq <= batch.seq]
        self.held_rows = [(row, seq) for row, seq in self.held_rows if seq > batch.seq]
        return free

    def pending_slots(self, r: Request) -> tuple[int, int]:
        """(start, count) of r's slots placed for passes not processed; they are r's no longer."""
        start, n = r.kv_len, r.pending
        r.pending = 0
        return start, n

    def hold_row(self, row: int) -> bool:
        """A released request's slot-table row, which a pass in flight may still read: held until
        that pass is processed (True), or free now (False)."""
        if self.batches:
            self.held_rows.append((row, self.batches[-1].seq))
        return bool(self.batches)

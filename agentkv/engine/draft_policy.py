"""How long a draft is worth: measured pass costs against measured acceptance, so that a draft never makes
a step slower on average.

A draft of L tokens makes the pass that checks it compute L more tokens. Where a pass is bound by
reading the weights (a GPU, a large model) that costs little; on a CPU with a small model each written
token is its own int8 product and attention, about a quarter of a decode pass each on the embedded
model (benchmarks/speculative.py --by-pass), so a draft token the model then rejects is a quarter of a
pass lost. The policy measures both sides:

- `PassCosts`: from the engine's passes of running requests only, the seconds of a pass without
  drafts by batch size, and what each token a pass computes past one a request adds, as a share of
  that (`token_cost`);
- `Acceptance`: per draft source (radix, own, shared), the share of the draft tokens checked that were
  kept, counting the tokens up to the first rejected one (later ones were never in question), from a
  hopeful prior, older drafts fading;

and `best_length` takes the length L that maximizes the tokens a pass is expected to make over what
it costs: (1 + sum over j <= L of P(the first j kept)) / (1 + token_cost * L), none where no length
beats a plain decode step.
"""

from __future__ import annotations

from collections.abc import Sequence

FADE = 0.98  # each new observation's weight against the ones before (about the last 50 count)
# before a source's drafts are measured: 3 kept of 4 tried, so that first drafts are about as long as the
# request's limit allows and the measurements come from drafts of every length
PRIOR_KEPT, PRIOR_TRIED = 3.0, 4.0
DEFAULT_TOKEN_COST = 0.1  # a computed token's cost in decode passes before any pass was measured


def _ewma(old: float | None, new: float) -> float:
    return new if old is None else FADE * old + (1 - FADE) * new


class PassCosts:
    """What a token a pass computes past one per request costs, as a share of a pass without them."""

    def __init__(self):
        self.decode: dict[int, float] = {}  # batch size -> seconds of a pass that computes a token a request
        self.extra: float | None = None  # EWMA of (seconds past the decode pass per extra token) / decode seconds

    def observe(self, requests: int, tokens: int, seconds: float) -> None:
        """A pass of `requests` running requests (no prompt in it) that computed `tokens` tokens."""
        if tokens <= requests:
            self.decode[requests] = _ewma(self.decode.get(requests), seconds)
            return
        base = self.decode.get(requests)
        if base:
            self.extra = _ewma(self.extra, max(0.0, seconds - base) / (tokens - requests) / base)

    @property
    def token_cost(self) -> float:
        return DEFAULT_TOKEN_COST if self.extra is None else self.extra


class Acceptance:
    """Per draft source, how likely each draft token is kept given those before it were."""

    def __init__(self):
        self._kept: dict[str, float] = {}
        self._tried: dict[str, float] = {}

    def rate(self, source: str) -> float:
        return (self._kept.get(source, 0.0) + PRIOR_KEPT) / (self._tried.get(source, 0.0) + PRIOR_TRIED)

    def observe(self, source: str, drafted: int, kept: int) -> None:
        """A draft of `drafted` tokens from `source` of which the first `kept` were kept."""
        if drafted <= 0:
            return
        tried = kept + (kept < drafted)
        self._kept[source] = self._kept.get(source, 0.0) * FADE ** tried + kept
        self._tried[source] = self._tried.get(source, 0.0) * FADE ** tried + tried


def best_length(accept: Sequence[float], token_cost: float) -> int:
    """The draft length (0 to len(accept)) that maximizes the tokens a pass makes per its cost, where
    accept[j] is the chance that draft token j is kept given that those before it were."""
    best, best_rate, made, chance = 0, 1.0, 1.0, 1.0
    for j, a in enumerate(accept, 1):
        chance *= a
        made += chance
        rate = made / (1.0 + token_cost * j)
        if rate > best_rate:
            best, best_rate = j, rate
    return best

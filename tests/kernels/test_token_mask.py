"""Grammar masks on logits: the native kernel (NativeKernels.mask_logits, both bodies) against a brute
force over the tokens and against the torch ops it replaces, and the sampler's constrained choice the
same with the kernel and without it."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import agentkv as ak
from agentkv.engine.request import Request
from agentkv.engine.sampler import sample
from agentkv.kernels import cpu_native
from agentkv.kernels.cpu_quant import RESCORE_TOP
from agentkv.kernels.token_mask import apply_token_bitmask

kernels = cpu_native.load()
pytestmark = pytest.mark.skipif(
    kernels is None, reason=f"native CPU kernels unavailable: {cpu_native.unavailable_reason()}")
NEG = float("-inf")


def brute_force(logits: torch.Tensor, bitmask: torch.Tensor, k: int):
    """Token by token: -inf where the bit is 0, alive where a token below V is allowed, the k best
    allowed above -inf by (value descending, id ascending), padded with -1 / -inf."""
    n, V = logits.shape
    out, alive, ids, vals = logits.clone(), [], [], []
    for r in range(n):
        allowed = [t for t in range(V) if (int(bitmask[r, t // 32]) >> (t % 32)) & 1]
        for t in set(range(V)) - set(allowed):
            out[r, t] = NEG
        alive.append(bool(allowed))
        best = sorted((t for t in allowed if logits[r, t] > NEG), key=lambda t: (-float(logits[r, t]), t))[:k]
        ids.append(best + [-1] * (k - len(best)))
        vals.append([float(logits[r, t]) for t in best] + [NEG] * (k - len(best)))
    ids_t, vals_t = torch.tensor(ids, dtype=torch.int64).reshape(n, k), torch.tensor(vals).reshape(n, k)
    return out, torch.tensor(alive), ids_t, vals_t


WORD = st.one_of(st.sampled_from([0, -1, 1, -(2 ** 31), 2 ** 31 - 1]), st.integers(-(2 ** 31), 2 ** 31 - 1))


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 3), st.integers(1, 200), st.sampled_from([0, 1, 5, 32]), st.data())
@pytest.mark.parametrize("generic", [False, True])
def test_the_kernel_equals_a_brute_force(generic, n, V, k, data):
    W = (V + 31) // 32
    # few distinct values (ties between tokens) and some -inf (a token the penalties or a bias ruled out)
    values = data.draw(st.lists(st.sampled_from([NEG, -2.0, -0.5, 0.0, 0.5, 1.0, 3.0]), min_size=n * V,
                                max_size=n * V))
    logits = torch.tensor(values).reshape(n, V)
    bitmask = torch.tensor(data.draw(st.lists(WORD, min_size=n * W, max_size=n * W)), dtype=torch.int32).reshape(n, W)
    want, want_alive, want_ids, want_vals = brute_force(logits, bitmask, k)
    got = logits.clone()
    alive, ids, vals = kernels.mask_logits(got, bitmask, k, generic=generic)
    assert torch.equal(got, want)
    assert torch.equal(alive, want_alive)
    assert torch.equal(ids, want_ids) and torch.equal(vals, want_vals)
    torch_masked, torch_alive = apply_token_bitmask(logits, bitmask)  # the ops the kernel replaces
    assert torch.equal(got, torch_masked) and torch.equal(alive, torch_alive)


@pytest.mark.parametrize("generic", [False, True])
def test_a_vocabulary_sized_row_keeps_the_torch_ops_top_tokens(generic):
    g = torch.Generator().manual_seed(3)
    V = 49155  # (a last word of 3 tokens)
    logits = torch.randn(4, V, generator=g)
    dense = torch.rand(4, (V + 31) // 32 * 32, generator=g) < torch.tensor([[0.0], [0.002], [0.3], [1.0]])
    words = (dense.view(4, -1, 32).to(torch.int64) << torch.arange(32)).sum(-1)
    bitmask = torch.where(words >= 2 ** 31, words - 2 ** 32, words).to(torch.int32)
    got = logits.clone()
    alive, ids, _ = kernels.mask_logits(got, bitmask, RESCORE_TOP, generic=generic)
    masked, torch_alive = apply_token_bitmask(logits, bitmask)
    top = masked.topk(RESCORE_TOP, dim=-1)
    assert torch.equal(got, masked) and torch.equal(alive, torch_alive)
    assert torch.equal(ids, torch.where(torch.isneginf(top.values), -1, top.indices))


def _requests(temperatures: list[float]) -> list[Request]:
    return [Request([1], ak.SamplingParams(max_tokens=4, temperature=t, seed=i), i, frozenset(), 4)
            for i, t in enumerate(temperatures)]


@pytest.mark.parametrize("masked_rows", [[0, 1, 2, 3], [1, 3]])
def test_the_sampler_makes_the_same_tokens_with_the_kernel(masked_rows):
    """Constrained rows of an int8 projection's logits: the masks and the re-score of the best allowed
    tokens through the kernel give the tokens the torch ops give, greedy and sampled."""
    g = torch.Generator().manual_seed(7)
    V = 3000
    approx = torch.randn(4, V, generator=g) * 4
    exact = approx + torch.randn(4, V, generator=g) * 3  # what the re-score computes (far from approx: it decides)
    bits = torch.rand(len(masked_rows), (V + 31) // 32 * 32, generator=g) < 0.05
    bits[-1] = False  # a row whose grammar allows nothing makes -1
    words = (bits.view(len(masked_rows), -1, 32).to(torch.int64) << torch.arange(32)).sum(-1)
    bitmask = torch.where(words >= 2 ** 31, words - 2 ** 32, words).to(torch.int32)
    calls = []

    def rescore(rows, ids):
        calls.append(ids)
        picked = exact[torch.tensor(rows)].gather(1, ids.clamp(min=0))
        return torch.where(ids < 0, NEG, picked)

    runs = []
    for with_kernel in (False, True):
        reqs = _requests([0.0, 0.0, 1.0, 0.7])
        out = sample(approx, reqs, None, (masked_rows, bitmask), positions=[5] * 4, rescore=rescore,
                     kernels=kernels if with_kernel else None)
        runs.append(out.tokens)
    assert runs[0] == runs[1]
    assert runs[1][masked_rows[-1]] == -1
    assert any((ids >= 0).any() for ids in calls)

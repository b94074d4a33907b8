"""Triton kernels against the torch reference, in interpreter mode on CPU (TRITON_INTERPRET=1, set in
conftest.py before triton is imported), or compiled on a GPU (inputs drawn on the CPU, then moved).
Fresh random inputs: ragged lengths, prefix hits, several GQA ratios, fp32 and bf16, a head size that
is not a power of two; outputs are poisoned (NaN) before each run so an element a kernel never writes
fails the comparison.
"""

from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("triton")
if os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available():
    pytest.skip("triton was imported without TRITON_INTERPRET=1 and there is no GPU", allow_module_level=True)

from agentkv.errors import RequestError  # noqa: E402
from agentkv.kernels import get_backend  # noqa: E402
from agentkv.kernels.base import AttentionMetadata  # noqa: E402
from agentkv.kernels.registry import auto_backend  # noqa: E402
from agentkv.kernels.token_mask import apply_token_bitmask, unpack_bitmask  # noqa: E402
from agentkv.kernels.triton_decode import decode_attention  # noqa: E402
from agentkv.kernels.triton_extend import extend_attention  # noqa: E402
from agentkv.kernels.triton_small import apply_token_bitmask_inplace, store_kv  # noqa: E402
from tests.kernels.test_attention import reference  # noqa: E402

DTYPES = [torch.float32, torch.bfloat16]
DEV = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"  # where the kernels run


def tol(dtype):
    return {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 2e-2}


def random_batch(g, lens, kv_heads, D, dtype, num_slots=600, max_ctx=256):
    """Caches with random contents and a slot table: request i owns lens[i] random distinct slots;
    the first two requests share their first 20 slots (a prefix hit)."""
    k_cache = torch.randn(num_slots, kv_heads, D, generator=g).to(dtype)
    v_cache = torch.randn(num_slots, kv_heads, D, generator=g).to(dtype)
    free = (torch.randperm(num_slots - 1, generator=g) + 1).tolist()
    table = torch.zeros(len(lens) + 2, max_ctx, dtype=torch.int64)
    shared = [free.pop() for _ in range(20)]
    for i, n in enumerate(lens):
        slots = (shared[:min(n, 20)] if i < 2 else []) + [free.pop() for _ in range(n - (min(n, 20) if i < 2 else 0))]
        table[i + 1, :n] = torch.tensor(slots)  # row 0 left unused: rows need not start at 0
    return k_cache.to(DEV), v_cache.to(DEV), table.to(DEV), torch.arange(1, len(lens) + 1, device=DEV)


@pytest.mark.parametrize("dtype", DTYPES)
def test_triton_store_kv_writes_exactly_the_new_slots(dtype):
    g = torch.Generator().manual_seed(1)
    T, kvh, D = 7, 3, 20
    fused = torch.randn(T, 2 * kvh + 1, D, generator=g).to(DEV, dtype)  # the model runs in the cache dtype
    k, v = fused[:, :kvh], fused[:, kvh:2 * kvh]  # views with a row stride wider than the row
    k_cache = torch.full((50, kvh, D), float("nan"), dtype=dtype, device=DEV)
    v_cache = k_cache.clone()
    loc = (torch.randperm(49, generator=g)[:T] + 1).to(DEV)
    store_kv(k, v, k_cache, v_cache, loc)
    assert torch.equal(k_cache[loc], k.to(dtype)) and torch.equal(v_cache[loc], v.to(dtype))
    others = torch.ones(50, dtype=torch.bool, device=DEV)
    others[loc] = False
    assert k_cache[others].isnan().all() and v_cache[others].isnan().all()


@pytest.mark.parametrize("dtype", DTYPES)
def test_triton_bitmask_apply_matches_reference(dtype):
    g = torch.Generator().manual_seed(2)
    B, V = 3, 1000  # not a multiple of 32: the last word is partly outside the vocabulary
    logits = torch.randn(B, V, generator=g).to(DEV, dtype)
    bitmask = torch.randint(-2**31, 2**31 - 1, (B, (V + 31) // 32), generator=g, dtype=torch.int64).to(DEV, torch.int32)
    bitmask[2] = 0  # a row that allows nothing
    expected, alive = apply_token_bitmask(logits, bitmask)
    out = logits.clone()
    apply_token_bitmask_inplace(out, bitmask, block=256)
    assert torch.equal(out, expected)
    assert alive.tolist() == unpack_bitmask(bitmask, V).any(-1).tolist() == [True, True, False]


@pytest.mark.parametrize("sinks", [False, True], ids=["", "sinks"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (6, 2), (8, 1), (32, 2)])
def test_triton_decode_matches_reference(dtype, heads, kv_heads, sinks, grouped=None, num_splits=5, block_n=8,
                                         window=0):
    """(With gpt-oss's sinks: added once, in the merge of the splits.) GQA takes the grouped kernel, a
    group padded to 16 rows (3, 8) or filling them (16). Each request's keys are cut into `num_splits`
    runs of whole tiles by its own length: 70 keys into 5 of 16, 3 keys into one run and 4 empty ones."""
    g = torch.Generator().manual_seed(heads + kv_heads)
    D = 24
    lens = [45, 3, 70, 17]
    k_cache, v_cache, table, rows = random_batch(g, lens, kv_heads, D, dtype)
    q = torch.randn(len(lens), heads, D, generator=g).to(DEV, dtype)
    out = torch.full_like(q, float("nan"))
    sink = (torch.randn(heads, generator=g) * 2).to(DEV) if sinks else None
    # (the bound a CUDA graph passes, past every length: the splits follow each request's own length)
    decode_attention(q, k_cache, v_cache, table, rows, torch.tensor(lens, device=DEV), 200, D**-0.5, out=out,
                     num_splits=num_splits, block_n=block_n, sinks=sink, grouped=grouped, window=window)
    for i, n in enumerate(lens):
        seen = min(n, window) if window else n  # a window: the query's last `window` keys
        slots = table[rows[i], n - seen:n]
        expected = reference(q[i:i + 1].float(), k_cache[slots].float(), v_cache[slots].float(), D**-0.5, seen - 1,
                             sink)
        torch.testing.assert_close(out[i:i + 1].float(), expected, **tol(dtype))


@pytest.mark.parametrize("grouped", [None, False], ids=["grouped", "per-head"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_triton_decode_tiles_a_split(dtype, grouped):
    """Several tiles of keys a split (the online softmax's rescaling), both stage-1 kernels on GQA: 70 keys
    in 2 splits of 48 (3 tiles of 16)."""
    test_triton_decode_matches_reference(dtype, 6, 2, True, grouped=grouped, num_splits=2, block_n=16)


@pytest.mark.parametrize("grouped", [None, False], ids=["grouped", "per-head"])
def test_triton_decode_window_splits(grouped):
    """A sliding window's 20 keys cut into the splits (not the whole sequence: most splits would be empty)."""
    test_triton_decode_matches_reference(torch.float32, 6, 2, False, grouped=grouped, num_splits=3, window=20)


@pytest.mark.parametrize("sinks", [False, True], ids=["", "sinks"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (6, 2)])
def test_triton_extend_matches_reference(dtype, heads, kv_heads, sinks):
    g = torch.Generator().manual_seed(10 + heads)
    D = 24
    lens, exts = [60, 41, 9], [40, 17, 9]  # a prefix hit, a shorter one, and no prefix at all
    k_cache, v_cache, table, rows = random_batch(g, lens, kv_heads, D, dtype)
    T = sum(exts)
    q = torch.randn(T, heads, D, generator=g).to(DEV, dtype)
    out = torch.full_like(q, float("nan"))
    starts = torch.tensor([0, exts[0], exts[0] + exts[1]], device=DEV)
    sink = (torch.randn(heads, generator=g) * 2).to(DEV) if sinks else None
    extend_attention(q, k_cache, v_cache, out, table, rows, torch.tensor(lens, device=DEV),
                     torch.tensor(exts, device=DEV), starts,
                     max(exts), D**-0.5, block_m=16, block_n=16, sinks=sink)
    for i, (n, e) in enumerate(zip(lens, exts)):
        slots = table[rows[i], :n]
        s = int(starts[i])
        expected = reference(q[s:s + e].float(), k_cache[slots].float(), v_cache[slots].float(), D**-0.5, n - e,
                             sink)
        torch.testing.assert_close(out[s:s + e].float(), expected, **tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_triton_backend_matches_torch_backend_on_a_mixed_batch(dtype):
    g = torch.Generator().manual_seed(3)
    heads, kv_heads, D = 6, 2, 16
    lens = [30, 52, 12, 25, 33]  # 3 decodes, then extends of 9 (no prefix) and 6 new tokens
    exts = [1, 1, 1, 25, 6]
    k_cache, v_cache, table, rows = random_batch(g, lens, kv_heads, D, dtype)
    out_loc = torch.cat([table[rows[i], n - e:n] for i, (n, e) in enumerate(zip(lens, exts))])
    T = sum(exts)
    q = torch.randn(T, heads, D, generator=g).to(DEV, dtype)
    k_new = torch.randn(T, kv_heads, D, generator=g).to(DEV, dtype)
    v_new = torch.randn(T, kv_heads, D, generator=g).to(DEV, dtype)
    meta = AttentionMetadata(table, rows, lens, exts, 3, out_loc)
    results = []
    for name in ("torch", "triton"):
        backend = get_backend(name)
        backend.prepare(meta)
        kc, vc = k_cache.clone(), v_cache.clone()
        results.append((backend.forward(q, k_new, v_new, kc, vc, D**-0.5), kc, vc))
    (ref, kc_ref, vc_ref), (got, kc_got, vc_got) = results
    assert torch.equal(kc_got, kc_ref) and torch.equal(vc_got, vc_ref)
    torch.testing.assert_close(got.float(), ref.float(), **tol(dtype))


def test_triton_backend_choice(monkeypatch):
    # auto: Triton on a GPU; on CPU never Triton (interpreted, it is far slower than torch)
    assert auto_backend() == "triton" if torch.cuda.is_available() else auto_backend() in ("cpu", "torch")
    assert auto_backend("cpu", native=False) == "torch"
    assert get_backend("triton").name == "triton"
    if not torch.cuda.is_available():
        monkeypatch.delenv("TRITON_INTERPRET")
        with pytest.raises(RequestError, match="needs a CUDA GPU"):
            get_backend("triton")


def test_triton_engine_greedy_matches_torch_engine(tiny_dir):
    import agentkv as ak

    outs = []
    for backend in ("torch", "triton"):
        engine = ak.Engine(str(tiny_dir), num_slots=512, attention_backend=backend)
        try:
            params = ak.SamplingParams(max_tokens=6, temperature=0.0)
            outs.append([o.token_ids for o in engine.generate(["hello there", "a b c d e f g"], params)])
        finally:
            engine.close()
    assert outs[0] == outs[1]

"""The decode step in one native call (engine/native_step.py, csrc/cpu_step.c) against the Python path
running the same kernels: the same logits, bit for bit, at batch 1 and 16, for plain Llama GGUFs, a
sliding window (Phi-3), per-head q/k norms (Qwen3), K-quant tiles and Gemma 2 / 3 (with its cap on
re-scored logits); its plain-C bodies close to them; refused indices; and the embedded model's greedy
output equal to the exact (dequantized) path's."""

from __future__ import annotations

import ctypes

import pytest
import torch

import agentkv as ak
from agentkv.engine.native_step import NativeStep
from agentkv.kernels import cpu_native
from tests.conftest import requires_embedded
from tests.engine.test_gguf_families import ARCH, write_gemma_gguf
from tests.engine.test_gguf_families import write_gguf as write_family_gguf
from tests.engine.test_loading import write_gguf
from tests.tiny import make_tiny_model

gguf = pytest.importorskip("gguf")
kernels = cpu_native.load()
pytestmark = pytest.mark.skipif(kernels is None or not kernels.qtile_fast,
                                reason="the native step needs the C kernels' tiled bodies (AVX-512 VNNI or AVX2)")

GEMMA = {"gemma2": 2, "gemma3_text": 6}  # every n-th layer global, the others windowed
PROMPTS = ["Hello GGUF world", "One two three four five", "a", "The quick brown fox jumps over the lazy dog",
           "zz top", "Kept in tiles", "Sixteen prompts at once", "x y z", "quantized", "permuted!", "hello",
           "The end is near", "Another one", "Numbers 1 2 3", "last but one", "last"]


def step_and_python(engine: ak.Engine, prompts: list[str], max_tokens: int,
                    **params) -> list[tuple[torch.Tensor, torch.Tensor, int]]:
    """Each native pass's logits (and beside them the final normed states a grammar's re-score reads)
    from the step and from the Python path (which runs first and writes the pass's K/V; the step
    writes the same slots again), with the pass's tokens less its requests (its extends' tokens past
    their first)."""
    runner = engine._core.runner
    step: NativeStep = runner.native_step
    assert step is not None
    pairs = []
    run = step.run

    def both(dev, ids):
        ref = runner.forward_ids(dev, ids)
        rows = runner.model.logits_proj.approx_rows  # the normed rows a grammar's re-score reads
        got, hidden = run(dev, ids)
        assert rows is not None
        # (the states ride with the logits: compared as a row each)
        pairs.append((torch.cat([got, hidden], 1), torch.cat([ref, rows], 1), len(ids) - len(dev.meta.extend_lens)))
        return got, hidden

    step.run = both
    try:
        engine.generate(prompts, max_tokens=max_tokens, **({"temperature": 0.0, "ignore_eos": True} | params))
    finally:
        step.run = run
    return pairs


def tiny_gguf(tmp_path, family: str, quant: str, kinds: dict[str, str] | None = None, **options):
    """A tiny random model of `family` as a GGUF in `quant` (`kinds`: the types of some matrices, by the
    end of their GGUF names; not for llama and Gemma)."""
    path = tmp_path / "tiny.gguf"
    if family in GEMMA:  # windowed layers and a global one, as llama.cpp lays out the family's
        layers, pattern = options.pop("layers", 4), GEMMA[family]
        types = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(layers)]
        src = make_tiny_model(tmp_path / "src", family, layers=layers,
                              config={"query_pre_attn_scalar": 16, "layer_types": types},
                              **({"hidden": 64, "heads": 4, "kv_heads": 2} | options))
        write_gemma_gguf(src, path, quant)
        return str(path)
    src = make_tiny_model(tmp_path / "src", "llama" if family == "llama" else family,
                          **({"hidden": 64, "heads": 4, "kv_heads": 2} | options))
    if family == "llama":
        write_gguf(src, path, getattr(gguf.GGMLQuantizationType, quant))
    else:
        write_family_gguf(src, path, family, quant, kinds)
    return str(path)


@pytest.mark.parametrize("family,quant,options", [
    ("llama", "Q4_1", {}),
    ("llama", "Q8_0", {}),
    ("llama", "Q4_0", {}),
    ("phi3", "Q8_0", {"sliding_window": 12, "tie": False}),  # fused q/k/v, a window the decodes pass
    ("qwen3", "Q4_1", {}),  # per-head q and k norms
    ("qwen3", "Q5_0", {}),  # Q5's tiles, the vocabulary's (its rows read back for the embedding) included
    ("llama", "Q5_1", {}),
    ("qwen3", "Q4_K", {"hidden": 256, "intermediate": 512}),  # K-quants: rows of whole super-blocks of 256
    ("qwen3", "Q6_K", {"hidden": 256, "intermediate": 512}),
    ("qwen3", "Q5_K", {"hidden": 256, "intermediate": 512}),
    ("qwen3", "IQ4_XS", {"hidden": 256, "intermediate": 512}),
    ("qwen3", "F16", {}),  # a file's float matrices in tiles of their 2-byte values
    ("qwen3", "BF16", {}),
    # a Q4_K_M file's mixtures: a linear's parts in tiles of their own types
    ("qwen3", "Q4_K", {"hidden": 256, "intermediate": 512,
                       "kinds": {"attn_v.weight": "Q6_K", "ffn_up.weight": "Q5_0"}}),
    # sandwich norms, GeGLU, scaled embeddings, soft caps on attention and logits, every other layer windowed
    ("gemma2", "Q8_0", {"sliding_window": 12}),
    # q/k norms, five windowed layers (their own rotation base) and a global one
    ("gemma3_text", "Q4_1", {"layers": 6, "kv_heads": 1, "sliding_window": 10}),
])
@pytest.mark.parametrize("batch", [1, 16])
def test_step_logits_are_the_python_paths(tmp_path, monkeypatch, family, quant, options, batch):
    monkeypatch.setenv("AGENTKV_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setitem(ARCH, "qwen3", "qwen3")
    path = tiny_gguf(tmp_path, family, quant, **options)
    with ak.Engine(path, num_slots=2048) as engine:
        pairs = step_and_python(engine, PROMPTS[:batch], max_tokens=20)
    assert len(pairs) >= 19  # every decode pass went native (and the prefill where it had at most 16 tokens)
    for got, ref, _ in pairs:
        assert got.shape == ref.shape
        assert torch.equal(got, ref)


@pytest.mark.parametrize("family,quant,options", [("llama", "Q4_1", {}), ("phi3", "Q8_0", {"sliding_window": 12,
                                                                                      "tie": False})])
def test_a_16_bit_kv_pool_gives_the_python_paths_logits(tmp_path, monkeypatch, family, quant, options):
    """kv_dtype="bfloat16" under fp32 activations: the step stores each K/V rounded as torch rounds and
    attends over the bf16 values, as the Python path's kernel does, bit for bit; the pool is half the bytes."""
    monkeypatch.setenv("AGENTKV_CACHE_DIR", str(tmp_path / "cache"))
    path = tiny_gguf(tmp_path, family, quant, **options)
    with ak.Engine(path, num_slots=2048, kv_dtype="bfloat16") as engine:
        assert engine._pool.kv_caches[0][0].dtype == torch.bfloat16
        pairs = step_and_python(engine, PROMPTS[:16], max_tokens=20)
        half = engine.stats()["kv_bytes"]
    with ak.Engine(path, num_slots=2048) as engine:
        assert engine.stats()["kv_bytes"] == 2 * half
    assert len(pairs) >= 19
    for got, ref, _ in pairs:
        assert torch.equal(got, ref)


@pytest.mark.parametrize("batch", [1, 3])
def test_long_contexts_in_parts_are_the_python_paths(tmp_path, monkeypatch, batch):
    """Decodes whose keys cross the fixed parts' boundaries (512, 1024): the step attends each part as a
    task of its own and merges them, the Python path's kernel the same parts in the same order, so the
    logits are the same bits (before the parts, the Python path split a lone token's keys by its threads
    and the two differed past 1,024 keys)."""
    monkeypatch.setenv("AGENTKV_CACHE_DIR", str(tmp_path / "cache"))
    path = tiny_gguf(tmp_path, "llama", "Q8_0", max_positions=2048)
    with ak.Engine(path, num_slots=8192, context_length=2048) as engine:

        def just_under(n: int) -> str:  # a prompt a few tokens short of n: its decodes cross n
            words = 1
            while len(engine._encode(" ".join(f"w{i}" for i in range(words + 1)))) < n - 6:
                words += 1
            return " ".join(f"w{i}" for i in range(words))

        prompts = [just_under(1024), just_under(512), just_under(700)][:batch]
        pairs = step_and_python(engine, prompts, max_tokens=24)
    assert len(pairs) >= 23
    for got, ref, _ in pairs:
        assert torch.equal(got, ref)


@pytest.mark.parametrize("family,options", [("llama", {}), ("phi3", {"sliding_window": 12, "tie": False})])
def test_extends_are_the_python_paths(tmp_path, monkeypatch, fixed_draft_cost, family, options):
    """Short extends go native too: jump-forward's forced tokens under a schema, and n-gram drafts
    being checked; their logits are the Python path's (whose tiles hold several of the extend's tokens,
    where the step attends token by token: under a sliding window too)."""
    monkeypatch.setenv("AGENTKV_CACHE_DIR", str(tmp_path / "cache"))
    assert_extends_are_the_python_paths(tiny_gguf(tmp_path, family, "Q8_0", **options))


def assert_extends_are_the_python_paths(path: str) -> None:
    """A forced run's and n-gram drafts' passes of the model at `path`: some with an extend in them, each the
    Python path's bits."""
    # (keys short enough that each forced run, and the prompt with the first, fit a pass of 16 tokens)
    schema = {"type": "object", "properties": {"a": {"type": "string", "maxLength": 4}, "b": {"enum": ["xy", "z"]}},
              "required": ["a", "b"], "additionalProperties": False}
    with ak.Engine(path, num_slots=2048) as engine:
        forced = step_and_python(engine, ["zz top"], max_tokens=40, json_schema=schema, ignore_eos=False)
    with ak.Engine(path, num_slots=2048, speculative="ngram") as engine:
        engine.generate(["one two one two one two"], max_tokens=24, temperature=0.0, ignore_eos=True)
        drafts = step_and_python(engine, ["one two one two one two"] * 2, max_tokens=24)
    for pairs in (forced, drafts):
        assert any(extra > 0 for _, _, extra in pairs)  # a pass with an extend in it
        for got, ref, _ in pairs:
            assert torch.equal(got, ref)


def test_plain_c_bodies_stay_close(tmp_path, monkeypatch):
    monkeypatch.setenv("AGENTKV_CACHE_DIR", str(tmp_path / "cache"))
    path = tiny_gguf(tmp_path, "llama", "Q4_1")
    with ak.Engine(path, num_slots=1024) as engine:
        engine._core.runner.native_step.generic = True
        pairs = step_and_python(engine, PROMPTS[:4], max_tokens=8)
    for got, ref, _ in pairs:  # the generic attention rounds its exps and sums its own way
        assert torch.allclose(got, ref, rtol=1e-4, atol=1e-4)


def test_the_step_refuses_bad_indices(tmp_path, monkeypatch):
    monkeypatch.setenv("AGENTKV_CACHE_DIR", str(tmp_path / "cache"))
    path = tiny_gguf(tmp_path, "llama", "Q8_0")
    with ak.Engine(path, num_slots=64) as engine:
        runner = engine._core.runner
        step = runner.native_step
        table = runner.req_pool.table
        model = ctypes.addressof(step._model)
        vocab = step._model.vocab
        one = torch.zeros(1, dtype=torch.int64)
        logits = torch.full((1, vocab), 7.0)
        cases = {1: (torch.tensor([vocab]), one, one, one), 2: (one, torch.tensor([table.shape[1]]), one, one),
                 3: (one, one, torch.tensor([64]), one), 4: (one, one, one, torch.tensor([table.shape[0]]))}
        for code, (ids, pos, loc, rows) in cases.items():
            assert kernels.decode_step(model, ids, pos, loc, table, rows, one, logits) == code
        table[0, 0] = 10**6
        assert kernels.decode_step(model, one, one, one, table, one, one, logits) == 5
        # a token not in the pass
        assert kernels.decode_step(model, one, one, one, table, one, torch.tensor([1]), logits) == 6
        table[0, 0] = 0
        assert torch.equal(logits, torch.full((1, vocab), 7.0))  # nothing written
        # (greedy, past EOS: an unseeded sample of the random model ended early by chance once)
        out = engine.generate("still serving", max_tokens=3, temperature=0.0, ignore_eos=True)
        assert out.finish_reason == "length"


def test_native_step_option(tmp_path, monkeypatch):
    monkeypatch.setenv("AGENTKV_CACHE_DIR", str(tmp_path / "cache"))
    src = make_tiny_model(tmp_path / "src", "llama", hidden=64, heads=4, kv_heads=2)
    with ak.Engine(str(src), num_slots=256) as engine:  # fp32 weights: the Python path
        assert engine._core.runner.native_step is None
    with pytest.raises(ak.RequestError, match="native_step=True, but a linear is not a tiled quantized weight"):
        ak.Engine(str(src), num_slots=256, native_step=True)
    path = tiny_gguf(tmp_path, "llama", "Q8_0")
    with ak.Engine(path, num_slots=256, native_step=False) as engine:
        assert engine._core.runner.native_step is None


TIE = 0.06  # nats


@requires_embedded
@pytest.mark.slow
def test_embedded_greedy_equals_the_exact_path():
    """The default path (int8 activations, the top logits re-scored) decodes what the dequantized fp32
    model decodes, on these prompts, up to a near tie: where the two part, the exact model ranks the
    token ours chose within TIE nats of its own. The int8 path's noise decides such ties, and it moves
    with the last bits of the prompt's KV: a prompt pass whose products sum in another order (torch's
    matmul, csrc/cpu_tgemm.c) gives the first two tokens' logits alike to 1e-4 and moves the third's by
    0.045 nats (an activation on an int8 rounding boundary); " bustling" / " small" 0.057 nats apart
    at the sixth token of the second prompt flip that way, and " to" / " of" 0.0098 apart flip between
    an AVX2 and an AVX-512 build."""
    prompts = [[{"role": "user", "content": "What is the capital of France?"}],
               [{"role": "user", "content": "Write a short story about a robot learning to paint."}],
               [{"role": "user", "content": "List three colors."}]]
    with ak.Engine(num_slots=2048) as engine:
        assert engine._core.runner.native_step is not None
        ours = [engine.chat(p, max_tokens=32, temperature=0.0).token_ids for p in prompts]
        assert engine._core.runner.native_step.calls > 0
    with ak.Engine(num_slots=2048, quantized_weights=False) as exact:
        assert exact._core.runner.native_step is None
        ref = [exact.chat(p, max_tokens=32, temperature=0.0, logprobs=True, top_logprobs=5) for p in prompts]
    same = 0
    for got, want in zip(ours, ref):
        part = next((i for i, (a, b) in enumerate(zip(got, want.token_ids)) if a != b), None)
        if part is None:
            assert got == want.token_ids
            same += 1
            continue
        top = {t: lp for t, _, lp in want.logprobs[part].top}
        assert got[part] in top and top[want.token_ids[part]] - top[got[part]] < TIE, (part, top)
    assert same >= 2  # (a near tie is rare: most prompts decode alike in full)


def test_overlap_and_speculation_decode_what_the_plain_engine_does(tmp_path, monkeypatch):
    """Overlap (the next pass's tokens placeholders the step reads resolved) and n-gram speculation
    (drafts checked on the Python path, plain decodes native) give the outputs of an engine with
    neither; the step ran in each."""
    monkeypatch.setenv("AGENTKV_CACHE_DIR", str(tmp_path / "cache"))
    path = tiny_gguf(tmp_path, "llama", "Q4_1")
    prompts = PROMPTS[:6] + ["one two one two one two one two", "abc abc abc abc abc"]

    def outputs(**options):
        with ak.Engine(path, num_slots=2048, **options) as engine:
            texts = [o.token_ids for o in engine.generate(prompts, max_tokens=24, temperature=0.0, ignore_eos=True)]
            return texts, engine._core.runner.native_step.calls

    plain, calls = outputs()
    assert calls > 0
    for options in ({"overlap_schedule": True}, {"speculative": "ngram"}):
        got, calls = outputs(**options)
        assert got == plain, options
        assert calls > 0, options


def test_the_pool_gives_the_same_logits_to_any_threads_and_callers(tmp_path, monkeypatch):
    """csrc/cpu_pool.c: 1-5 threads (workers made as needed, then fewer used), and four Python threads
    calling at once (jobs one at a time), all give the single-threaded logits."""
    import threading

    monkeypatch.setenv("AGENTKV_CACHE_DIR", str(tmp_path / "cache"))
    path = tiny_gguf(tmp_path, "llama", "Q4_1")
    with ak.Engine(path, num_slots=256) as engine:
        engine.generate("warm the pool and fill some slots", max_tokens=4)
        runner = engine._core.runner
        model = ctypes.addressof(runner.native_step._model)
        vocab = runner.native_step._model.vocab
        table = runner.req_pool.table.clone()
        table[0, :12] = torch.arange(100, 112)
        table[1, :9] = torch.arange(120, 129)
        # the slots the rows read, written first: left as the pool had them, memory that happened to hold
        # NaN made every run's logits NaN (never equal), a failure by chance
        gen = torch.Generator().manual_seed(0)
        for layer in runner.pool.kv_caches:
            for cache in layer:
                cache[100:129] = torch.randn(cache[100:129].shape, generator=gen).to(cache.dtype)
        args = (torch.tensor([5, 9]), torch.tensor([11, 8]), torch.tensor([111, 128]), table, torch.tensor([0, 1]))

        def logits(threads: int) -> torch.Tensor:
            out = torch.empty(2, vocab)
            assert kernels.decode_step(model, *args, torch.tensor([1, 0]), out, threads=threads) == 0
            return out

        ref = logits(1)
        for threads in (2, 5, 3, 1, 4):
            assert torch.equal(logits(threads), ref), threads
        failures = []

        def caller(threads: int):
            for _ in range(20):
                if not torch.equal(logits(threads), ref):
                    failures.append(threads)

        callers = [threading.Thread(target=caller, args=(t,)) for t in (1, 2, 3, 2)]
        for c in callers:
            c.start()
        for c in callers:
            c.join(timeout=120)
        assert not failures and not any(c.is_alive() for c in callers)


def test_the_pool_takes_fewer_threads_while_a_core_is_held():
    """csrc/cpu_pool.c: jobs whose threads spend most of their time waiting on one another (a thread
    made late on purpose, as a core another process holds makes it) run on a thread fewer after 3 of
    them; every 64th job tries all the threads again: while the lateness lasts it finds it and stays on
    fewer, once it is gone it takes them all back. Jobs whose threads work alike never drop one (and
    the logits are the same whatever the threads: the test above)."""
    lib = kernels._lib
    lib.agentkv_pool_reset()
    try:
        assert [lib.agentkv_pool_test_job(2, 2000, 0) for _ in range(5)] == [2] * 5
        assert [lib.agentkv_pool_test_job(2, 2000, 20000) for _ in range(3)] == [2, 2, 1]
        assert [lib.agentkv_pool_test_job(2, 2000, 20000) for _ in range(70)] == [1] * 70  # (a probe at 64)
        quiet = [lib.agentkv_pool_test_job(2, 2000, 0) for _ in range(200)]  # probes at 58, 122, 186
        assert quiet[0] == 1 and quiet[-1] == 2 and quiet == sorted(quiet)
    finally:
        lib.agentkv_pool_reset()


def test_gemma2s_rescored_logits_carry_its_cap(tmp_path, monkeypatch):
    """After a grammar's mask the sampler re-scores a row's best allowed tokens (runner.exact_logits):
    for Gemma 2 they carry the final soft cap as the pass's logits do (uncapped, they would outrank
    every capped logit)."""
    monkeypatch.setenv("AGENTKV_CACHE_DIR", str(tmp_path / "cache"))
    path = tiny_gguf(tmp_path, "gemma2", "Q8_0", sliding_window=12)
    with ak.Engine(path, num_slots=1024) as engine:
        runner = engine._core.runner
        seen, run = [], runner.native_step.run

        def keep(dev, ids):
            seen.append(run(dev, ids))
            return seen[-1]

        runner.native_step.run = keep
        engine.generate(["hello"], max_tokens=3, temperature=0.0, ignore_eos=True)
        logits, hidden = seen[-1]
        top = logits.topk(8, dim=-1).indices  # within the 32 the pass re-scored exactly
        assert torch.equal(runner.exact_logits(hidden, top), logits.gather(1, top))

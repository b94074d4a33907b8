"""LoRA adapters against HF `peft`: logits (fresh and over cached KV) and greedy tokens on tiny Llama and
Qwen models, adapters of rank 8 and 16 on attention and MLP targets, rsLoRA and per-module alphas, on the C
kernels' path and torch's; a batch mixing adapters and the base gives each request its tokens alone; a GGUF
LoRA file is the PEFT adapter it was made from; files the engine cannot serve are refused clearly."""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest
import torch

import agentkv as ak
from agentkv.engine.request import Request
from agentkv.kernels import cpu_native
from tests.lora_helpers import ATTENTION, MLP, edit_config, make_adapter, peft_greedy, peft_logits, peft_model
from tests.reference import engine_logits, rel_error
from tests.tiny import make_tiny_model

pytest.importorskip("peft")
kernels = cpu_native.load()
TEXT = "The quick brown fox jumps over the lazy dog, then naps in the warm afternoon sun."
NATIVE = [pytest.param(True, marks=pytest.mark.skipif(kernels is None, reason="no C kernels")), False]


@pytest.mark.parametrize("family,options,lora", [
    ("llama", {}, {"r": 8}),
    ("llama", {"tie": False, "kv_heads": 1}, {"r": 16, "targets": ATTENTION}),
    ("qwen2", {"tie": False}, {"r": 16, "targets": MLP}),  # q/k/v biases beside the update
    ("qwen3", {"kv_heads": 4}, {"r": 8, "targets": ["q_proj", "v_proj", "down_proj"]}),  # q/k norms after it
    ("llama", {}, {"r": 8, "rslora": True, "alpha": 32.0}),  # alpha / sqrt(r)
    ("llama", {}, {"r": 16, "alpha_pattern": {"v_proj": 4.0}}),  # v's own alpha
    ("qwen2", {}, {"r": 16, "dtype": torch.bfloat16}),  # saved in bf16: kept so, exact
])
@pytest.mark.parametrize("native", NATIVE, ids=["c", "torch"])
def test_adapter_logits_and_greedy_tokens_are_pefts(tmp_path, family, options, lora, native):
    base = make_tiny_model(tmp_path / family, family, **options)
    adapter = make_adapter(base, tmp_path / "adapter", **lora)
    ref_model = peft_model(base, adapter)
    with ak.Engine(str(base), num_slots=2048, native_kernels=native, lora={"tuned": str(adapter)}) as engine:
        ids = engine.tokenizer.encode(TEXT)
        ref = peft_logits(ref_model, ids)
        with ref_model.disable_adapter():
            assert rel_error(peft_logits(ref_model, ids), ref) > 0.05  # the adapter changes the model
        ours, cached = engine_logits(engine, ids, adapter="tuned")
        assert cached == 0 and rel_error(ours, ref) < 1e-4
        engine.flush_cache()
        ours, cached = engine_logits(engine, ids, cached_prefix=30, adapter="tuned")  # its own KV read back
        assert cached == 30 and rel_error(ours, ref[30:]) < 1e-4
        out = engine.generate(ids, max_tokens=16, temperature=0.0, ignore_eos=True, adapter="tuned")
        assert out.token_ids == peft_greedy(ref_model, ids, 16)
        base_out = engine.generate(ids, max_tokens=16, temperature=0.0, ignore_eos=True)
        with ref_model.disable_adapter():
            assert base_out.token_ids == peft_greedy(ref_model, ids, 16)


def _submit(engine: ak.Engine, jobs: list[tuple[str, str | None]], max_tokens: int) -> list[list[int]]:
    """Each (prompt, adapter) as one request, all submitted at once (one batch of mixed adapters)."""
    reqs = []
    for prompt, adapter in jobs:
        params = ak.SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, adapter=adapter)
        reqs += engine._make_requests(engine._encode(prompt), params)
    engine._run_to_end(reqs)
    return [r.output_ids for r in reqs]


@pytest.mark.parametrize("native", NATIVE, ids=["c", "torch"])
def test_a_batch_mixing_adapters_gives_each_request_its_tokens_alone(tmp_path, native):
    base = make_tiny_model(tmp_path / "llama", "llama")
    adapters = {f"a{i}": str(make_adapter(base, tmp_path / f"a{i}", r=8 * (1 + i % 2), seed=i,
                                          targets=ATTENTION + MLP if i != 1 else ATTENTION)) for i in range(3)}
    jobs = [(p, a) for p, a in zip(
        ["Hello there", "The quick brown fox", "One two three", "zz top", "Hello there", "abc", "x y z", "last"],
        ["a0", None, "a1", "a2", "a2", None, "a0", "a1"])]
    with ak.Engine(str(base), num_slots=2048, native_kernels=native, lora=adapters) as engine:
        together = _submit(engine, jobs, 12)
        assert engine.stats()["forward_passes"] <= 12  # (one pass held them all: 8 prompts, then 11 decodes)
        engine.flush_cache()
        alone = [_submit(engine, [job], 12)[0] for job in jobs]
        engine.flush_cache()
        base_alone = [_submit(engine, [(p, None)], 12)[0] for p, _ in jobs]
    assert together == alone
    # each adapter's own tokens (the prompt "Hello there" under a0 and a2 differs from the base's)
    assert together[0] != base_alone[0] and together[4] != base_alone[4] and together[0] != together[4]


def test_the_c_kernel_equals_torchs_update_at_any_rows(tmp_path):
    """csrc/cpu_lora.c (both bodies) against (x A^T) B^T per row, rows of three adapters and none mixed."""
    if kernels is None:
        pytest.skip("no C kernels")
    from agentkv.engine.lora.apply import LoraBatch
    from agentkv.engine.lora.files import load_adapter
    from agentkv.engine.model_config import ModelConfig

    base = make_tiny_model(tmp_path / "llama", "llama", hidden=96, heads=6, kv_heads=2, intermediate=200)
    cfg = ModelConfig.from_hf(json.loads((base / "config.json").read_text()))
    adapters = [load_adapter(f"a{i}", make_adapter(base, tmp_path / f"a{i}", r=r, seed=i, dtype=dtype), cfg)
                for i, (r, dtype) in enumerate(((4, torch.float32), (16, torch.bfloat16), (8, torch.float32)))]
    assert adapters[1].layers[0]["qkv"][0].a.dtype == torch.bfloat16  # (kept in the file's bf16)
    g = torch.Generator().manual_seed(0)
    for rows in (1, 5, 37):
        which = torch.randint(-1, 3, (rows,), generator=g)
        which[1:4] = which[0]  # a run of one adapter's rows (computed together)
        for target, (k, n) in {"qkv": (96, 96 + 2 * 32), "o": (96, 96), "gate_up": (96, 400),
                               "down": (200, 96)}.items():
            x, y = torch.randn(rows, k, generator=g), torch.randn(rows, n, generator=g)
            want = y.clone()
            for m in range(rows):
                if which[m] >= 0:
                    for p in adapters[which[m]].layers[1][target]:
                        want[m, p.n0 : p.n0 + p.bt.shape[1]] += (x[m] @ p.a.float().t()) @ p.bt.float() * p.scale
            for generic in (False, True):
                got = y.clone()
                batch = LoraBatch(adapters, which, kernels)
                batch.kernels = _Generic(kernels) if generic else kernels
                batch.add(1, target, x, got)
                assert torch.allclose(got, want, rtol=1e-5, atol=1e-5), (rows, target, generic)
                for m in range(rows):  # a row's bits are its own, whatever rows it is computed beside
                    alone = y[m : m + 1].clone()
                    one = LoraBatch(adapters, which[m : m + 1].clone(), kernels)
                    one.kernels = batch.kernels
                    one.add(1, target, x[m : m + 1], alone)
                    assert torch.equal(alone[0], got[m])
            torch_got = y.clone()
            LoraBatch(adapters, which, None).add(1, target, x, torch_got)
            assert torch.allclose(torch_got, want, rtol=1e-5, atol=1e-5)


class _Generic:
    """The kernels with the plain-C bodies."""

    def __init__(self, k):
        self.k = k

    def lora_apply(self, *args):
        return self.k.lora_apply(*args, generic=True)


def test_a_gguf_lora_file_is_the_peft_adapter_it_was_made_from(tmp_path):
    gguf = pytest.importorskip("gguf")
    from safetensors.torch import load_file

    from tests.engine.test_loading import _permute

    base = make_tiny_model(tmp_path / "llama", "llama")
    adapter = make_adapter(base, tmp_path / "adapter", r=8, alpha=12.0)
    cfg = json.loads((base / "config.json").read_text())
    # as llama.cpp's convert_lora_to_gguf.py writes one: B's rows of q and k permuted as the base's q and k
    w = gguf.GGUFWriter(str(tmp_path / "adapter.gguf"), "llama")
    w.add_type("adapter")
    w.add_string("adapter.type", "lora")
    w.add_float32("adapter.lora.alpha", 12.0)
    names = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output",
             "gate_proj": "ffn_gate", "up_proj": "ffn_up", "down_proj": "ffn_down"}
    for key, t in load_file(str(adapter / "adapter_model.safetensors")).items():
        parts = key.split(".")
        layer, module, ab = parts[parts.index("layers") + 1], parts[-3], parts[-2][-1].lower()
        data = t.numpy().astype(np.float32)
        if ab == "b" and module in ("q_proj", "k_proj"):
            data = _permute(data, cfg["num_attention_heads" if module == "q_proj" else "num_key_value_heads"])
        w.add_tensor(f"blk.{layer}.{names[module]}.weight.lora_{ab}", data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with ak.Engine(str(base), num_slots=1024, lora={"peft": str(adapter), "gguf": str(tmp_path / "adapter.gguf")}) \
            as engine:
        ids = engine.tokenizer.encode(TEXT)
        a, _ = engine_logits(engine, ids, adapter="peft")
        engine.flush_cache()
        b, cached = engine_logits(engine, ids, adapter="gguf")
        assert cached == 0 and rel_error(b, a) < 1e-6
        # the same numbers: the same adapter to the cache (its KV keyed by content, not by name or file)
        peft_info, gguf_info = sorted(engine.loras(), key=lambda i: i.name, reverse=True)
        assert peft_info.hash == gguf_info.hash
        assert engine_logits(engine, ids, adapter="peft")[1] == len(ids) - 1


def test_adapters_the_engine_cannot_serve_are_refused_and_it_keeps_serving(tmp_path):
    base = make_tiny_model(tmp_path / "llama", "llama")
    other = make_tiny_model(tmp_path / "other", "llama", hidden=32, heads=2, kv_heads=1)
    good = make_adapter(base, tmp_path / "good")
    saved = make_adapter(base, tmp_path / "saved", modules_to_save=["lm_head"])
    dora = make_adapter(base, tmp_path / "dora")
    edit_config(dora, use_dora=True)
    wrong = make_adapter(other, tmp_path / "wrong")
    with ak.Engine(str(base), num_slots=1024, max_loras=2) as engine:
        with pytest.raises(ak.AdapterError, match="modules_to_save"):
            engine.load_lora("saved", saved)
        with pytest.raises(ak.AdapterError, match="DoRA"):
            engine.load_lora("dora", dora)
        with pytest.raises(ak.AdapterError, match="another model"):
            engine.load_lora("wrong", wrong)
        with pytest.raises(ak.AdapterError, match="neither a PEFT"):
            engine.load_lora("missing", tmp_path / "nowhere")
        with pytest.raises(ak.UnknownAdapterError, match=r"none are"):
            engine.generate("hi", max_tokens=2, adapter="good")
        info = engine.load_lora("good", good)
        assert info.rank == 8 and info.targets == ("down", "gate_up", "o", "qkv") and info.nbytes > 0
        with pytest.raises(ak.AdapterError, match="unload it first"):
            engine.load_lora("good", good)
        engine.load_lora("second", good)
        with pytest.raises(ak.AdapterError, match="max_loras"):
            engine.load_lora("third", good)
        with pytest.raises(ak.UnknownAdapterError, match=r"loaded: \['good', 'second'\]"):
            engine.generate("hi", max_tokens=2, adapter="nope")
        assert engine.generate("hi", max_tokens=2, adapter="good").token_ids
        engine.unload_lora("second")
        with pytest.raises(ak.UnknownAdapterError):
            engine.unload_lora("second")
        assert [a.name for a in engine.loras()] == ["good"]
        assert engine.generate("hi", max_tokens=2).token_ids


def test_a_request_in_flight_keeps_its_adapter_through_an_unload(tmp_path):
    base = make_tiny_model(tmp_path / "llama", "llama")
    adapter = make_adapter(base, tmp_path / "adapter")
    with ak.Engine(str(base), num_slots=1024, lora={"tuned": str(adapter)}) as engine:
        alone = engine.generate("Hello", max_tokens=24, temperature=0.0, ignore_eos=True, adapter="tuned").token_ids
        engine.flush_cache()
        params = ak.SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True, adapter="tuned")
        reqs: list[Request] = engine._make_requests(engine._encode("Hello"), params)
        unloaded, done = [], threading.Event()

        def on_update(r: Request) -> None:  # (on the engine thread, between two of its steps)
            if len(r.output_ids) >= 4 and not unloaded:
                unloaded.append(len(r.output_ids))
                engine.unload_lora("tuned")
            if r.finished:
                done.set()

        reqs[0].on_update = on_update
        engine._core.submit(reqs)
        assert done.wait(60)
        assert unloaded and reqs[0].output_ids == alone
        assert engine.loras() == []
        with pytest.raises(ak.UnknownAdapterError):
            engine.generate("Hello", max_tokens=2, adapter="tuned")


@pytest.mark.skipif(kernels is None or not kernels.qtile_fast, reason="the native step needs the tiled bodies")
@pytest.mark.parametrize("family,quant,options", [
    ("llama", "Q4_1", {}),
    ("qwen3", "Q8_0", {}),
    ("gemma3_text", "Q4_1", {"layers": 6, "kv_heads": 1, "sliding_window": 10}),  # the sandwich's post-norms
])
def test_the_native_step_with_adapters_gives_the_python_paths_logits(tmp_path, monkeypatch, family, quant, options):
    """Decode passes mixing three adapters (attention and MLP targets, ranks 8 and 16) and the base, on a
    quantized GGUF: the native step's logits are the Python path's bit for bit, the plain-C bodies' close."""
    from tests.engine.test_gguf_families import ARCH
    from tests.engine.test_native_step import PROMPTS, step_and_python, tiny_gguf

    monkeypatch.setenv("AGENTKV_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setitem(ARCH, "qwen3", "qwen3")
    path = tiny_gguf(tmp_path, family, quant, **options)
    adapters = {f"a{i}": str(make_adapter(tmp_path / "src", tmp_path / f"a{i}", r=(8, 16, 8)[i], seed=i,
                                          targets=(ATTENTION + MLP, ATTENTION, MLP)[i])) for i in range(3)}
    with ak.Engine(path, num_slots=2048, lora=adapters) as engine:
        names = ["a0", None, "a1", "a2"] * 4
        jobs = list(zip(PROMPTS, names))
        calls = engine._core.runner.native_step.calls
        pairs = _step_and_python_mixed(engine, jobs, step_and_python)
        assert engine._core.runner.native_step.calls - calls >= 11
        for got, ref, _ in pairs:
            assert torch.equal(got, ref)
        engine._core.runner.native_step.generic = True
        for got, ref, _ in _step_and_python_mixed(engine, jobs[:4], step_and_python):
            assert rel_error(got, ref) < 1e-4
        engine._core.runner.native_step.generic = False
        # and the tokens a request gets in such a pass are those it gets alone
        engine.flush_cache()
        together = _submit(engine, jobs[:8], 12)
        engine.flush_cache()
        assert together == [_submit(engine, [job], 12)[0] for job in jobs[:8]]


def _step_and_python_mixed(engine, jobs, step_and_python):
    """step_and_python over requests of several adapters submitted at once."""
    real_generate = engine.generate

    def generate(prompts, max_tokens, **params):
        _submit(engine, jobs, max_tokens)

    engine.generate = generate
    try:
        return step_and_python(engine, [p for p, _ in jobs], max_tokens=12)
    finally:
        engine.generate = real_generate


@pytest.mark.parametrize("quant", ["Q4_0", "Q8_0"])
def test_a_quantized_gguf_base_with_an_adapter_is_its_dequantized_base_with_it(tmp_path, monkeypatch, quant):
    """A GGUF base with a PEFT adapter against peft on the HF model holding the dequantized weights: a
    prompt's logits (exact rows) equal, greedy tokens equal with the file dequantized at load; kept in its
    blocks, whose written tokens run in int8 (the base's own greedy tokens part from HF's there too), each
    token the engine writes is the reference's best within the int8 path's error."""
    gguf = pytest.importorskip("gguf")
    from safetensors.numpy import save_file

    from tests.engine.test_loading import write_gguf

    monkeypatch.setenv("AGENTKV_CACHE_DIR", str(tmp_path / "cache"))
    src = make_tiny_model(tmp_path / "src", "llama", hidden=64, heads=4, kv_heads=2)
    deq = write_gguf(src, tmp_path / "tiny.gguf", getattr(gguf.GGMLQuantizationType, quant))
    save_file(deq, str(src / "model.safetensors"))  # the reference: the dequantized weights
    adapter = make_adapter(src, tmp_path / "adapter", r=16)
    ref_model = peft_model(src, adapter)
    for kept in (True, False):
        with ak.Engine(str(tmp_path / "tiny.gguf"), num_slots=1024, lora={"tuned": str(adapter)},
                       quantized_weights=kept) as engine:
            ids = engine.tokenizer.encode(TEXT)
            ours, _ = engine_logits(engine, ids, adapter="tuned")
            assert rel_error(ours, peft_logits(ref_model, ids)) < 1e-4
            out = engine.generate(ids, max_tokens=16, temperature=0.0, ignore_eos=True, adapter="tuned").token_ids
            if not kept:
                assert out == peft_greedy(ref_model, ids, 16)
                continue
            step = engine._core.runner.native_step
            assert step is None or step.calls >= 15  # (its decodes went native where the step runs)
            ref = peft_logits(ref_model, ids + out)[len(ids) - 1 : -1]
            chosen = ref.gather(1, torch.tensor(out)[:, None])[:, 0]
            assert ((ref.max(1).values - chosen) <= 0.02 * ref.abs().max()).all()

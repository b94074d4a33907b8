"""Our model code against HF transformers: logits (with and without cached prefixes) and greedy outputs."""

from __future__ import annotations

import pytest
import torch

import agentkv as ak
from agentkv.engine.model import Linear, RMSNorm
from agentkv.engine.model_config import ModelConfig, RopeScaling
from agentkv.engine.rope import (
    ROTATION_MAX_TOKENS,
    ROTATION_MAX_TOKENS_LOW_PRECISION,
    RotaryEmbedding,
)
from tests.conftest import requires_embedded
from tests.reference import assert_matches_hf, engine_logits, rel_error
from tests.tiny import make_tiny_model

transformers = pytest.importorskip("transformers")

TEXT = "The quick brown fox jumps over the lazy dog, then naps in the warm afternoon sun."


# head_dim 16: 12 dims rotate, 6 frequencies
PHI4_ROPE = {"partial_rotary_factor": 0.75, "original_max_position_embeddings": 256, "max_position_embeddings": 4096,
             "rope_scaling": {"type": "longrope", "short_factor": [1.0, 1.1, 1.3, 1.7, 2.5, 4.0],
                              "long_factor": [1.0, 1.5, 2.5, 4.5, 8.0, 16.0]}}


def _hf(path, dtype=torch.float32):
    return transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()


@pytest.mark.parametrize(
    "family,kwargs",
    [
        ("llama", {}),
        ("llama", {"tie": False, "kv_heads": 1}),
        ("qwen2", {"tie": False}),
        ("qwen3", {"kv_heads": 4}),
        ("llama", {"rope_scaling": {"rope_type": "linear", "factor": 2.0}}),
        (
            "llama",
            {
                "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                 "original_max_position_embeddings": 64}
            },
        ),
        ("qwen2", {"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128}}),
        # mixtures of experts: 4 experts, top-2 (Qwen3-MoE renormalizes the two, Qwen2-MoE adds its
        # shared expert and keeps layer 1 dense, Mixtral names its experts w1/w3/w2)
        ("qwen3_moe", {"kv_heads": 4}),
        ("qwen2_moe", {"tie": False, "dense_layers": (1,)}),
        ("mixtral", {"experts": 8}),
        # sliding windows shorter than the text: every layer (Mistral), the layers past
        # max_window_layers (Qwen2), with experts (Mixtral)
        ("mistral", {"sliding_window": 8}),
        ("qwen2", {"sliding_window": 16, "max_window_layers": 1}),
        ("mixtral", {"sliding_window": 12}),
        ("phi3", {"sliding_window": 20, "tie": False}),
        # Phi-4-mini's rotary: 3/4 of each head rotates, by LongRoPE's short factors within the
        # pretrained length (the text is shorter than it; past it, see test_longrope_tables_past_the_pretrained_length)
        ("phi3", {"tie": False, "config": PHI4_ROPE}),
        ("phi3", {"config": {"partial_rotary_factor": 0.5}}),
        ("gemma3_text", {"sliding_window": 10, "layers": 3, "kv_heads": 1}),
        ("gemma2", {"sliding_window": 12}),
    ],
)
def test_tiny_families_match_hf(tmp_path, family, kwargs):
    path = make_tiny_model(tmp_path / family, family, **kwargs)
    assert_matches_hf(path, _hf(path), TEXT, 12)


@pytest.mark.parametrize("native", [False, True], ids=["torch", "native"])
def test_partial_rotary_and_longrope_on_each_path(tmp_path, native):
    """Phi-4-mini's rotary on torch ops (the rotation matrix of short passes, the element-wise form of
    long ones) and the C kernel, prefill and one-row decode, and in bf16 as close to the fp32 model as
    HF's bf16 is; HF's model really rotates part of each head (its config says so)."""
    from agentkv.kernels import cpu_native

    if native and cpu_native.load() is None:
        pytest.skip("agentkv's C kernels are off (AGENTKV_NATIVE_KERNELS=0) or do not build here")
    path = make_tiny_model(tmp_path / "phi4", "phi3", tie=False, config=PHI4_ROPE)
    hf = _hf(path)
    assert (
        hf.config.rope_parameters["rope_type"] == "longrope"
        and hf.config.rope_parameters.get("partial_rotary_factor", hf.config.partial_rotary_factor) == 0.75
    )
    with ak.Engine(str(path), num_slots=1024, native_kernels=native) as engine:
        ids = engine.tokenizer.encode(TEXT)
        assert len(ids) > ROTATION_MAX_TOKENS  # the prefill takes the element-wise form on torch ops
        with torch.no_grad():
            ref = hf(torch.tensor([ids])).logits[0]
        ours, _ = engine_logits(engine, ids)
        assert rel_error(ours, ref) < 1e-4
        last, cached = engine_logits(engine, ids, cached_prefix=len(ids) - 1)
        assert cached == len(ids) - 1 and rel_error(last, ref[-1:]) < 1e-4
    hf16 = _hf(path, torch.bfloat16)
    with ak.Engine(str(path), num_slots=1024, dtype="bfloat16", native_kernels=native) as engine:
        with torch.no_grad():
            ref16 = hf16(torch.tensor([ids])).logits[0].float()
        ours16, _ = engine_logits(engine, ids)
    assert rel_error(ours16, ref) < 1.5 * rel_error(ref16, ref)


def test_longrope_tables_past_the_pretrained_length():
    """Positions before original_max_position_embeddings rotate as HF's short-factor tables, those
    from it on as HF's long-factor ones (which HF uses for a whole sequence longer than that)."""
    from transformers.models.phi3.configuration_phi3 import Phi3Config
    from transformers.models.phi3.modeling_phi3 import Phi3RotaryEmbedding

    hf_cfg = Phi3Config(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, vocab_size=300,
                        pad_token_id=None, rope_theta=10000.0, **{k: v for k, v in PHI4_ROPE.items()})
    ours = RotaryEmbedding(ModelConfig.from_hf({**hf_cfg.to_dict(), "architectures": ["Phi3ForCausalLM"],
                                                **PHI4_ROPE}), 600)
    hf = Phi3RotaryEmbedding(hf_cfg)
    x = torch.zeros(1, 1, 16)
    for positions in (torch.arange(0, 256), torch.arange(0, 600)):  # within the pretrained length; past it
        cos, sin = hf(x, positions[None])
        tail = positions[-40:]  # HF: short factors up to 256 positions, long ones for a longer sequence
        torch.testing.assert_close(ours.cos[tail, :12], cos[0, -40:], rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(ours.sin[tail, :12], sin[0, -40:], rtol=1e-6, atol=1e-6)
    assert (ours.cos[:, 12:] == 1).all() and (ours.sin[:, 12:] == 0).all()  # the dims that do not rotate


@pytest.mark.parametrize("family", ["qwen3_moe", "qwen2_moe"])
def test_moe_on_torch_ops_and_bf16(tmp_path, family):
    """The MoE block on torch ops alone (the test above runs the C kernels where they build), and in
    bf16 close to HF's bf16."""
    path = make_tiny_model(tmp_path / family, family)
    hf = _hf(path)
    with ak.Engine(str(path), num_slots=1024, native_kernels=False) as engine:
        ids = engine.tokenizer.encode(TEXT)
        with torch.no_grad():
            ref = hf(torch.tensor([ids])).logits[0]
        ours, _ = engine_logits(engine, ids)
    assert rel_error(ours, ref) < 1e-4
    hf16 = _hf(path, torch.bfloat16)
    with ak.Engine(str(path), num_slots=1024, dtype="bfloat16") as engine:
        with torch.no_grad():
            ref16 = hf16(torch.tensor([ids])).logits[0].float()
        ours16, _ = engine_logits(engine, ids)
    # row by row as close as the dense bf16 test, but for the odd token whose two best experts are
    # within bf16's rounding of each other: there either order is right, and the outputs part
    rows = ((ours16 - ref16).norm(dim=-1) / ref16.norm(dim=-1)).sort().values
    assert rows[len(rows) // 2] < 3e-2 and rows[-4] < 6e-2, rows.tolist()


@pytest.mark.parametrize("in_features,bias,keep_plain", [(64, False, True), (64, True, True), (63, True, False)])
def test_packed_linear_matches_matmul(in_features, bias, keep_plain):
    """Rows of any count through the packed weight, single rows through the plain weight where it is
    kept, with and without the residual added in the same kernel: all equal x @ W + b (+ r)."""
    lin = Linear(in_features, 40, bias=bias)
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(in_features, 40, generator=g)
    lin.weight.data.copy_(weight)
    b = torch.randn(40, generator=g) if bias else torch.zeros(40)
    if bias:
        lin.bias.data.copy_(b)
    x = torch.randn(5, in_features, generator=g)
    r = torch.randn(5, 40, generator=g)
    lin.pack(keep_plain=keep_plain)
    if not torch.backends.mkldnn.is_available():
        pytest.skip("oneDNN is not available in this torch build: nothing is packed")
    assert lin.packed is not None and (lin.weight is not None) == keep_plain
    with torch.no_grad():
        for t in (1, 2, 5):
            torch.testing.assert_close(lin(x[:t]), x[:t] @ weight + b, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(lin(x[:t], r[:t]), x[:t] @ weight + b + r[:t], rtol=1e-5, atol=1e-5)


def test_rms_norm_bf16_is_hfs_bit_for_bit():
    """bf16: normalized in fp32, rounded to bf16, then times the weight (HF's LlamaRMSNorm order)."""
    norm = RMSNorm(64, 1e-5)
    g = torch.Generator().manual_seed(0)
    norm.weight.data.copy_(torch.randn(64, generator=g) * 0.1 + 1)
    norm = norm.to(torch.bfloat16)
    for scale in (1e-2, 1.0, 1e2):
        x = (torch.randn(5, 64, generator=g) * scale).bfloat16()
        xf = x.float()
        expected = norm.weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5)).to(torch.bfloat16)
        with torch.no_grad():
            assert torch.equal(norm(x), expected)


@pytest.mark.parametrize("bias", [False, True])
def test_packed_linear_bf16(bias):
    """bf16 weights are packed where oneDNN has bf16 kernels (AVX-512 BF16 / AMX): 2x less to read
    than fp32 and faster than bf16 `F.linear` at one row; single rows take the packed weight too."""
    if not (torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()):
        pytest.skip("this CPU or torch build has no oneDNN bf16 kernels: bf16 weights stay plain")
    lin = Linear(64, 40, bias=bias)
    g = torch.Generator().manual_seed(0)
    lin.weight.data.copy_(torch.randn(64, 40, generator=g))
    if bias:
        lin.bias.data.copy_(torch.randn(40, generator=g))
    lin = lin.to(torch.bfloat16)
    weight, b = lin.weight.data.float(), lin.bias.data.float() if bias else 0.0
    x, r = torch.randn(5, 64, generator=g).bfloat16(), torch.randn(5, 40, generator=g).bfloat16()
    lin.pack(keep_plain=True)  # asked for, but the packed weight is faster at one row in bf16
    assert lin.packed is not None and lin.weight is None
    with torch.no_grad():
        for t in (1, 5):
            exact = x[:t].float() @ weight + b
            torch.testing.assert_close(lin(x[:t]).float(), exact, rtol=2e-2, atol=2e-2)
            torch.testing.assert_close(lin(x[:t], r[:t]).float(), exact + r[:t].float(), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("scaling", [RopeScaling(),
                                     RopeScaling("yarn", factor=4.0, original_max_position_embeddings=64)])
def test_rope_rotation_matrix_matches_elementwise(scaling):
    """Small CPU passes rotate q/k with one matmul by per-position matrices; larger ones element-wise.
    Both are the half-split rotation."""
    cfg = ModelConfig("llama", 32, 64, 128, 1, 4, 2, 16, 1e-5, 10000.0, 256, True, False, False, scaling)
    rope = RotaryEmbedding(cfg, 256)
    positions = torch.tensor([0, 5, 63, 200])
    x = torch.randn(4, 6, 16)
    tables = rope.tables(positions, torch.float32)
    longer = rope.tables(torch.arange(ROTATION_MAX_TOKENS + 1), torch.float32)
    assert tables.rotation is not None and longer.rotation is None
    cos, sin = tables.cos, tables.sin
    expected = x * cos + torch.cat((-x[..., 8:], x[..., :8]), dim=-1) * sin
    torch.testing.assert_close(rope.apply_one(tables, x), expected, rtol=1e-6, atol=1e-6)
    tables.rotation = None
    torch.testing.assert_close(rope.apply_one(tables, x), expected, rtol=0, atol=0)
    # bf16: the matmul runs in fp32 (one rounding at the end) up to ROTATION_MAX_TOKENS_LOW_PRECISION
    low = rope.tables(positions, torch.bfloat16)
    assert low.rotation is not None and low.rotation.dtype == torch.float32
    assert rope.tables(torch.arange(ROTATION_MAX_TOKENS_LOW_PRECISION + 1), torch.bfloat16).rotation is None
    xb = x.bfloat16()
    y = rope.apply_one(low, xb)
    exact = xb.float() * cos + torch.cat((-xb[..., 8:], xb[..., :8]), dim=-1).float() * sin
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y.float(), exact, rtol=2**-8, atol=1e-6)  # the fp32 result rounded once


def test_bf16_close_to_hf_bf16(tmp_path):
    path = make_tiny_model(tmp_path / "bf", "qwen3")
    hf = _hf(path, torch.bfloat16)
    with ak.Engine(str(path), dtype="bfloat16", num_slots=1024) as engine:
        ids = engine.tokenizer.encode(TEXT)
        with torch.no_grad():
            ref = hf(torch.tensor([ids])).logits[0]
        ours, _ = engine_logits(engine, ids)
        assert rel_error(ours, ref) < 2e-2  # bf16 rounding; same op order keeps it small


# ---- the embedded SmolLM2-135M-Instruct ---------------------------------------------------------

CHAT_PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about autumn leaves.",
    "Explain what a hash map is in two sentences.",
    "List three fruits that are red.",
    "How many legs does a spider have?",
]


@pytest.fixture(scope="module")
def smollm():
    # the weights dequantized as HF dequantizes them: the model code against HF's, exactly (kept in
    # their Q4_1 blocks, decode reads x as int8 blocks: test_embedded_kept_weights_answer_alike)
    engine = ak.Engine(num_slots=8192, quantized_weights=False)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def hf_smollm():
    from agentkv.engine.loader import embedded_model_path

    path = embedded_model_path()
    return transformers.AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32).eval()


def hf_logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0]


@requires_embedded
@pytest.mark.slow
def test_embedded_logits_match_hf(smollm, hf_smollm):
    plain = smollm.tokenizer.encode("Zebras graze quietly while " + TEXT)
    ours, cached = engine_logits(smollm, plain)
    assert cached == 0 and rel_error(ours, hf_logits(hf_smollm, plain)) < 1e-4
    chat = smollm.tokenizer.encode(smollm.render([{"role": "user", "content": CHAT_PROMPTS[0]}]))
    ours, cached = engine_logits(smollm, chat, cached_prefix=20)
    assert cached == 20 and rel_error(ours, hf_logits(hf_smollm, chat)[20:]) < 1e-4


@requires_embedded
@pytest.mark.slow
def test_embedded_greedy_matches_hf_generate(smollm, hf_smollm):
    prompts = [smollm.tokenizer.encode(smollm.render([{"role": "user", "content": p}])) for p in CHAT_PROMPTS]
    outs = smollm.generate(prompts, max_tokens=32, temperature=0.0, ignore_eos=True)  # one batch
    for ids, out in zip(prompts, outs):
        x = torch.tensor([ids])
        # an explicit mask: otherwise HF masks every <|im_end|> in the prompt, since it is also the pad token
        expected = hf_smollm.generate(
            x, attention_mask=torch.ones_like(x), max_new_tokens=32, do_sample=False, eos_token_id=None)
        assert out.token_ids == expected[0, len(ids) :].tolist()


@requires_embedded
@pytest.mark.slow
def test_embedded_kept_weights_answer_alike(smollm):
    """The default engine keeps the file's Q4_1 blocks and reads x as int8 blocks in decode, as
    llama.cpp does: its greedy answers start as the exact model's (the first 6 tokens of each: past
    them a near tie can fall either way)."""
    prompts = [smollm.tokenizer.encode(smollm.render([{"role": "user", "content": p}])) for p in CHAT_PROMPTS]
    with ak.Engine(num_slots=8192) as kept:
        fast = kept.generate(prompts, max_tokens=8, temperature=0.0, ignore_eos=True)
    exact = smollm.generate(prompts, max_tokens=8, temperature=0.0, ignore_eos=True)
    assert [o.token_ids[:6] for o in fast] == [o.token_ids[:6] for o in exact]

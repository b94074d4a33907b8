"""Gemma 4 GGUF files, as llama.cpp's converter writes them (its `gguf` package's tensor names for the
architecture, its converter's renames and hyperparameters: the two head widths, KV heads a layer,
the window pattern a layer, the shared-KV layers, the MLP's width a layer, the full layers' rope as a
`rope_freqs` tensor, norms as they are): checked against transformers on the same weights, the
matrices kept in their blocks where the kernels take them, and the "gemma4" tokenizer against a
`tokenizers` BPE of Gemma's form."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import agentkv as ak
from tests.engine.test_loading import gguf_writer
from tests.reference import assert_matches_hf, engine_logits, rel_error
from tests.tiny_families import make_family_model

gguf = pytest.importorskip("gguf")

# 26B-A4B's form: experts beside each layer's MLP, no per-layer inputs, values of their own, no shared layers
MOE = {"enable_moe_block": True, "num_experts": 4, "top_k_experts": 2, "moe_intermediate_size": 32,
       "hidden_size_per_layer_input": 0, "num_kv_shared_layers": 0, "attention_k_eq_v": False,
       "use_double_wide_mlp": False}
TEXT = "The quick brown fox jumps over the lazy dog, then naps in the warm afternoon sun."


def gguf_tensor_name(name: str, layers: int) -> str:
    """llama.cpp's name for an HF Gemma 4 tensor: its converter's renames (a layer's scalar and the experts'
    fused tensors take `.weight`; the router's scale and the experts' scales are `.scale`s of the router and
    of the experts' down projection), then its `gguf` package's map for the architecture."""
    if name.endswith("router.scale"):
        return f"blk.{name.split('.')[2]}.ffn_gate_inp.scale"
    if name.endswith("router.per_expert_scale"):
        return f"blk.{name.split('.')[2]}.ffn_down_exps.scale"
    if name.endswith("layer_scalar") or ".experts." in name:
        name += ".weight"
    mapped = gguf.get_tensor_name_map(gguf.MODEL_ARCH.GEMMA4, layers).get_name(name, try_suffixes=(".weight",))
    assert mapped, f"the gguf package has no Gemma 4 name for {name}"
    return mapped


def write_gemma4_gguf(src, out, quant: str | None = None) -> dict[str, np.ndarray]:
    """The tiny HF Gemma 4 checkpoint `src` as llama.cpp's converter writes it, its matrices in `quant`
    where their rows are whole blocks; returns the HF tensors it holds, dequantized."""
    from safetensors.numpy import load_file

    cfg = json.loads((src / "config.json").read_text())
    layers, types = cfg["num_hidden_layers"], cfg["layer_types"]
    swa = [t == "sliding_attention" for t in types]
    full_dim = cfg["per_layer_config"][str(swa.index(False))].get("head_dim", cfg["head_dim"])
    rope = cfg["rope_parameters"]
    w = gguf_writer(out, "gemma4", {**cfg, "rope_theta": rope["full_attention"]["rope_theta"]})
    w.add_rope_freq_base_swa(rope["sliding_attention"]["rope_theta"])
    w.add_key_length(full_dim)
    w.add_value_length(full_dim)
    w.add_key_length_swa(cfg["head_dim"])
    w.add_value_length_swa(cfg["head_dim"])
    w.add_rope_dimension_count(full_dim)
    w.add_rope_dimension_count_swa(cfg["head_dim"])
    w.add_sliding_window(cfg["sliding_window"])
    w.add_sliding_window_pattern(swa)
    w.add_shared_kv_layers(cfg["num_kv_shared_layers"])
    w.add_embedding_length_per_layer_input(cfg["hidden_size_per_layer_input"] or 0)
    if cfg.get("final_logit_softcapping"):
        w.add_final_logit_softcapping(cfg["final_logit_softcapping"])
    if cfg.get("enable_moe_block"):
        w.add_expert_count(cfg["num_experts"])
        w.add_expert_used_count(cfg["top_k_experts"])
        w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
    # (gguf_writer wrote the KV heads and the MLP's width as one number; llama.cpp writes a number a layer
    # where the full layers' KV heads differ, or the shared layers' MLP is twice as wide)
    w.kv_data[0].pop("gemma4.attention.head_count_kv")
    w.kv_data[0].pop("gemma4.feed_forward_length")
    kv_full = cfg["per_layer_config"][str(swa.index(False))].get("num_key_value_heads", cfg["num_key_value_heads"])
    w.add_head_count_kv([cfg["num_key_value_heads"] if s else kv_full for s in swa])
    first_shared = layers - cfg["num_kv_shared_layers"]
    ff = cfg["intermediate_size"]
    w.add_feed_forward_length([ff * 2 if cfg["use_double_wide_mlp"] and i >= first_shared else ff
                               for i in range(layers)])
    if rope["full_attention"].get("rope_type") == "proportional":  # the pairs that rotate, then those that stay
        turning = int(full_dim * rope["full_attention"]["partial_rotary_factor"] / 2)
        w.add_tensor("rope_freqs.weight", np.array([1.0] * turning + [1e30] * (full_dim // 2 - turning), np.float32))
    deq = {}
    for name, t in load_file(str(src / "model.safetensors")).items():
        data = t.astype(np.float32)
        gname = gguf_tensor_name(name, layers)
        # (llama.cpp's quantize keeps the routers in F32)
        matrix = data.ndim >= 2 and data.shape[-1] % 32 == 0 and not gname.endswith(("norm.weight",
                                                                                      "ffn_gate_inp.weight"))
        if quant and matrix:
            kind = getattr(gguf.GGMLQuantizationType, quant)
            q = gguf.quants.quantize(data, kind)
            w.add_tensor(gname, q, raw_shape=q.shape, raw_dtype=kind)
            deq[name] = gguf.quants.dequantize(q, kind).reshape(data.shape)
        else:
            w.add_tensor(gname, np.ascontiguousarray(data))
            deq[name] = data
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return deq


@pytest.fixture(scope="module")
def e2b(tmp_path_factory):
    """E2B's form (tests/tiny_families.py): full layers twice as wide with one KV head whose values are its
    keys' projection and a quarter of their pairs rotating, two layers reading others' KV with an MLP twice
    as wide, per-layer inputs, capped logits."""
    return make_family_model(tmp_path_factory.mktemp("gemma4") / "e2b", "gemma4_text")


def test_a_gemma4_gguf_gives_transformers_logits_and_tokens(e2b, tmp_path, monkeypatch):
    """Checked to fail with the norms' 1 taken off as Gemma 3's are, with the rope_freqs' proportion
    ignored, and with k_eq_v read as off."""
    import transformers

    from agentkv.engine.model_config import ModelConfig

    monkeypatch.setenv("AGENTKV_CACHE_DIR", str(tmp_path / "cache"))
    write_gemma4_gguf(e2b, tmp_path / "e2b.gguf")
    hf = transformers.AutoModelForCausalLM.from_pretrained(e2b, dtype=torch.float32).eval()
    expected = ModelConfig.from_hf(json.loads((e2b / "config.json").read_text()))
    with ak.Engine(str(tmp_path / "e2b.gguf"), num_slots=1024) as engine:
        mc = engine.model_config
        for field in ("family", "layer_windows", "head_dim", "num_kv_heads", "global_head_dim", "global_kv_heads",
                      "k_eq_v", "kv_shared_layers", "per_layer_input_size", "per_layer_vocab", "double_wide_mlp",
                      "intermediate_size", "rope_theta", "local_rope_theta", "final_softcap", "attention_scale",
                      "rotary_dim", "tie_word_embeddings"):
            assert getattr(mc, field) == getattr(expected, field), field
        assert (mc.rope_scaling.rope_type, mc.rope_scaling.proportion) == ("proportional", 0.25)
    assert_matches_hf(tmp_path / "e2b.gguf", hf, TEXT, 12)


@pytest.mark.parametrize("form", ["e2b", "moe"])
def test_a_quantized_gemma4_gguf_keeps_its_blocks(e2b, tmp_path, monkeypatch, caplog, form):
    """Q8_0: the attention's, MLP's, experts', per-layer projections' and per-layer table's blocks kept (no
    "dequantized at load" notice), and the logits those of the HF directory holding the same weights."""
    from safetensors.numpy import save_file

    from agentkv.engine.linear import QuantEmbedding
    from agentkv.engine.model import Linear
    from agentkv.kernels import cpu_native

    monkeypatch.setenv("AGENTKV_CACHE_DIR", str(tmp_path / "cache"))
    src = e2b if form == "e2b" else make_family_model(tmp_path / "moe", "gemma4_text", config=MOE)
    if form == "e2b":  # (a per-layer table whose rows are whole blocks, so that it is kept)
        src = make_family_model(tmp_path / "e2b", "gemma4_text", config={"hidden_size_per_layer_input": 16})
    deq = write_gemma4_gguf(src, tmp_path / "q.gguf", "Q8_0")
    save_file({k: np.ascontiguousarray(v) for k, v in deq.items()}, str(src / "model.safetensors"))
    with (ak.Engine(str(src), num_slots=1024) as ref,
          ak.Engine(str(tmp_path / "q.gguf"), num_slots=1024, quantized_weights=False) as exact):
        ids = ref.tokenizer.encode(TEXT)
        expected = engine_logits(ref, ids)[0]
        assert rel_error(engine_logits(exact, ids)[0], expected) < 1e-4  # the conversion: the same weights
    caplog.clear()
    with caplog.at_level("WARNING", logger="agentkv"), ak.Engine(str(tmp_path / "q.gguf"), num_slots=1024) as kept:
        assert rel_error(engine_logits(kept, ids)[0], expected) < 5e-2  # (int8 x for the kept blocks)
        named = dict(kept._core.runner.model.named_modules())
    if cpu_native.load() is None:
        return
    assert "dequantized at load" not in caplog.text
    linears = {n: m for n, m in named.items() if isinstance(m, Linear)}
    assert linears["layers.0.self_attn.qkv_proj"].quantized is not None
    assert linears["layers.0.mlp.gate_up_proj"].quantized is not None
    if form == "moe":
        assert all(m.quantized is not None for n, m in linears.items() if ".experts." in n)
    else:
        assert linears["layers.0.per_layer_gate_proj"].quantized is not None
        assert linears["per_layer_inputs.per_layer_model_proj"].quantized is not None
        assert isinstance(named["per_layer_inputs.table"], QuantEmbedding)


def test_the_gemma4_tokenizer_is_gemmas_bpe(tmp_path, monkeypatch):
    """A `tokenizers` BPE of Gemma's form (spaces as ▁, byte fallback, newlines apart), trained here,
    written as a "gemma4" GGUF vocabulary (tokens, merges, types): the GGUF's tokenizer gives its ids
    and text back, unknown characters as their bytes' tokens."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    from agentkv.engine.gguf_tokenizer import tokenizer_files_from_gguf

    bytes_ = [f"<0x{b:02X}>" for b in range(256)]
    ref = Tokenizer(models.BPE(byte_fallback=True, fuse_unk=False))
    ref.normalizer = normalizers.Replace(" ", "\u2581")
    ref.pre_tokenizer = pre_tokenizers.Split(Regex("[^\\n]+|[\\n]+"), behavior="isolated")
    ref.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    corpus = [TEXT, "def f(x):\n    return x * 2\n\n", "Ünïcödé façade, naïve café — ½ ≠ ∞.", "aaaa bbbb aaaa\n\n\n",
              "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}"] * 20
    ref.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=400, special_tokens=["<pad>", "<bos>", "<eos>",
                                                                                        *bytes_]))
    data = json.loads(ref.to_str())
    # a merge across a newline, first in rank: the newline cut keeps "o" and "\n" apart all the same
    data["model"]["vocab"]["o\n"] = len(data["model"]["vocab"])
    data["model"]["merges"].insert(0, ["o", "\n"])
    ref = Tokenizer.from_str(json.dumps(data))
    vocab = sorted(data["model"]["vocab"].items(), key=lambda kv: kv[1])
    tokens = [t for t, _ in vocab]
    merges = [" ".join(m) if isinstance(m, list) else m for m in data["model"]["merges"]]
    types = [3 if t in ("<pad>", "<bos>", "<eos>") else 6 if t in bytes_ else 1 for t in tokens]
    meta = {"tokenizer.ggml.model": "gemma4", "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.merges": merges,
            "tokenizer.ggml.token_type": types, "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2,
            "tokenizer.ggml.add_bos_token": True}
    tokenizer_files_from_gguf(meta, tmp_path / "t.gguf", tmp_path)
    ours = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    texts = [*corpus[:5], "hello\nworld, two\n", "  leading spaces and trailing  ", "line one\nline two\r\n\ttabbed",
             "日本語のテキスト 🙂", "aaaaaaaa\n\nbbbb", ""]
    for text in texts:
        want = ref.encode(text).ids
        got = ours.encode(text, add_special_tokens=False).ids
        assert got == want, text
        assert ours.decode(got) == text  # (the trainer's byte tokens are special to it: its decode drops them)
    assert any(i in range(3, 259) for i in ours.encode("日本語").ids)  # (characters it never saw: their bytes)


def test_a_gguf_ends_where_llama_cpp_ends_by_the_tokens_text():
    """llama.cpp ends generation at tokens by their text whatever the metadata names (Gemma 4's files name
    <eos>, and its turns end at <turn|>), with its exceptions (harmony's <|end|>, Gemma 4's </s>)."""
    from agentkv.engine.gguf_tokenizer import _ends_by_text

    gemma4 = ["<pad>", "<eos>", "<bos>", "</s>", "<|turn>", "<turn|>", "<|tool_response>", "hello"]
    assert _ends_by_text(gemma4) == {1, 5, 6}
    harmony = ["<|start|>", "<|end|>", "<|message|>", "<|return|>", "<|call|>", "<|endoftext|>"]
    assert _ends_by_text(harmony) == {3, 4, 5}
    assert _ends_by_text(["<s>", "</s>", "<|end|>", "x"]) == {1, 2}  # (Phi-3's <|end|> ends its turns)

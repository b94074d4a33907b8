"""Model loading: GGUF conversion (quantized tensors, q/k permutation, tokenizer), the disk cache, errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import agentkv as ak
from agentkv.engine import gguf_convert, gguf_names
from tests.conftest import requires_embedded
from tests.reference import engine_logits, rel_error
from tests.tiny import SPECIALS, make_tiny_model

gguf = pytest.importorskip("gguf")


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    # what llama.cpp's converter does to q/k rows (the inverse of our _unpermute_qk)
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def gguf_writer(out_path, arch: str, cfg: dict, byte_tokenizer: bool = True):
    """A GGUFWriter for `arch` with the tiny checkpoint's hyperparameters (`cfg`, its config.json)
    and (`byte_tokenizer`) the byte tokenizer's vocabulary, as llama.cpp's converter writes them."""
    from tokenizers.pre_tokenizers import ByteLevel

    w = gguf.GGUFWriter(str(out_path), arch)
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_rope_freq_base(cfg["rope_theta"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    if not byte_tokenizer:
        return w
    tokens = list(SPECIALS) + sorted(ByteLevel.alphabet())
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([3] * len(SPECIALS) + [1] * (len(tokens) - len(SPECIALS)))
    w.add_token_merges([])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    return w


def write_gguf(src_dir, out_path, quant=gguf.GGMLQuantizationType.Q8_0):
    """Write the tiny HF checkpoint in `src_dir` as a llama GGUF; returns the dequantized HF tensors."""
    from safetensors.numpy import load_file

    cfg = json.loads((src_dir / "config.json").read_text())
    hf = load_file(str(src_dir / "model.safetensors"))
    w = gguf_writer(out_path, "llama", cfg)
    w.add_chat_template(
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}")
    names = {v: k for k, v in gguf_names.GLOBAL_NAMES.items()}
    dequantized = {}
    for name, t in hf.items():
        if name in names:
            gname = names[name]
        else:
            i, rest = name[len("model.layers.") :].split(".", 1)
            gname = f"blk.{i}." + {v: k for k, v in gguf_names.LAYER_NAMES.items()}[rest]
        data = t.astype(np.float32)
        if gname.endswith("attn_q.weight"):
            data = _permute(data, cfg["num_attention_heads"])
        elif gname.endswith("attn_k.weight"):
            data = _permute(data, cfg["num_key_value_heads"])
        if data.ndim == 2:
            q = gguf.quants.quantize(data, quant)
            w.add_tensor(gname, q, raw_shape=q.shape, raw_dtype=quant)
            deq = gguf.quants.dequantize(q, quant).reshape(t.shape)
        else:
            w.add_tensor(gname, data)
            deq = data
        if gname.endswith("attn_q.weight"):
            deq = gguf_convert._unpermute_qk(deq, cfg["num_attention_heads"])
        elif gname.endswith("attn_k.weight"):
            deq = gguf_convert._unpermute_qk(deq, cfg["num_key_value_heads"])
        dequantized[name] = np.ascontiguousarray(deq)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dequantized


@pytest.mark.parametrize("quant", ["Q8_0", "F16", "Q4_0"])
def test_gguf_equals_hf_dir_with_the_same_weights(tmp_path, monkeypatch, quant):
    from safetensors.numpy import save_file

    monkeypatch.setenv("AGENTKV_CACHE_DIR", str(tmp_path / "cache"))
    src = make_tiny_model(tmp_path / "src", "llama", hidden=64, heads=4, kv_heads=2)
    deq = write_gguf(src, tmp_path / "tiny.gguf", getattr(gguf.GGMLQuantizationType, quant))
    # the HF directory holding exactly the dequantized weights is the reference
    save_file(deq, str(src / "model.safetensors"))
    with ak.Engine(str(src), num_slots=512) as ref, ak.Engine(str(tmp_path / "tiny.gguf"), num_slots=512) as ours:
        text = "Hello GGUF world, quantized and permuted!"
        ids = ours.tokenizer.encode(text)
        assert ids == ref.tokenizer.encode(text)
        assert ours.tokenizer.eos_ids == {0, 2}  # its EOS, and <|endoftext|>: llama.cpp ends at it by its text
        assert rel_error(engine_logits(ours, ids)[0], engine_logits(ref, ids)[0]) < 1e-5
        chat = [{"role": "user", "content": "hi"}]
        assert ours.render(chat, add_generation_prompt=False) == "<|im_start|>user\nhi<|im_end|>\n"


@pytest.mark.parametrize("quant", ["Q8_0", "Q4_0", "Q4_1"])
def test_quantized_weights_kept_in_their_blocks(tmp_path, monkeypatch, quant):
    """Kept quantized (the default where the C kernels run): a prompt's rows through the weight
    dequantized once equal the dequantized model's; a decode row, with x read as int8 blocks as
    llama.cpp reads it, stays close to them; and the weights take the file's bytes, not fp32's."""
    from agentkv.engine.model import Linear, QuantEmbedding
    from agentkv.kernels import cpu_native

    if cpu_native.load() is None:
        pytest.skip("agentkv's C kernels do not build here")
    monkeypatch.setenv("AGENTKV_CACHE_DIR", str(tmp_path / "cache"))
    src = make_tiny_model(tmp_path / "src", "llama", hidden=64, heads=4, kv_heads=2)
    write_gguf(src, tmp_path / "tiny.gguf", getattr(gguf.GGMLQuantizationType, quant))
    path = str(tmp_path / "tiny.gguf")
    with ak.Engine(path, num_slots=512) as kept, ak.Engine(path, num_slots=512, quantized_weights=False) as plain:
        model = kept._core.runner.model
        linears = [m for m in model.modules() if isinstance(m, Linear)]
        assert all(m.quantized is not None and m.weight is None for m in linears)
        assert isinstance(model.embed_tokens, QuantEmbedding)
        ids = kept.tokenizer.encode("Hello GGUF world, quantized and kept in blocks!")
        assert rel_error(engine_logits(kept, ids)[0], engine_logits(plain, ids)[0]) < 1e-5
        one, cached = engine_logits(kept, ids, cached_prefix=len(ids) - 1)
        assert cached == len(ids) - 1
        # (int8 activations through every layer of a random model: the kernel itself is checked exactly
        # in test_quant_kernels.py)
        assert rel_error(one, engine_logits(plain, ids, cached_prefix=len(ids) - 1)[0]) < 0.1


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads Linux's /proc/self/maps")
def test_a_loaded_gguf_lets_its_converted_file_go(tmp_path, monkeypatch):
    """Once loaded, no weight is a view of quant.safetensors (whose mapping would stay, its pages counted as the
    process's): the linears are in tiles, the embedding in memory of its own, an untied vocabulary projection's
    blocks as read not kept beside its tiles."""
    from agentkv.kernels import cpu_native

    kernels = cpu_native.load()
    if kernels is None or not kernels.qtile_fast:
        pytest.skip("the tiled kernels do not run here")
    monkeypatch.setenv("AGENTKV_CACHE_DIR", str(tmp_path / "cache"))
    src = make_tiny_model(tmp_path / "src", "llama", hidden=64, heads=4, kv_heads=2, tie=False)
    write_gguf(src, tmp_path / "tiny.gguf")
    with ak.Engine(str(tmp_path / "tiny.gguf"), num_slots=512) as engine:
        engine.generate(["hello"], max_tokens=2)
        maps = Path("/proc/self/maps").read_text()
        model = engine._core.runner.model
        assert model.lm_head is not None and model.lm_head.quantized is model.logits_proj.weight
    quant = gguf_convert.converted_dir(tmp_path / "tiny.gguf") / "quant.safetensors"
    assert quant.exists() and str(quant) not in maps


@pytest.mark.slow
@requires_embedded
def test_the_embedded_q4_1_file_stays_its_size_in_memory():
    from agentkv.engine.loader import embedded_model_path
    from agentkv.kernels import cpu_native

    if cpu_native.load() is None:
        pytest.skip("blocks are kept only where agentkv's C kernels run")

    tensors = sum(int(t.n_bytes) for t in gguf.GGUFReader(str(embedded_model_path())).tensors)
    with ak.Engine(num_slots=1024) as engine:
        kept = engine.stats()["weight_bytes"]
    with ak.Engine(num_slots=1024, quantized_weights=False) as engine:
        plain = engine.stats()["weight_bytes"]
    assert kept <= 1.3 * tensors < plain, (kept, tensors, plain)


def test_conversion_is_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("AGENTKV_CACHE_DIR", str(tmp_path / "cache"))
    src = make_tiny_model(tmp_path / "src", "llama")
    write_gguf(src, tmp_path / "m.gguf")
    first = gguf_convert.converted_dir(tmp_path / "m.gguf")

    def boom(*a, **k):
        raise AssertionError("converted twice")

    monkeypatch.setattr(gguf_convert, "_convert", boom)
    assert gguf_convert.converted_dir(tmp_path / "m.gguf") == first


def test_a_change_to_the_converter_converts_again(tmp_path, monkeypatch):
    """The cached directory is named by the sources of every module that decides what a conversion writes
    (gguf_convert and each engine module it builds the directory with), so an upgrade never serves a
    directory an older converter wrote."""
    import agentkv.engine as engine_pkg

    monkeypatch.setenv("AGENTKV_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    # (gguf_transcode runs at load, on the directory: not part of it)
    helpers = {p.stem for p in Path(engine_pkg.__file__).parent.glob("gguf_*.py")} - {"gguf_transcode"}
    assert helpers <= {m.__name__.rsplit(".", 1)[1] for m in gguf_convert.CONVERTER_MODULES}
    names = set()
    real = Path.read_bytes
    for module in gguf_convert.CONVERTER_MODULES:
        changed = Path(module.__file__)
        monkeypatch.setattr(Path, "read_bytes", lambda p, c=changed: real(p) + b"#" if p == c else real(p))
        gguf_convert.conversion_version.cache_clear()
        monkeypatch.setattr(gguf_convert, "_convert", lambda path, out: (out / "model.safetensors").touch()
                            or (out / "config.json").touch())
        names.add(gguf_convert.converted_dir(tmp_path / "m.gguf").name)
    monkeypatch.setattr(Path, "read_bytes", real)
    gguf_convert.conversion_version.cache_clear()
    assert len(names) == len(gguf_convert.CONVERTER_MODULES)


def test_a_new_conversion_removes_the_older_ones_of_its_file(tmp_path, monkeypatch):
    """A file converted again (its converter changed, or the file did) leaves one directory, not a copy a
    conversion; another file's stays."""
    monkeypatch.setenv("AGENTKV_CACHE_DIR", str(tmp_path / "cache"))
    src = make_tiny_model(tmp_path / "src", "llama")
    write_gguf(src, tmp_path / "m.gguf")
    (tmp_path / "other").mkdir()
    write_gguf(src, tmp_path / "other" / "m.gguf")
    other = gguf_convert.converted_dir(tmp_path / "other" / "m.gguf")
    first = gguf_convert.converted_dir(tmp_path / "m.gguf")
    monkeypatch.setattr(gguf_convert, "conversion_version", lambda: "a newer converter")
    second = gguf_convert.converted_dir(tmp_path / "m.gguf")
    assert second != first and not first.exists() and (second / "model.safetensors").exists()
    assert other.exists() and sorted(p.name for p in (tmp_path / "cache" / "gguf").iterdir()) == sorted(
        [other.name, second.name])


def test_load_errors_name_the_problem(tmp_path, monkeypatch):
    monkeypatch.setenv("AGENTKV_CACHE_DIR", str(tmp_path / "cache"))
    bad = tmp_path / "garbage.gguf"
    bad.write_bytes(b"not a gguf file at all" * 10)
    with pytest.raises(ak.ModelLoadError, match="not a readable GGUF"):
        ak.Engine(str(bad))
    (tmp_path / "weights.bin").write_text("x")
    with pytest.raises(ak.ModelLoadError, match="not a .gguf"):
        ak.Engine(str(tmp_path / "weights.bin"))

    d = make_tiny_model(tmp_path / "arch", "llama")
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"}))
    with pytest.raises(ak.ModelLoadError, match="unsupported architecture.*LlamaForCausalLM"):
        ak.Engine(str(d))

    d = make_tiny_model(tmp_path / "corrupt", "llama")
    blob = (d / "model.safetensors").read_bytes()
    (d / "model.safetensors").write_bytes(blob[: len(blob) // 2])
    with pytest.raises(ak.ModelLoadError, match="corrupt or truncated"):
        ak.Engine(str(d))

    d = make_tiny_model(tmp_path / "missing", "llama")
    from safetensors.torch import load_file, save_file

    w = load_file(str(d / "model.safetensors"))
    del w["model.layers.1.mlp.up_proj.weight"]
    save_file(w, str(d / "model.safetensors"))
    with pytest.raises(ak.ModelLoadError, match="up_proj"):
        ak.Engine(str(d))

    d = make_tiny_model(tmp_path / "nan", "llama")
    w = load_file(str(d / "model.safetensors"))
    w["model.norm.weight"][3] = float("nan")
    save_file(w, str(d / "model.safetensors"))
    with pytest.raises(ak.ModelLoadError, match="NaN"):
        ak.Engine(str(d))

    (tmp_path / "empty").mkdir()
    with pytest.raises(ak.ModelLoadError, match="no config.json"):
        ak.Engine(str(tmp_path / "empty"))


@requires_embedded
@pytest.mark.slow
def test_embedded_tokenizer_matches_hf_conversion():
    transformers = pytest.importorskip("transformers")
    from agentkv.engine.loader import embedded_model_path, resolve_model_dir
    from agentkv.engine.tokenizer import Tokenizer

    path = embedded_model_path()
    ours = Tokenizer(resolve_model_dir(None))
    hf = transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    texts = [
        "Hello world, how are you?",
        "  leading spaces\n\n\ttabs and newlines  ",
        "Numbers 12345 and 3.14159, dates 2026-11-29.",
        "Ünïcödé — “quotes” and emoji 🙂 and 漢字",
        "<|im_start|>user\nWhat's up?<|im_end|>\n<|im_start|>assistant\n",
        "def f(x):\n    return x ** 2  # comment",
    ]
    for t in texts:
        assert ours.encode(t) == hf.encode(t, add_special_tokens=False), t
        assert ours.decode(ours.encode(t), skip_special_tokens=False) == t
    messages = [{"role": "user", "content": "Hi there"}]
    assert ours.apply_chat_template(messages) == hf.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True)

"""GGUF files whose tokenizer is SentencePiece (`tokenizer.ggml.model = "llama"`: Llama 2, Mistral v0.1,
Phi-3, Gemma): read into the engine's tokenizer, tokenizing as SentencePiece itself does (the
reference llama.cpp's SPM tokenizer follows: the highest-scored merge first, byte fallback, `▁`
for spaces with one before the text), decoding back to the text, and generating under a grammar."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest

import agentkv as ak
from agentkv.engine import gguf_names
from tests.engine.test_loading import gguf_writer
from tests.tiny import make_tiny_model

gguf = pytest.importorskip("gguf")
spm = pytest.importorskip("sentencepiece")
hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

CORPUS = ["The agent read the record and kept its summary.", "Numbers 12345 and spaces   here, tabs\tand\nlines.",
          "Tokens: café, naïve, 東京 and the template's [INST] marks."] * 40
TEMPLATE = "{{ bos_token }}{% for m in messages %}[INST] {{ m['content'] }} [/INST]{% endfor %}"


def _sentencepiece(vocab_size: int = 320, prefix: bool = True):
    """A SentencePiece BPE model trained as Llama's was (identity normalization, a dummy prefix,
    byte fallback, digits split); `prefix=False`: without the dummy prefix, as Gemma's."""
    out = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS), model_writer=out, model_type="bpe", vocab_size=vocab_size,
        byte_fallback=True, normalization_rule_name="identity", add_dummy_prefix=prefix, remove_extra_whitespaces=False,
        split_digits=True, allow_whitespace_only_pieces=True, character_coverage=1.0, hard_vocab_limit=False,
        minloglevel=2)
    return spm.SentencePieceProcessor(model_proto=out.getvalue())


def _token_type(sp, i: int) -> int:
    """llama.cpp's token types: 2 unknown, 3 control, 6 byte, 1 normal."""
    return 2 if sp.is_unknown(i) else 3 if sp.is_control(i) else 6 if sp.is_byte(i) else 1


def write_spm_gguf(tmp_path, sp, prefix: bool | None = True):
    """A tiny random llama GGUF whose vocabulary is `sp`'s, written as llama.cpp's converter writes
    a SentencePiece tokenizer (`prefix`: its add_space_prefix; None: the key left out, as older
    conversions do)."""
    from safetensors.numpy import load_file

    src = make_tiny_model(tmp_path / "src", "llama")
    cfg = json.loads((src / "config.json").read_text())
    hf = load_file(str(src / "model.safetensors"))
    n = sp.get_piece_size()
    hf["model.embed_tokens.weight"] = np.random.default_rng(0).normal(0, 0.5, (n, cfg["hidden_size"]))
    path = tmp_path / "spm.gguf"
    w = gguf_writer(path, "llama", cfg, byte_tokenizer=False)
    w.add_tokenizer_model("llama")
    w.add_token_list([sp.id_to_piece(i) for i in range(n)])
    w.add_token_scores([sp.get_score(i) for i in range(n)])
    w.add_token_types([_token_type(sp, i) for i in range(n)])
    w.add_unk_token_id(sp.unk_id())
    w.add_bos_token_id(sp.bos_id())
    w.add_eos_token_id(sp.eos_id())
    w.add_add_bos_token(True)
    if prefix is not None:
        w.add_add_space_prefix(prefix)
    w.add_chat_template(TEMPLATE)
    names = {v: k for k, v in gguf_names.GLOBAL_NAMES.items()}
    layer_names = {v: k for k, v in gguf_names.LAYER_NAMES.items()}
    for name, t in hf.items():
        if name in names:
            gname = names[name]
        else:
            i, rest = name[len("model.layers."):].split(".", 1)
            gname = f"blk.{i}.{layer_names[rest]}"
        w.add_tensor(gname, np.ascontiguousarray(t, dtype=np.float32))  # (q/k unpermuted: random weights either way)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def spm_engine(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("spm")
    mp = pytest.MonkeyPatch()
    mp.setenv("AGENTKV_CACHE_DIR", str(tmp / "cache"))
    sp = _sentencepiece()
    with ak.Engine(str(write_spm_gguf(tmp, sp)), num_slots=2048) as engine:
        yield engine, sp
    mp.undo()


TEXTS = [
    "The agent read the record.", " leading space", "two  spaces and a tab\there", "lines\nand\n\nmore lines",
    "café 東京 naïve", "unseen: ünïcode Ωmega 🙂 emoji", "digits 1234567890", "", " ", "trailing space ",
    "[INST] marks [/INST]", "the template's punctuation: (a), {b}; c!",
]


@pytest.mark.parametrize("text", TEXTS)
def test_tokens_are_sentencepieces(spm_engine, text):
    """Each text tokenizes as SentencePiece tokenizes it (byte fallback for characters it never
    saw) and decodes back to itself. Checked against a planted bug (no space before the text): it
    fails here."""
    engine, sp = spm_engine
    ids = engine.tokenizer.encode(text, add_bos=False)
    assert ids == sp.encode(text), (text, [engine.tokenizer.id_to_token(i) for i in ids],
                                    sp.encode(text, out_type=str))
    assert engine.tokenizer.decode(ids) == sp.decode(ids) == text


@settings(max_examples=150, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("The agent read its summary 0123 café東京 \t\n.,ü🙂")), max_size=40))
def test_any_text_tokenizes_as_sentencepiece(spm_engine, text):
    """Checked against a planted bug (merges ranked by the left piece's score instead of the joined
    piece's): it fails here."""
    engine, sp = spm_engine
    assert engine.tokenizer.encode(text, add_bos=False) == sp.encode(text)


def test_special_tokens_and_the_template(spm_engine):
    """BOS is added as the GGUF says; a special token in a prompt is that token, and the text after
    it starts with a space of its own, as llama.cpp tokenizes it (each piece of text between special
    tokens is SentencePiece's)."""
    engine, sp = spm_engine
    tok = engine.tokenizer
    assert tok.encode("hi") == [sp.bos_id(), *sp.encode("hi")]
    assert tok.encode("a</s>b", add_bos=False) == [*sp.encode("a"), sp.eos_id(), *sp.encode("b")]
    prompt = engine.render([{"role": "user", "content": "The agent"}])
    assert prompt == "<s>[INST] The agent [/INST]"
    assert tok.encode(prompt) == [sp.bos_id(), *sp.encode("[INST] The agent [/INST]")]
    assert tok.eos_ids == {sp.eos_id()}


def test_generation_under_a_grammar_on_a_sentencepiece_vocabulary(spm_engine):
    """The grammar layer reads `▁` and `<0xNN>` pieces as their bytes: a JSON output validates."""
    import jsonschema

    engine, _ = spm_engine
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}, "n": {"type": "integer"}},
              "required": ["city", "n"], "additionalProperties": False}
    out = engine.generate("The agent", json_schema=schema, max_tokens=120, temperature=1.0, seed=3)
    jsonschema.validate(json.loads(out.text), schema)


def test_a_file_that_does_not_say_takes_the_space_prefix(tmp_path, monkeypatch):
    """An older conversion leaves add_space_prefix out: SentencePiece's default (a `▁` before the text)
    holds, as its model with the default says (checked against a planted default of False: this fails)."""
    monkeypatch.setenv("AGENTKV_CACHE_DIR", str(tmp_path / "cache"))
    sp = _sentencepiece()
    with ak.Engine(str(write_spm_gguf(tmp_path, sp, prefix=None)), num_slots=512) as engine:
        for text in TEXTS:
            ids = engine.tokenizer.encode(text, add_bos=False)
            assert ids == sp.encode(text), text
            assert engine.tokenizer.decode(ids) == text


def test_without_the_space_prefix(tmp_path, monkeypatch):
    """Gemma's GGUF says add_space_prefix = false: no `▁` before the text, as its SentencePiece model."""
    monkeypatch.setenv("AGENTKV_CACHE_DIR", str(tmp_path / "cache"))
    sp = _sentencepiece(prefix=False)
    with ak.Engine(str(write_spm_gguf(tmp_path, sp, prefix=False)), num_slots=512) as engine:
        for text in TEXTS:
            ids = engine.tokenizer.encode(text, add_bos=False)
            assert ids == sp.encode(text), text
            assert engine.tokenizer.decode(ids) == text

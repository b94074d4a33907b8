"""Byte-level BPE GGUF tokenizers split text before their merges as llama.cpp does for each
`tokenizer.ggml.pre` the families agentkv runs write (gpt-oss's o200k "gpt-4o", DeepSeek V3's, GLM's,
LFM2's, Llama 3's, Qwen's, SmolLM's, Granite's "refact", a file's without one), and Kimi K2's as its own
tiktoken pattern does: a vocabulary trained with no split at all (its merges cross every boundary a
pre-tokenizer draws, so a boundary drawn wrong changes the ids) tokenizes mixed text, case runs,
contractions, digits, CJK and whitespace into the reference's ids. llama.cpp's are recorded in
tests/data/gguf_pretokenizer_ids.json (`python -m tests.engine.test_gguf_pretokenizers` records them again
where llama-cpp-python is installed, and a test checks them against it there). Kimi K2's reference is
tiktoken with Moonshot's pattern: llama-cpp-python 0.3.36's splitter gives other pieces ("isn" "'" "t",
" " "do"), where llama.cpp's current source follows the pattern."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentkv.engine.gguf_tokenizer import tokenizer_files_from_gguf

gguf = pytest.importorskip("gguf")

FIXTURE = Path(__file__).parent.parent / "data" / "gguf_pretokenizer_ids.json"
PRES = ["gpt-4o", "deepseek-v3", "glm4", "lfm2", "llama-bpe", "qwen2", "smollm", "refact", "default"]
CONTRACTION = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
# the patterns tiktoken's o200k_base and Moonshot's tokenization_kimi.py give (written out here: the reference)
TIKTOKEN_PATTERNS = {
    "gpt-4o": "|".join([
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+" + CONTRACTION,
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*" + CONTRACTION,
        r"\p{N}{1,3}", r" ?[^\s\p{L}\p{N}]+[\r\n/]*", r"\s*[\r\n]+", r"\s+(?!\S)", r"\s+"]),
    "kimi-k2": "|".join([
        r"[\p{Han}]+",
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+"
        + CONTRACTION,
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*"
        + CONTRACTION,
        r"\p{N}{1,3}", r" ?[^\s\p{L}\p{N}]+[\r\n]*", r"\s*[\r\n]+", r"\s+(?!\S)", r"\s+"]),
}
TEXTS = [
    "Hello World's HTMLParser isn't XMLHttpRequest-ready; THEY'LL do 12345 things.",
    "CamelCaseWords and ALLCAPS don't break: naïve café résumé Ñandú",
    "数字123和中文混合English文本。日本語のテキスト、カタカナ and 한국어",
    "a  b   c\r\n\r\nend   \n\n\tindented /path/to/file.py://x",
    "price: $1,234.56 (approx) — ok!!! <tag attr=\"v\">{\"k\": [1, 2]}</tag>",
]


EXTRA = "ĠXMLHttpRequest"  # a token no merge makes: Llama 3's pieces that are tokens are taken whole (ignore_merges)


def _vocab() -> tuple[list[str], list[str]]:
    """Tokens (in id order) and merges of a byte-level BPE trained on TEXTS with no pre-tokenization, and
    EXTRA last."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    trainer = trainers.BpeTrainer(vocab_size=600, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(TEXTS * 3, trainer)
    model = json.loads(tok.to_str())["model"]
    vocab = model["vocab"]
    tokens = sorted(vocab, key=vocab.get)
    assert EXTRA not in tokens
    tokens.append(EXTRA)
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    return tokens, merges


def _meta(pre: str, tokens: list[str], merges: list[str]) -> dict:
    return {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": pre, "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.merges": merges, "tokenizer.ggml.token_type": [1] * len(tokens)}


def _ours(pre: str, tmp_path: Path) -> list[list[int]]:
    from tokenizers import Tokenizer

    out = tmp_path / pre
    out.mkdir()
    tokenizer_files_from_gguf(_meta(pre, *_vocab()), out / "m.gguf", out)
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    return [tok.encode(text, add_special_tokens=False).ids for text in TEXTS]


def _llama_cpp(pre: str, tmp_path: Path) -> list[list[int]]:
    """llama.cpp's ids for TEXTS from a GGUF holding the vocabulary under `pre`."""
    import llama_cpp

    tokens, merges = _vocab()
    path = tmp_path / f"{pre}.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    for key, value in {"block_count": 1, "context_length": 64, "embedding_length": 32, "feed_forward_length": 64,
                       "attention.head_count": 2, "attention.layer_norm_rms_epsilon": 1e-6}.items():
        w.add_uint32(f"llama.{key}", value) if isinstance(value, int) else w.add_float32(f"llama.{key}", value)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types([1] * len(tokens))
    w.add_token_merges(merges)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    model = llama_cpp.Llama(str(path), vocab_only=True, verbose=False)
    return [model.tokenize(text.encode(), add_bos=False, special=False) for text in TEXTS]


@pytest.mark.parametrize("pre", PRES)
def test_a_gguf_tokenizer_splits_as_llama_cpp(pre, tmp_path):
    expected = json.loads(FIXTURE.read_text())
    assert _ours(pre, tmp_path) == expected[pre]


@pytest.mark.parametrize("pre", sorted(TIKTOKEN_PATTERNS))
def test_o200k_and_kimi_split_as_their_tiktoken_patterns(pre, tmp_path):
    """The vocabulary as tiktoken ranks (a token's rank its id: the trainer numbers merges in order) under the
    model's own pattern."""
    tiktoken = pytest.importorskip("tiktoken")
    from tokenizers.pre_tokenizers import ByteLevel

    tokens, _ = _vocab()
    alphabet = {c: i for i, c in enumerate(_bytes_to_unicode())}
    assert set(ByteLevel.alphabet()) == set(alphabet)
    ranks = {bytes(alphabet[c] for c in t): i for i, t in enumerate(tokens[:-1])}  # (EXTRA: no merge's)
    enc = tiktoken.Encoding(name=pre, pat_str=TIKTOKEN_PATTERNS[pre], mergeable_ranks=ranks, special_tokens={})
    assert _ours(pre, tmp_path) == [enc.encode_ordinary(text) for text in TEXTS]


def _bytes_to_unicode() -> list[str]:
    """GPT-2's byte-level alphabet: byte b's character, in byte order."""
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    extra = iter(range(256, 512))
    return [chr(b) if b in printable else chr(next(extra)) for b in range(256)]


def test_the_boundaries_matter():
    """(The test can fail: the pre-tokenizers give different ids on these texts.)"""
    expected = json.loads(FIXTURE.read_text())
    assert len({json.dumps(expected[p]) for p in PRES}) >= 6
    assert all((len(_vocab()[0]) - 1 in expected[p][0]) == (p in ("lfm2", "llama-bpe", "glm4")) for p in PRES)


def test_the_recorded_ids_are_llama_cpps(tmp_path):
    pytest.importorskip("llama_cpp")
    expected = json.loads(FIXTURE.read_text())
    for pre in PRES:
        assert _llama_cpp(pre, tmp_path) == expected[pre], pre


if __name__ == "__main__":  # record llama.cpp's ids
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        FIXTURE.write_text(json.dumps({pre: _llama_cpp(pre, Path(d)) for pre in PRES}) + "\n")

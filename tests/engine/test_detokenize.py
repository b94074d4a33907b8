"""Incremental detokenization: a request's text, decoded a few new tokens at a time, is the text of
all its tokens decoded at once, whatever the tokens (bytes that split characters, special tokens, a
SentencePiece decoder that drops a text's leading space), and no decode reads the whole output."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentkv.engine.request import DECODE_CONTEXT, Request
from agentkv.engine.sampling_params import SamplingParams
from agentkv.engine.tokenizer import Tokenizer
from tests.conftest import embedded_available


def sentencepiece_like(path):
    """A Metaspace tokenizer: its decoder drops the space of a text's first `▁` piece."""
    from tokenizers import Tokenizer as HF
    from tokenizers import decoders, models, pre_tokenizers

    pieces = ["<unk>", "▁a", "▁b", "a", "b", "▁", "é", "▁é"]
    tok = HF(models.WordLevel({p: i for i, p in enumerate(pieces)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    path.mkdir()
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<unk>"}))
    return Tokenizer(path)


@pytest.fixture(scope="module")
def toks(tiny_dir, tmp_path_factory):
    out = [Tokenizer(tiny_dir), sentencepiece_like(tmp_path_factory.mktemp("sp") / "t")]
    if embedded_available():
        from agentkv.engine.loader import resolve_model_dir

        out.append(Tokenizer(resolve_model_dir(None)))
    return out


class Counting:
    """A tokenizer that notes the longest list of ids it was asked to decode."""

    def __init__(self, tok):
        self.tok, self.longest = tok, 0

    def decode(self, ids, skip_special_tokens=True):
        self.longest = max(self.longest, len(ids))
        return self.tok.decode(ids, skip_special_tokens=skip_special_tokens)


@settings(max_examples=150, deadline=None)
@given(data=st.data(), skip=st.booleans())
def test_incremental_text_is_the_whole_decode(toks, data, skip):
    tok = data.draw(st.sampled_from(toks))
    text = data.draw(st.text(alphabet=st.sampled_from(list("ab é€😀\n <|im_end|>")), max_size=30))
    ids = tok.encode(text) + data.draw(st.lists(st.integers(0, tok.vocab_size - 1), max_size=6))
    chunks = data.draw(st.lists(st.integers(1, 4), min_size=len(ids), max_size=len(ids)))
    r = Request([0], SamplingParams(max_tokens=1000, skip_special_tokens=skip), 0, frozenset(), 1000, stream=True)
    counting = Counting(tok)
    i = whole = 0  # tokens appended; of those, the most that decoded to whole characters
    for n in chunks:
        if i >= len(ids):
            break
        counting.longest = 0
        r._append(ids[i:i + n], counting)  # what the engine does with sampled and forced tokens
        i += n
        assert r.text == tok.decode(ids[:i], skip_special_tokens=skip)
        # decoded: the context window, and the tokens since the text last ended on a whole character
        assert counting.longest <= DECODE_CONTEXT + i - whole
        if not r.text.endswith("\ufffd"):
            whole = i

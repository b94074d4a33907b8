"""TokenCarry (chat/carry.py): a conversation's next prompt starts with the ids its last prompt and
reply were written in, not with a re-tokenization of their text."""

from types import SimpleNamespace

from agentkv.chat.carry import TokenCarry

EOS, BOS, CD = 0, 1, 500  # CD: one token for "cd", which the tokenizer itself never writes


class Chars:
    """One token per character on encode; decode also knows CD, as a grammar's forced token."""

    eos_ids = frozenset({EOS})

    def encode(self, text, add_bos=True):
        return ([BOS] if add_bos else []) + [ord(c) for c in text]

    def decode(self, ids):
        return "".join("cd" if i == CD else chr(i) for i in ids if i not in (EOS, BOS))


def reply(text, ids, reason="stop"):
    return SimpleNamespace(text=text, token_ids=ids, finish_reason=reason)


def test_the_next_prompt_starts_with_the_written_ids():
    carry = TokenCarry(Chars())
    first = carry.encode("ab")
    assert first == [BOS, 97, 98]  # nothing carried yet: the tokenizer's own tokens
    carry.written("ab", first, reply("cd", [CD, EOS]))
    # the end of turn left to the template's text; the reply's own token, not "c", "d"
    assert carry.encode("abcd|x") == [BOS, 97, 98, CD, ord("|"), ord("x")]
    assert carry.encode("ab!") == [BOS, 97, 98, ord("!")]  # the prompt alone, where the reply was not kept
    assert carry.encode("zz") == [BOS, 122, 122]  # another conversation: encoded as it is


def test_a_reply_cut_by_a_stop_string_carries_only_its_prompt():
    carry = TokenCarry(Chars())
    carry.written("ab", [BOS, 97, 98], reply("c", [CD]))  # the text ends before what the ids write
    assert carry.encode("abc!") == [BOS, 97, 98, ord("c"), ord("!")]
    carry.written("ab", [BOS, 97, 98], reply("cd", [CD, EOS], "length"))  # an EOS that did not end it stays
    assert carry.encode("abcd!") == [BOS, 97, 98, CD, EOS, ord("!")]

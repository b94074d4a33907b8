"""Pre-tokenizer cuts: where a tokenizer splits text before BPE, so that no token spans them.

Byte-level BPE tokenizers (GPT-2, Llama 3, Qwen) first cut text into pieces with a regex (letters,
digits, punctuation runs, whitespace) and merge bytes only inside a piece. Jump-forward uses this
to tell which longer tokens the model could still write across the end of forced text: in
`"flag":true` the pieces are `"flag`, `":`, `true`, so Qwen's token `:true` can never sit there and
`":` may be forced before the model writes the value (matcher.py).

A cut near the end of a text can move once more text follows (a whitespace run decides only at its
end), and one near the start depends on what came before. `Splitter.cut_inside` therefore counts only
the cuts found with every probe continuation appended (one per character class the pre-tokenizers
tell apart) and, where the text is not the whole output, from two different starting points.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable

# One continuation per kind of character the GPT-2 / Llama 3 / Qwen patterns tell apart (a letter, a
# digit, a space, a newline, punctuation, a contraction, a non-ASCII letter), and a space followed by
# a letter (a whitespace run is cut by what ends it).
PROBES = ("", "a", "1", " ", " a", "\n", "!", "'s", "é")
SPLIT_CACHE = 4096


class Splitter:
    """Cuts text into pre-tokenizer pieces; `pieces(text)` gives their end offsets in characters."""

    def __init__(self, pieces: Callable[[str], list[int]]):
        self._pieces = pieces
        # Answers by text: requests of one schema ask about the same keys and values again and again.
        self._cuts_cached = functools.lru_cache(maxsize=SPLIT_CACHE)(self._cuts)
        self._firm_cached = functools.lru_cache(maxsize=SPLIT_CACHE)(self._firm)

    @classmethod
    def from_pattern(cls, pattern: str) -> Splitter:
        """tiktoken-style: the pieces are the regex's successive matches."""
        import regex

        compiled = regex.compile(pattern)
        if compiled.groups:  # findall would give the groups, not the pieces
            return cls(lambda text: [m.end() for m in compiled.finditer(text)])
        return cls(lambda text: list(itertools.accumulate(map(len, compiled.findall(text)))))

    @classmethod
    def from_tokenizers(cls, backend) -> Splitter | None:
        """From a `tokenizers.Tokenizer`'s pre-tokenizer (None where there is none, or a normalizer
        rewrites the text first: then pieces of the raw text say nothing)."""
        pre = getattr(backend, "pre_tokenizer", None)
        if pre is None or getattr(backend, "normalizer", None) is not None:
            return None
        return cls(lambda text: [end for _, (_, end) in pre.pre_tokenize_str(text)])

    def cuts(self, text: bytes) -> frozenset[int]:
        """Byte offsets strictly inside `text` where a piece ends (empty for text that is not UTF-8)."""
        return self._cuts_cached(text)

    def _cuts(self, text: bytes) -> frozenset[int]:
        try:
            s = text.decode("utf-8")
        except UnicodeDecodeError:
            return frozenset()
        ends = self._pieces(s)
        if s.isascii():
            return frozenset(e for e in ends if 0 < e < len(s))
        starts = [0]
        for ch in s:
            starts.append(starts[-1] + len(ch.encode("utf-8")))
        return frozenset(starts[e] for e in ends if 0 < e < len(s))

    def cut_inside(self, text: bytes, lo: int, hi: int, heads: tuple[int, ...] = (0,)) -> bool:
        """Is there a cut strictly between `lo` and `hi` that no continuation of `text` moves, found
        as well when scanning from each of `heads` (offsets into text that begins mid-output)?"""
        return bool(self._firm_cached(text, lo, hi, heads))

    def firm_cuts(self, text: bytes, heads: tuple[int, ...] = (0,)) -> frozenset[int]:
        """Every cut inside `text` that no continuation moves (as `cut_inside` finds them)."""
        return self._firm_cached(text, 0, len(text), heads)

    def _firm(self, text: bytes, lo: int, hi: int, heads: tuple[int, ...]) -> frozenset[int]:
        firm: set[int] | None = None
        for head in heads:
            for probe in PROBES:
                found = {head + c for c in self.cuts(text[head:] + probe.encode()) if lo < head + c < hi}
                firm = found if firm is None else firm & found
                if not firm:  # (often after one probe: a token the pre-tokenizer leaves whole)
                    return frozenset()
        return frozenset(firm)

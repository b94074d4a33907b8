"""Shared helpers for grammar tests: byte vocabularies, whole-string acceptance, and masks against a
brute-force reference (random small vocabularies, a check along a random walk)."""

from __future__ import annotations

import random

import numpy as np
from hypothesis import strategies as st

from agentkv.grammar import GrammarCompiler, Matcher, TokenizerInfo
from agentkv.grammar.automata import dfa
from agentkv.grammar.compiled import DEAD, CompiledGrammar

BYTE_INFO = TokenizerInfo([bytes([i]) for i in range(256)] + [None], eos_ids=[256])
BYTE_COMPILER = GrammarCompiler(BYTE_INFO)
STRICT_BYTE_COMPILER = GrammarCompiler(BYTE_INFO, strict=True)  # refuses what it cannot enforce exactly


def clear_walk_caches() -> None:
    """Forget the grammars the shared byte compilers keep (a test module that runs on both walk paths,
    conftest.walk_mode, must not take one path's grammars, and their walks, on the other)."""
    for c in (BYTE_COMPILER, STRICT_BYTE_COMPILER):
        c._cache.clear()
    dfa.clear_cache()  # rule automata are built in C or in Python too


def accepts(g: CompiledGrammar, text: str | bytes) -> bool:
    data = text.encode() if isinstance(text, str) else text
    cid = g.advance(g.initial, data)
    return cid != DEAD and g.can_end(cid)


def assert_language(g: CompiledGrammar, good, bad, source: str) -> None:
    """Every string of `good` is accepted whole, none of `bad` is."""
    for s in good:
        assert accepts(g, s), (source, s)
    for s in bad:
        assert not accepts(g, s), (source, s)


def is_prefix(g: CompiledGrammar, text: str | bytes) -> bool:
    data = text.encode() if isinstance(text, str) else text
    return g.advance(g.initial, data) != DEAD


def check_ratchet(path, current: set[str], what: str) -> int:
    """Fail if a name recorded in `path` is missing from `current`; return how many are new.

    `AGENTKV_UPDATE_RATCHET=1` rewrites the file with `current` (after an improvement).
    """
    import os

    recorded = set(path.read_text().splitlines()) if path.exists() else set()
    if os.environ.get("AGENTKV_UPDATE_RATCHET") == "1":
        path.write_text("".join(f"{n}\n" for n in sorted(current)))
        recorded = set(current)
    lost = sorted(recorded - current)
    assert not lost, f"{len(lost)} {what} before now fail, e.g. {lost[:5]}"
    return len(current - recorded)


ALPHABET = b'{}[]":,ab01 \\' + "é".encode()  # with a two-byte character and an escape


def compile_one(compiler, kind, source):
    return compiler.compile_json_schema(source) if kind == "schema" else compiler.compile_regex(source)


def brute_force(matcher: Matcher) -> set[int]:
    """Token t is allowed iff its bytes lead somewhere live (EOS iff the text may end); nothing once
    the matcher took EOS."""
    g, info = matcher.grammar, matcher.grammar.info
    if matcher.is_terminated():
        return set()
    out = {t for t, b in enumerate(info.vocab) if b is not None and g.advance(matcher._cfg, b) != DEAD}
    if matcher.can_terminate():
        out |= set(info.eos_ids)
    return out


@st.composite
def vocabularies(draw):
    words = draw(st.lists(st.binary(min_size=1, max_size=5).map(
        lambda b: bytes(ALPHABET[x % len(ALPHABET)] for x in b)), min_size=5, max_size=60, unique=True))
    singles = [bytes([c]) for c in ALPHABET]  # every text stays writable
    vocab = list(dict.fromkeys(singles + words)) + [None]
    return TokenizerInfo(vocab, eos_ids=[len(vocab) - 1])


def assert_mask_is_brute_force(m: Matcher, bitmask: np.ndarray) -> set[int]:
    """The matcher's bitmask holds exactly the brute-force allowed set; returns that set."""
    info = m.grammar.info
    m.fill_next_token_bitmask(bitmask)
    bits = np.unpackbits(bitmask[0].view(np.uint8), bitorder="little")[:info.vocab_size]
    expected = brute_force(m)
    got = set(np.nonzero(bits)[0].tolist())
    assert got == expected, (m._cfg, m.grammar.stacks(m._cfg), [info.vocab[t] for t in got - expected],
                             [info.vocab[t] for t in expected - got])
    return expected


def masks_along_a_walk(m: Matcher, rnd: random.Random, steps: int) -> None:
    """Check the mask against brute force, then take a random allowed token, `steps` times."""
    bitmask = np.zeros((1, m.grammar.info.words), dtype=np.int32)
    for _ in range(steps):
        expected = assert_mask_is_brute_force(m, bitmask)
        if not expected or m.is_terminated():
            break
        assert m.accept_token(rnd.choice(sorted(expected)))


def masks_to_the_end(m: Matcher, rnd: random.Random) -> set[int]:
    """Check the mask against brute force, then take a random allowed token (EOS last), until the
    matcher terminates; returns every token some mask allowed."""
    info = m.grammar.info
    bitmask = np.zeros((1, info.words), dtype=np.int32)
    seen: set[int] = set()
    while not m.is_terminated():
        expected = assert_mask_is_brute_force(m, bitmask)
        seen |= expected
        assert m.accept_token(rnd.choice(sorted(expected - set(info.eos_ids)) or sorted(expected)))
    return seen


# Rule DFAs (dfa.RuleDFA): languages compared over bytes and rule calls.

def step(d, s, sym):
    """The next state on a byte or a rule call (-1: none)."""
    if s < 0:
        return -1
    if isinstance(sym, int):
        return int(d.table[s, sym])
    return next((t for name, t in d.calls[s] if name == sym), -1)


def symbols(*ds):
    return list(range(256)) + sorted({name for d in ds for row in d.calls for name, _ in row})


def same_language(d1, d2) -> bool:
    """Walk both DFAs together over bytes and calls: every reachable pair agrees on acceptance."""
    syms = symbols(d1, d2)
    seen, todo = {(0, 0)}, [(0, 0)]
    while todo:
        a, b = todo.pop()
        if (a >= 0 and bool(d1.accept[a])) != (b >= 0 and bool(d2.accept[b])):
            return False
        for sym in syms:
            nxt = (step(d1, a, sym), step(d2, b, sym))
            if nxt != (-1, -1) and nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return True


def live_and_classes(d) -> tuple[int, int]:
    """(states that can still accept, their equivalence classes) by Moore's refinement in plain
    Python, over bytes and calls."""
    syms, n = symbols(d), len(d.accept)
    live = [bool(a) for a in d.accept]
    changed = True
    while changed:
        changed = False
        for s in range(n):
            if not live[s] and any(step(d, s, x) >= 0 and live[step(d, s, x)] for x in syms):
                live[s] = changed = True
    cls = [int(d.accept[s]) if live[s] else -1 for s in range(n)]
    while True:
        sig = {s: (cls[s], tuple(cls[t] if (t := step(d, s, x)) >= 0 else -1 for x in syms))
               for s in range(n) if live[s]}
        ids = {v: i for i, v in enumerate(sorted(set(sig.values())))}
        new = [ids[sig[s]] if live[s] else -1 for s in range(n)]
        if len(set(new)) == len(set(cls)):
            return sum(live), len(ids)
        cls = new

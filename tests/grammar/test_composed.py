"""Composed grammars (grammar/composed.py, composer.py, pool.py): a step's tools as parts compiled
once. A composed grammar's masks equal, token by token, those of the same language compiled whole
(the parts' rules renamed into one rule set) and those of brute force, over random subsets of
varied tools in four formats; Hermes' parts equal the single anyOf schema it wrote before. A subset
that differs by one tool compiles that tool alone; a pool that fills starts another without
changing the grammars already made."""

from __future__ import annotations

import json
import random
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentkv.chat.calls import FunctionSpec
from agentkv.chat.formats.base import arguments_schema, json_rule
from agentkv.chat.formats.hermes import Hermes
from agentkv.chat.formats.llama3 import Llama3Json
from agentkv.chat.formats.pythonic import Pythonic
from agentkv.chat.formats.qwen_xml import QwenXml
from agentkv.errors import GrammarError
from agentkv.grammar import GrammarCompiler, Matcher, TokenizerInfo, native
from agentkv.grammar import composer as composer_module
from agentkv.grammar import pool as pool_module
from agentkv.grammar.composed import ComposedGrammar
from tests.grammar_helpers import assert_mask_is_brute_force

pytestmark = pytest.mark.usefixtures("walk_mode")  # conftest.py: the native walk and the Python one

TOOLS = [
    FunctionSpec("get_weather", {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 6}, "unit": {"enum": ["C", "F"]}}, "required": ["city"]}),
    FunctionSpec("add", {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9},
                                                         "b": {"type": "integer", "minimum": 0, "maximum": 9}},
                         "required": ["a", "b"]}),
    FunctionSpec("tag", {"type": "object", "properties": {"tags": {"type": "array", "items": {"enum": ["x", "y"]},
                                                                   "maxItems": 2}}}),
    FunctionSpec("flag", {"type": "object", "properties": {"on": {"type": "boolean"}}, "required": ["on"]}),
    FunctionSpec("move", {"type": "object", "properties": {"to": {"type": "object", "properties": {
        "x": {"type": "integer", "minimum": 0, "maximum": 5}}, "required": ["x"]}}, "required": ["to"]}),
    FunctionSpec("note", {"type": "object", "properties": {"text": {"type": "string", "maxLength": 3}}}),
    FunctionSpec("pick", {"type": "object", "properties": {"n": {"enum": [1, 2, 3]}}, "required": ["n"]}),
]
FORMATS = [Hermes(), Llama3Json(), Pythonic(), QwenXml()]


def _vocab(words: list[bytes]) -> TokenizerInfo:
    singles = [bytes([c]) for c in range(32, 127)] + [b"\n", "é".encode()]
    vocab = list(dict.fromkeys(singles + words)) + [None]
    return TokenizerInfo(vocab, eos_ids=[len(vocab) - 1])


WORDS = [b"<tool_call>", b"<tool_call>\n", b'{"name":"', b'","arguments":{"', b'":', b"get_", b"weather", b"add",
         b"</tool_call>", b"<function=", b"<parameter=", b"</parameter>\n", b"true", b"false", b'"}', b"},",
         b'"a":', b"(a=", b", ", b"\n</", b"ta", b"g", b"]", b"[\"x", b'":{"x":']


def _texts_compiled(compiler: GrammarCompiler, monkeypatch) -> list[str]:
    """The Lark texts `compiler` lowers from now on (each head or part it compiles), in order."""
    texts: list[str] = []
    lark_rules = compiler.lark_rules
    monkeypatch.setattr(compiler, "lark_rules", lambda text, deadline: texts.append(text) or lark_rules(text, deadline))
    return texts


def _walk_same(a: Matcher, b: Matcher, rnd: random.Random, steps: int) -> None:
    """`a` and `b` give the same mask, brute force's, at every token of one random walk."""
    ma = np.zeros((1, a.grammar.info.words), dtype=np.int32)
    mb = np.zeros_like(ma)
    for _ in range(steps):
        allowed = assert_mask_is_brute_force(a, ma)
        b.fill_next_token_bitmask(mb)
        assert (ma == mb).all()
        if not allowed or a.is_terminated():
            return
        t = rnd.choice(sorted(allowed - set(a.grammar.info.eos_ids)) or sorted(allowed))
        assert a.accept_token(t) and b.accept_token(t)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(words=st.lists(st.sampled_from(WORDS), unique=True, max_size=len(WORDS)),
       subsets=st.lists(st.lists(st.integers(0, len(TOOLS) - 1), min_size=1, max_size=5, unique=True),
                        min_size=1, max_size=3),
       fmt=st.sampled_from(FORMATS), mode=st.sampled_from(["auto", "required"]), seed=st.integers(0, 99))
def test_composed_masks_equal_the_whole_grammar_and_brute_force(words, subsets, fmt, mode, seed):
    compiler = GrammarCompiler(_vocab(words))
    rnd = random.Random(seed)
    for subset in subsets:  # (later subsets reuse the earlier ones' parts, placed in the same pool)
        g = "start: answer\n" + fmt.answer_grammar([TOOLS[i] for i in subset], mode, None)
        composed = compiler.compile_lark(g)
        whole = compiler.composer.whole(g, time.monotonic() + 60)
        assert composed.relaxed == whole.relaxed
        for _ in range(2):
            _walk_same(Matcher(composed), Matcher(whole), rnd, 80)


@pytest.mark.parametrize("mode", ["auto", "required"])
def test_steps_share_the_walks_that_hold_in_each(mode):
    """A pool's grammars share a state's walk only where it never reached the calls' alternatives:
    tokens that run from the opening into one tool's name (here `{"name":"get_weather"`) must not
    carry from a step offering that tool to one that does not."""
    words = WORDS + [b'{"name":"get_weather"', b'\n{"name":"add"', b'{"name":"flag']
    info = _vocab(words)
    compiler = GrammarCompiler(info)
    fmt = Hermes()
    rnd = random.Random(3)
    opening = [info.vocab.index(b"<tool_call>"), info.vocab.index(b"\n")]
    for subset in ([0, 1, 3], [1, 2, 4], [0, 5], [2, 3, 4, 6]):
        g = "start: answer\n" + fmt.answer_grammar([TOOLS[i] for i in subset], mode, None)
        composed = compiler.compile_lark(g)
        whole = compiler.composer.whole(g, time.monotonic() + 60)
        for _ in range(3):
            _walk_same(Matcher(composed), Matcher(whole), rnd, 40)
        for cut in range(3):  # from each state of the opening, where the tokens into the names start
            a, b = Matcher(composed), Matcher(whole)
            for t in opening[:cut]:
                assert a.accept_token(t) and b.accept_token(t)
            _walk_same(a, b, rnd, 4)
    if native.load() is not None:
        assert compiler.cache_info()["shared_walks_taken"] > 0


def test_hermes_parts_are_the_anyof_schema_it_wrote_before():
    """The language of Hermes' composed calls (compact) is that of its former single `%json` block: an
    anyOf of closed `{"name": const, "arguments": ...}` objects."""
    compiler = GrammarCompiler(_vocab(WORDS))
    tools = TOOLS[:5]
    g = "start: answer\n" + Hermes(json_style="compact").answer_grammar(tools, "required", None)
    branches = [{"type": "object", "properties": {"name": {"const": t.name}, "arguments": arguments_schema(t, True)},
                 "required": ["name", "arguments"], "additionalProperties": False} for t in tools]
    before = g.text.replace('call: "<tool_call>\\n{\\"name\\":" tool\n', "") + (
        f'call: "<tool_call>\\n" {json_rule({"anyOf": branches})} "\\n</tool_call>"\n')
    assert before.count("call: ") == 1  # (the composed call rule replaced)
    rnd = random.Random(0)
    for _ in range(12):
        _walk_same(Matcher(compiler.compile_lark(g)), Matcher(compiler.compile_lark(before)), rnd, 120)


def test_a_subset_one_tool_apart_compiles_that_tool_alone(monkeypatch):
    compiler = GrammarCompiler(_vocab(WORDS))
    fmt = Hermes()
    compiler.compile_lark(fmt.grammar(TOOLS[:5], "auto", None))
    assert compiler.cache_info()["parts"] == 6  # five tools and the head
    texts = _texts_compiled(compiler, monkeypatch)
    text = fmt.grammar(TOOLS[1:6], "auto", None)
    g = compiler.compile_lark(text)
    assert texts == [fmt.call_part(TOOLS[5], True)]  # the new tool's part, nothing else
    assert compiler.cache_info()["parts"] == 7
    whole = compiler.composer.whole(text, time.monotonic() + 60)
    rnd = random.Random(1)
    for _ in range(6):
        _walk_same(Matcher(g), Matcher(whole), rnd, 80)


def test_grammars_stay_whole_when_the_pool_fills(monkeypatch):
    """Pools that fill start anew, and arrays that grow move: a grammar made before keeps its own."""
    monkeypatch.setattr(pool_module, "MAX_POOL_STATES", 80)
    compiler = GrammarCompiler(_vocab(WORDS))
    fmt = QwenXml()
    made = []
    for k in range(len(TOOLS)):
        subset = [TOOLS[(k + j) % len(TOOLS)] for j in range(3)]
        text = fmt.grammar(subset, "required", None)
        made.append((compiler.compile_lark(text), compiler.composer.whole(text, time.monotonic() + 60)))
    assert compiler.cache_info()["pools"] > 1
    rnd = random.Random(2)
    for composed, whole in made:
        _walk_same(Matcher(composed), Matcher(whole), rnd, 60)


@given(st.lists(st.integers(0, len(TOOLS) - 1), min_size=1, max_size=12), st.integers(1, 40))
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_a_pool_grows_by_any_steps(picks, room):
    """Fragments placed one after another into a pool that starts small: every array grows with the
    states (the call table's offsets once fell one growth behind and a placement failed)."""
    compiler = GrammarCompiler(_vocab(WORDS))
    pool = pool_module.StatePool(states=room, calls=room, rules=room)
    fmt = Hermes()
    for k in picks:
        frag = compiler.composer._fragment(("whole part", fmt.call_part(TOOLS[k], True)), fmt.call_part(TOOLS[k], True),
                                           time.monotonic() + 60)
        pool.placed.clear()  # (placed again each time: the pool grows by every pick)
        s0, _ = pool.place(frag)
        n = frag.n_states
        assert len(pool.call_off) >= len(pool.accept) + 1 and s0 + n <= len(pool.accept)
        calls = pool.call_off[s0 + 1:s0 + n + 1] - pool.call_off[s0:s0 + n]
        assert calls.tolist() == [len(frag.automaton.calls.get(s, ())) for s in range(n)]


def test_a_part_that_may_be_empty_is_refused():
    compiler = GrammarCompiler(_vocab(WORDS))
    with pytest.raises(GrammarError, match="part 1 of the composed rule .call. matches the empty string"):
        compiler.compile_lark(ComposedGrammar('start: "[" call "]"', "call", ('start: "a"', 'start: "b"?')))
    with pytest.raises(GrammarError, match="at least one part"):
        ComposedGrammar("start: call", "call", ())


def test_relaxed_keywords_of_parts_reach_the_grammar():
    """A part's schema keyword the grammar cannot enforce is listed (and refused when strict)."""
    tool = FunctionSpec("uniq", {"type": "object", "properties": {"v": {"type": "array", "uniqueItems": True}}})
    text = Hermes().grammar([tool, TOOLS[0]], "required", None)
    relaxed = GrammarCompiler(_vocab(WORDS)).compile_lark(text).relaxed
    assert [(r.part, r.pointer, r.keyword) for r in relaxed] == [("tool 'uniq'", "#/properties/v/uniqueItems",
                                                                  "uniqueItems")]
    with pytest.raises(GrammarError, match="^tool 'uniq': keyword 'uniqueItems' is not supported") as e:
        GrammarCompiler(_vocab(WORDS), strict=True).compile_lark(text)
    assert e.value.pointer == "#/properties/v/uniqueItems"  # (within the tool's schema)


def test_a_step_over_the_state_budget_names_its_largest_tool(monkeypatch):
    """Past the budget the compile stops (the parts after it are not compiled) and names the
    largest tool so far."""
    from agentkv.grammar import composer

    compiler = GrammarCompiler(_vocab(WORDS))
    fmt = Hermes()
    sizes = {t.name: compiler.compile_lark(fmt.grammar([t], "required", None)).num_states for t in TOOLS}
    # (a one-tool grammar's states: the head's, the two of the composed rule's and the tool's)
    monkeypatch.setattr(composer, "MAX_COMPOSED_STATES", sizes["get_weather"])  # passed at the second tool
    compiler = GrammarCompiler(_vocab(WORDS))
    texts = _texts_compiled(compiler, monkeypatch)
    largest = max(TOOLS[:2], key=lambda t: sizes[t.name]).name
    with pytest.raises(GrammarError, match=f"largest part so far is tool '{largest}'"):
        compiler.compile_lark(fmt.grammar(TOOLS, "required", None))
    assert len(texts) == 1 + 2  # the head and two tools: the others are never compiled


def test_the_composed_grammar_is_read_as_its_text_plus_parts():
    g = Hermes(json_style="compact").grammar(TOOLS[:2], "required", None)
    assert isinstance(g, ComposedGrammar) and g.text.startswith("start: answer\n")
    assert [json.loads(p.split("%json:compact ", 1)[1].rsplit(' "}', 1)[0]) for p in g.parts] == [
        arguments_schema(t, True) for t in TOOLS[:2]]
    model = Hermes().grammar(TOOLS[:2], "required", None)  # (the model's choice: a branch a style)
    assert all(p.startswith(f'start: ("\\"{t.name}\\",\\"arguments\\":" %json:compact ')
               and f' | " \\"{t.name}\\", \\"arguments\\": " %json:spaced ' in p for p, t in zip(model.parts, TOOLS))


def test_parts_are_linked_when_a_step_first_reads_past_their_names():
    """A part's automaton is linked when a step first reads past its literal prefix (the tool's name):
    the first mask and the name itself link nothing; the call's arguments link that tool alone, once
    for every grammar that offers it (one composed before the link, one after); masks stay the whole
    grammar's and brute force's throughout."""
    compiler = GrammarCompiler(_vocab(WORDS))
    fmt = Hermes()
    texts = [fmt.grammar(TOOLS[:5], "required", None), fmt.grammar(TOOLS[1:6], "required", None)]
    before = compiler.compile_lark(texts[0])
    n0 = before.num_states
    rnd = random.Random(3)
    bitmask = np.zeros((1, before.info.words), dtype=np.int32)
    for k, text in enumerate(texts * 2):
        g = compiler.compile_lark(text)
        whole = compiler.composer.whole(text, time.monotonic() + 60)
        m, w = Matcher(g), Matcher(whole)
        linked = compiler.cache_info()["parts_linked"]
        for data in (b'<tool_call>\n{"name":"ad', b'd","arguments":'):  # (no token spans the two)
            assert_mask_is_brute_force(m, bitmask)
            assert compiler.cache_info()["parts_linked"] == linked
            assert m.accept_bytes(data) and w.accept_bytes(data)
        assert compiler.cache_info()["parts_linked"] == max(linked, 1)  # ('add': linked once, at k = 0)
        _walk_same(m, w, rnd, 40)  # (and any other tool the walk calls after it)
    assert before.num_states > n0  # (its view grew by the parts it linked)


def test_a_part_that_fails_to_link_ends_its_sequence_with_the_error(monkeypatch):
    """Linking a part when first reached can only fail for memory or time; where it does, that
    sequence's mask is empty and carries the error (the engine ends the request with it), and the
    grammar serves other sequences."""
    compiler = GrammarCompiler(_vocab(WORDS))
    g = compiler.compile_lark(Hermes().grammar(TOOLS[:3], "required", None))
    failing = Matcher(g)
    assert failing.accept_bytes(b'<tool_call>\n{"name":"ad')
    other = failing.copy()

    def fail(self, i, compiler, deadline):
        raise GrammarError("compiling a composed grammar's part took longer than 10 s")

    monkeypatch.setattr(composer_module.LazyPart, "linked", fail)
    assert not failing.accept_bytes(b'd","arguments":')
    assert "took longer" in str(failing.error)
    bitmask = np.ones((1, g.info.words), dtype=np.int32)
    failing.fill_next_token_bitmask(bitmask)
    assert not bitmask.any()
    monkeypatch.undo()
    assert other.error is None and other.accept_bytes(b'd","arguments":{"a":1,"b":2}}')

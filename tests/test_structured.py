"""Structured generation in the engine on a tiny random model: masks, jump-forward, typed outputs, errors.

The tiny model's tokenizer has one token per byte, so every text has exactly one tokenization: greedy
outputs with jump-forward on and off must be the same tokens, which checks that forced tokens
computed in one extend give the same logits as one decode step each.
"""

from __future__ import annotations

import json

import jsonschema
import numpy as np
import pytest
import torch

import agentkv as ak
from agentkv.grammar import Matcher
from agentkv.kernels.token_mask import apply_token_bitmask, unpack_bitmask
from agentkv.typed import complete_fields

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "role": {"enum": ["admin", "user", "guest"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 3}, "maxItems": 2},
        "active": {"type": "boolean"},
    },
    "required": ["name", "age", "role", "tags", "active"],
    "additionalProperties": False,
}
TOOL_CALL = {
    "type": "object",
    "properties": {
        "name": {"const": "get_weather"},
        "arguments": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 8}, "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "arguments"],
    "additionalProperties": False,
}
PROMPTS = ["Make a record: ", "Another one please. ", "x", "A longer prompt about a person and a tool call. "]


def test_bitmask_unpack_and_apply():
    rng = np.random.default_rng(0)
    for vocab in (1, 31, 32, 33, 100):
        words = (vocab + 31) // 32
        bits = rng.integers(-(2**31), 2**31, size=(3, words), dtype=np.int64).astype(np.int32)
        ref = np.unpackbits(bits.view(np.uint8), axis=1, bitorder="little")[:, :vocab].astype(bool)
        assert torch.equal(unpack_bitmask(torch.from_numpy(bits), vocab), torch.from_numpy(ref))
        logits = torch.randn(3, vocab)
        masked, alive = apply_token_bitmask(logits, torch.from_numpy(bits))
        assert torch.equal(torch.isinf(masked), torch.from_numpy(~ref))
        assert torch.equal(masked[torch.from_numpy(ref)], logits[torch.from_numpy(ref)])
        assert alive.tolist() == ref.any(1).tolist()


@pytest.mark.parametrize("schema", [PERSON, TOOL_CALL], ids=["person", "tool_call"])
def test_greedy_jump_forward_on_equals_off(tiny_engine, schema):
    on = tiny_engine.generate(PROMPTS, schema=schema, temperature=0.0, max_tokens=300)
    off = tiny_engine.generate(PROMPTS, schema=schema, temperature=0.0, max_tokens=300, jump_forward=False)
    for a, b in zip(on, off):
        assert a.finish_reason == b.finish_reason == "stop"
        assert a.token_ids == b.token_ids
        jsonschema.validate(a.parsed, schema)
        assert a.usage.jump_forward_tokens > 0 and b.usage.jump_forward_tokens == 0
        assert a.usage.forward_passes < b.usage.forward_passes
        # every token costs a pass with jump-forward off (the grammar ends the output: no EOS pass)
        assert b.usage.forward_passes == len(b.token_ids)
        assert a.usage.forward_passes == len(a.token_ids) - a.usage.jump_forward_tokens


def test_sampled_outputs_validate_and_reproduce(tiny_engine):
    params = ak.SamplingParams(json_schema=PERSON, temperature=1.0, max_tokens=300, seed=7, n=3)
    outs = tiny_engine.generate(PROMPTS, params)
    for out in outs:
        for c in out.completions:
            assert c.finish_reason == "stop"
            jsonschema.validate(json.loads(c.text), PERSON)
    again = tiny_engine.generate(PROMPTS[1], params)
    assert [c.token_ids for c in again.completions] == [c.token_ids for c in outs[1].completions]


def test_jump_forward_under_memory_pressure(tiny_dir):
    expected = None
    for slots in (4096, 200):
        with ak.Engine(str(tiny_dir), num_slots=slots, max_running_requests=8) as engine:
            outs = engine.generate(PROMPTS * 2, schema=TOOL_CALL, temperature=0.0, max_tokens=300)
            ids = [o.token_ids for o in outs]
            st = engine.stats()
            assert st["jump_forward_tokens_computed"] > 0
            assert st["running"] == 0 and st["free_slots"] + st["cached_tokens"] == st["total_slots"]
        if expected is None:
            expected = ids
        else:
            assert st["retractions"] > 0 or st["evicted_tokens"] > 0
            assert ids == expected


def test_fully_forced_output_needs_no_forward_pass(tiny_engine):
    out = tiny_engine.generate("anything", schema={"const": {"status": "ok"}}, max_tokens=50, json_style="compact")
    assert out.text == '{"status":"ok"}' and out.finish_reason == "stop"
    assert out.usage.forward_passes == 0 and out.usage.jump_forward_tokens == len(out.token_ids)
    assert out.parsed == {"status": "ok"}
    # under the model's choice of style, one pass chooses it at the first separator; the rest is forced
    out = tiny_engine.generate("anything", schema={"const": {"status": "ok"}}, max_tokens=50)
    assert out.text in ('{"status":"ok"}', '{"status": "ok"}') and out.finish_reason == "stop"
    assert out.usage.forward_passes == 1 and out.usage.jump_forward_tokens == len(out.token_ids) - 1


def test_regex_and_lark_outputs_match(tiny_engine):
    import re

    for seed in range(4):
        out = tiny_engine.generate("Phone:", regex=r"\(\d{3}\) \d{3}-\d{4}", temperature=1.0, seed=seed, max_tokens=40)
        assert re.fullmatch(r"\(\d{3}\) \d{3}-\d{4}", out.parsed), out.text
    lark = 'start: "[" item ("," item)* "]"\nitem: /[a-c]{1,3}/ | start'
    out = tiny_engine.generate("List:", grammar=lark, temperature=1.0, seed=1, max_tokens=200)
    assert out.finish_reason == "stop" and re.fullmatch(r"[\[\]a-c,]+", out.text)


def test_bad_schema_raises_before_queueing(tiny_engine):
    before = tiny_engine.stats()["forward_passes"]
    with pytest.raises(ak.GrammarError, match=r"less than the minimum of 0 \(at #/minItems\)"):
        tiny_engine.generate("x", schema={"type": "array", "minItems": -1})
    with pytest.raises(ak.RequestError, match="at most one"):
        ak.SamplingParams(json_schema={"type": "string"}, regex="a")
    assert tiny_engine.stats()["forward_passes"] == before
    assert tiny_engine.generate("x", schema={"type": "boolean"}, temperature=0.0).parsed in (True, False)


def test_cut_output_raises_typed_error_with_partial_text(tiny_engine):
    out = tiny_engine.generate("x", schema=PERSON, temperature=1.0, seed=0, max_tokens=12, budget_closing=False)
    assert out.finish_reason == "length" and len(out.token_ids) == 12 and not out.completions[0].truncated
    with pytest.raises(ak.IncompleteOutputError) as err:
        _ = out.parsed
    assert err.value.text == out.text and err.value.finish_reason == "length"
    with pytest.raises(ak.IncompleteOutputError):
        ak.generate("x", schema=PERSON, engine=tiny_engine, max_tokens=12, budget_closing=False)
    stopped = tiny_engine.generate("x", schema=PERSON, temperature=0.0, max_tokens=300, stop='"age"')
    with pytest.raises(ak.IncompleteOutputError):
        _ = stopped.parsed


def test_dead_end_ends_request_and_engine_keeps_serving(tiny_engine, monkeypatch):
    grammar = tiny_engine.grammar_compiler.compile_regex("ab+c")
    real = Matcher.fill_next_token_bitmask

    def fill(self, bitmask, row=0):
        real(self, bitmask, row)
        if self.grammar is grammar:
            bitmask[row] = 0  # as if no token of the vocabulary could continue

    monkeypatch.setattr(Matcher, "fill_next_token_bitmask", fill)
    out = tiny_engine.generate("x", regex="ab+c", max_tokens=20)
    assert out.finish_reason == "grammar_dead_end" and out.text == "ab"  # "ab" was forced, then nothing fits
    with pytest.raises(ak.IncompleteOutputError):
        _ = out.parsed
    monkeypatch.undo()
    assert tiny_engine.generate("x", regex="ab+c", max_tokens=20, temperature=0.0).finish_reason == "stop"
    assert tiny_engine.stats()["running"] == 0


def test_score_matches_full_logits(tiny_dir, tiny_engine):
    from tests.reference import engine_logits

    prompt = "The answer is"
    conts = ["yes", "no", " maybe so"]
    scores = tiny_engine.score(prompt, conts)
    ids = tiny_engine.tokenizer.encode(prompt)
    with ak.Engine(str(tiny_dir), num_slots=256, enable_radix_cache=False) as plain:
        for cont, got in zip(conts, scores):
            cids = plain.tokenizer.encode(cont)
            logprobs = engine_logits(plain, ids + cids)[0].log_softmax(-1)  # every position, computed afresh
            want = [float(logprobs[len(ids) - 1 + j, t]) for j, t in enumerate(cids)]
            assert got == pytest.approx(want, abs=1e-4)
    again = tiny_engine.score(prompt, conts)  # now from the cache
    assert all(a == pytest.approx(b, abs=1e-4) for a, b in zip(again, scores))
    means = [sum(s) / len(s) for s in scores]
    assert ak.generate(prompt, choices=conts, engine=tiny_engine) == conts[int(np.argmax(means))]


def test_stream_yields_complete_fields_then_the_object(tiny_engine):
    items = list(ak.stream("x", schema=PERSON, engine=tiny_engine, temperature=0.0, max_tokens=300))
    final = items[-1]
    jsonschema.validate(final, PERSON)
    partials = items[:-1]
    assert partials and all(set(p) < set(final) or p == final for p in partials)
    assert all(final[k] == v for p in partials for k, v in p.items())
    assert [len(p) for p in partials] == sorted(len(p) for p in partials)


def test_complete_fields():
    assert complete_fields('{"a":1') == {}
    assert complete_fields('{"a":1,') == {"a": 1}
    assert complete_fields('{"a":"x\\"y","b":[1,2') == {"a": 'x"y'}
    assert complete_fields('{"a":{"b":2},"c":true}') == {"a": {"b": 2}, "c": True}
    assert complete_fields(' { "a" : 1.5 }') == {"a": 1.5}
    assert complete_fields('[1,2]') == {}


def test_pydantic_models_are_closed_unless_they_allow_extra(tiny_engine):
    from pydantic import BaseModel, ConfigDict

    class Closed(BaseModel):
        a: bool

    class Open(BaseModel):
        model_config = ConfigDict(extra="allow")
        a: bool

    from agentkv.grammar.schema.walk import find_serialization

    compiler = tiny_engine.grammar_compiler
    assert find_serialization(compiler.compile_json_schema(Closed), {"a": True, "b": 1}) is None
    assert find_serialization(compiler.compile_json_schema(Open), {"a": True, "b": 1}) == '{"a":true,"b":1}'
    out = tiny_engine.generate("x", schema=Closed, temperature=1.0, seed=3, max_tokens=40)
    assert out.text in ('{"a":true}', '{"a":false}') and isinstance(out.parsed, Closed)


def test_stream_of_text_and_regex_ends_with_the_whole_output(tiny_engine):
    kw = {"engine": tiny_engine, "temperature": 0.0, "max_tokens": 20}
    plain = list(ak.stream("Once", **kw))
    assert plain and plain[-1] == tiny_engine.generate("Once", temperature=0.0, max_tokens=20).text
    assert all(b.startswith(a) for a, b in zip(plain, plain[1:]))
    shaped = list(ak.stream("Once", regex=r"[a-z]{4}-[0-9]{2}", **kw))
    assert shaped[-1] == ak.generate("Once", regex=r"[a-z]{4}-[0-9]{2}", **kw)


def test_stream_cut_by_a_stop_string_is_incomplete(tiny_engine):
    kw = {"engine": tiny_engine, "temperature": 0.0, "max_tokens": 40}
    text = ak.generate("Once", regex=r"[a-z]{6}", **kw)
    stop = text[3:5]
    with pytest.raises(ak.IncompleteOutputError) as err:
        list(ak.stream("Once", regex=r"[a-z]{6}", stop=stop, **kw))
    assert err.value.text == text[: text.index(stop)]


def test_engine_stats_report_the_grammar_caches(tiny_engine):
    tiny_engine.generate("x", regex="[ab]{3}c", max_tokens=8)
    st = tiny_engine.stats()
    assert st["grammars_cached"] >= 1 and st["grammar_cache_bytes"] > 0 and st["grammar_cache_evictions"] >= 0


def test_generate_follows_the_schema_contract(tiny_engine, monkeypatch):
    from agentkv import typed

    """strict=True refuses a keyword the grammar cannot enforce, naming its pointer; without it, a
    sampled output failing a relaxed keyword is generated again, and one that always fails raises
    OutputValidationError carrying the keyword, from ak.generate and from the engine's `.parsed`.
    Checked against a planted bug: the dict schema's check after generation skipped (value_parser
    returning the value unchecked): it fails."""
    with pytest.raises(ak.GrammarError, match="#/pattern"):
        ak.generate("x", {"type": "string", "pattern": "^(a)\\1$"}, strict=True, engine=tiny_engine)
    maybe = {"type": "array", "items": {"enum": [1, 2, 3]}, "minItems": 2, "maxItems": 2, "uniqueItems": True}

    def failures() -> int:
        failed = 0
        for seed in range(12):
            try:
                assert len(set(ak.generate("x", maybe, temperature=1.0, seed=seed, engine=tiny_engine))) == 2
            except ak.OutputValidationError as e:
                assert e.keyword == "uniqueItems"
                failed += 1
        return failed

    with_resamples = failures()
    monkeypatch.setattr(typed, "RESAMPLES", 0)
    assert with_resamples < failures()  # a third of first tries repeat an item; their resamples mostly do not
    monkeypatch.undo()
    never = {"type": "array", "items": {"enum": [1, 2]}, "minItems": 3, "maxItems": 3, "uniqueItems": True}
    with pytest.raises(ak.OutputValidationError) as e:
        ak.generate("x", never, temperature=1.0, engine=tiny_engine)
    assert e.value.keyword == "uniqueItems" and e.value.pointer == "#/uniqueItems"
    out = tiny_engine.generate("x", json_schema=never, temperature=1.0, seed=1)  # the engine's own path
    assert out.completions[0].complete  # the grammar let it finish: only the check after can refuse it
    with pytest.raises(ak.OutputValidationError, match="non-unique"):
        out.parsed

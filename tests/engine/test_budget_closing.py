"""Budget closing: a structured output always closes within max_tokens. Every output of a random model
under a random budget parses and validates (SchemaStore's schemas, a BPE tokenizer whose tokens
span several bytes), or the request is refused up front naming the least max_tokens that fits, and
that least budget is exact; numbers stop at their digit bound."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import agentkv as ak
from agentkv.errors import GrammarError, RequestError
from agentkv.grammar.schema.validation import SchemaCheck
from tests.conftest import SHARED_DATA
from tests.tiny import make_tiny_model

CITY = {"type": "object", "required": ["city", "population"],
        "properties": {"city": {"type": "string", "maxLength": 40}, "population": {"type": "integer"}}}
NESTED = {"type": "object", "properties": {
    "items": {"type": "array", "minItems": 1,
              "items": {"type": "object", "properties": {"sku": {"type": "string", "minLength": 2},
                                                         "qty": {"type": "integer", "minimum": 1}},
                        "required": ["sku", "qty"]}},
    "note": {"type": "string"}}, "required": ["items", "note"]}


@pytest.fixture(scope="module")
def bpe_engine(tmp_path_factory):
    path = make_tiny_model(tmp_path_factory.mktemp("bpe") / "llama", merges=300, max_positions=2048)
    with ak.Engine(str(path), num_slots=8192) as engine:
        yield engine


def least_budget(err: RequestError) -> int:
    return int(re.search(r"at least (\d+)", str(err)).group(1))


def check_closed(out, schema, max_tokens: int) -> None:
    c = out.completions[0]
    assert len(c.token_ids) <= max_tokens
    problem = SchemaCheck(schema).error(json.loads(c.text))  # parses and validates, closed or not
    assert problem is None, (c.text, problem)
    if c.truncated:
        assert c.finish_reason == "length" and out.usage.closing_tokens > 0
        with pytest.raises(ak.IncompleteOutputError, match="budget closing"):
            _ = c.parsed
    else:  # ended by the grammar, or by max_tokens where the output could end ("0" of a number: nothing to close)
        assert out.usage.closing_tokens == 0 and c.finish_reason in ("stop", "length")


@pytest.mark.parametrize("schema", [CITY, NESTED], ids=["city", "nested"])
def test_outputs_close_within_every_budget(bpe_engine, schema):
    closed = 0
    for max_tokens in range(1, 60, 3):
        for seed in range(3):
            try:
                out = bpe_engine.generate("x", schema=schema, temperature=1.0, seed=seed, max_tokens=max_tokens)
            except RequestError as err:
                assert least_budget(err) > max_tokens
                continue
            check_closed(out, schema, max_tokens)
            closed += out.completions[0].truncated
    assert closed > 10  # (the random model runs on in its strings: most of these budgets close them)


@pytest.mark.parametrize("schema", [CITY, NESTED], ids=["city", "nested"])
def test_the_least_budget_named_is_exact(bpe_engine, schema):
    with pytest.raises(RequestError, match=r"raise max_tokens to at least") as err:
        bpe_engine.generate("x", schema=schema, max_tokens=2)
    n = least_budget(err.value)
    for seed in range(4):
        check_closed(bpe_engine.generate("x", schema=schema, temperature=1.0, seed=seed, max_tokens=n), schema, n)
    with pytest.raises(RequestError):
        bpe_engine.generate("x", schema=schema, max_tokens=n - 1)
    # opted out: cut where max_tokens falls, as it stands
    cut = bpe_engine.generate("x", schema=schema, max_tokens=n - 1, temperature=1.0, seed=0, budget_closing=False)
    assert cut.finish_reason == "length" and not cut.completions[0].truncated


def test_numbers_stop_at_their_bound(bpe_engine):
    """A model that would write digits forever (every digit token pushed up) writes 16 and stops."""
    vocab = bpe_engine.tokenizer.backend.get_vocab()
    digits = {i: 100 for t, i in vocab.items() if t.isdigit() and not t.startswith("0")}
    schema = {"type": "object", "properties": {"n": {"type": "integer"}, "x": {"type": "number"}},
              "required": ["n", "x"]}
    out = bpe_engine.generate("x", schema=schema, temperature=0.0, max_tokens=200, logit_bias=digits)
    value = json.loads(out.text)
    assert out.finish_reason == "stop" and len(str(value["n"])) == 16
    whole, frac, exp = re.fullmatch(r"-?(\d+)(?:\.(\d+))?(?:[eE][+-]?(\d+))?", out.text.split('"x":')[1][:-1]).groups()
    assert len(whole) == 16 and len(frac or "") <= 16 and len(exp or "") <= 16
    exact = bpe_engine.generate("x", schema=schema, temperature=0.0, max_tokens=60, logit_bias=digits,
                                number_digits=None, budget_closing=False)
    assert exact.finish_reason == "length"  # unbounded: the digits run until max_tokens
    strict = bpe_engine.generate("x", schema=schema, temperature=0.0, max_tokens=60, logit_bias=digits,
                                 strict=True, budget_closing=False)
    assert strict.token_ids == exact.token_ids  # strict is exact to the spec: unbounded too


def schemastore_cases():
    root = SHARED_DATA / "schemastore"
    return sorted(root.glob("*.json")) if root.exists() else []


CASES = schemastore_cases()


@pytest.mark.skipif(not CASES, reason="the shared SchemaStore data sits beside the clone in CI only")
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.sampled_from(CASES or [Path()]), st.integers(1, 48), st.integers(0, 1 << 20))
def test_schemastore_outputs_close_within_random_budgets(bpe_engine, path, max_tokens, seed):
    schema = json.loads(path.read_text())["schema"]
    try:
        g = bpe_engine.grammar_compiler.compile_json_schema(schema, close_objects=True)
    except GrammarError:
        assume(False)  # (refers to other documents, or too large for a grammar)
    assume(not g.relaxed)  # every output validates against the whole schema only where nothing was relaxed
    params = dict(schema=schema, temperature=1.0, seed=seed, max_tokens=max_tokens)
    try:
        out = bpe_engine.generate("x", **params)
    except RequestError as err:
        n = least_budget(err)
        assert n > max_tokens
        out, max_tokens = bpe_engine.generate("x", **{**params, "max_tokens": n}), n
    check_closed(out, schema, max_tokens)

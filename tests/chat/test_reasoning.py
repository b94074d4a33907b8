"""Reasoning models: a `<think>` block before the answer, free of the answer's grammar; its budget;
`enable_thinking: false`; reasoning_content in the server's messages and stream; agents that think
at every step and keep their conversation a prefix of the next prompt."""

from __future__ import annotations

import json

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, Field

import agentkv as ak
from agentkv.chat.reasoning import GEMMA4, HARMONY, ReasoningFormat, reply_grammar
from agentkv.errors import RequestError
from tests.chat_templates import FAMILIES
from tests.grammar_helpers import BYTE_COMPILER, accepts
from tests.tiny import make_tiny_model

R = ReasoningFormat()
SCHEMA = {"type": "object", "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["x"],
          "additionalProperties": False}
ANSWER = f"answer: %json {json.dumps(SCHEMA)}\n"


def test_where_a_reply_starts():
    assert R.state("<|im_start|>assistant\n") == "may"
    assert R.state("<|im_start|>assistant\n<think>\n") == "inside"
    assert R.state("<|im_start|>assistant\n<think>\n\n</think>\n\n") == "off"
    assert ReasoningFormat.for_template("{{ '<think>' }} ... {{ '</think>' }}") == R
    assert ReasoningFormat.for_template("{{ messages }}") is None and ReasoningFormat.for_template(None) is None


def test_the_block_then_the_answers_grammar():
    may = BYTE_COMPILER.compile_lark(reply_grammar(ANSWER, R, "may"))
    assert accepts(may, '<think>\nLet me think: x < 9.\n</think>\n\n{"x":3}') and accepts(may, '{"x":3}')
    assert not accepts(may, '<think>\nhm\n</think>\n\n{"x":30}')  # the answer keeps its schema
    assert not accepts(may, '<think>\na</think> b\n</think>\n\n{"x":3}')  # one block, closed once
    assert not accepts(may, 'Sure. {"x":3}')
    inside = BYTE_COMPILER.compile_lark(reply_grammar(ANSWER, R, "inside"))
    assert accepts(inside, 'hm\n</think>\n\n{"x":3}') and not accepts(inside, '{"x":3}')
    off = BYTE_COMPILER.compile_lark(reply_grammar(ANSWER, R, "off"))
    assert accepts(off, '{"x":3}') and not accepts(off, '<think>\nhm\n</think>\n\n{"x":3}')
    assert reply_grammar(None, R, "may") is None  # free text needs no grammar
    assert reply_grammar(ANSWER, None, "off").startswith("start: answer")


@settings(max_examples=80, deadline=None)
@given(st.sampled_from(["may", "inside"]), st.text(alphabet="ab \n<>/thinkq", max_size=14),
       st.text(alphabet='ab {}"\n<', max_size=8))
def test_a_streamed_split_only_grows_into_the_final_one(state, thought, answer):
    """Every prefix of a reply splits into a reasoning and an answer that are prefixes of the whole
    reply's: what a stream sent is never taken back."""
    thought = thought.replace("</think>", "")
    text = ("<think>\n" if state == "may" else "") + thought + R.close_text + answer
    final = R.split(text, state)
    assert final[0] == thought.strip("\n") and final[1] == answer.lstrip()
    for k in range(len(text) + 1):
        part = R.split(text[:k], state, final=False)
        assert (final[0] or "").startswith(part[0] or "") and final[1].startswith(part[1])


def test_harmonys_analysis_channel():
    """gpt-oss's reasoning is an analysis message before the answer's own message: the prompt's
    `<|start|>assistant` leaves it free to open one, which ends with `<|end|><|start|>assistant`."""
    prompt = "<|start|>user<|message|>hi<|end|><|start|>assistant"
    assert HARMONY.state(prompt) == "may" and HARMONY.close_text == "<|end|><|start|>assistant"
    final = "<|channel|>final<|message|>"
    g = BYTE_COMPILER.compile_lark(reply_grammar(f'answer: "{final}" /[a-z]+/\n', HARMONY, "may"))
    assert accepts(g, f"<|channel|>analysis<|message|>hm, ok<|end|><|start|>assistant{final}yes")
    assert accepts(g, final + "yes") and not accepts(g, "<|channel|>analysis<|message|>a<|channel|>b<|end|>"
                                                      f"<|start|>assistant{final}yes")
    text = f"<|channel|>analysis<|message|>hm<|end|><|start|>assistant{final}yes"
    assert HARMONY.split(text, "may") == ("hm", final + "yes")
    parts = [HARMONY.split(text[:k], "may", final=False) for k in range(len(text) + 1)]
    assert all(final.startswith(a) or a.startswith(final) for _, a in parts)  # no header streamed as text
    assert all((b or "").startswith(a or "") for (a, _), (b, _) in zip(parts, parts[1:]))


def test_gemma4s_thought_channel_is_on_only_where_the_prompt_says_think():
    """Gemma 4 reasons in a thought channel, and only where its system turn holds `<|think|>` (the
    template's enable_thinking): without it, a reply is its answer (no block to open)."""
    assert ReasoningFormat.for_template(FAMILIES["gemma4"].template) is GEMMA4
    assert GEMMA4.state("<|turn>user\nhi<turn|>\n<|turn>model\n") == "off"
    assert GEMMA4.state("<|turn>system\n<|think|>\n<turn|>\n<|turn>user\nhi<turn|>\n<|turn>model\n") == "may"
    g = BYTE_COMPILER.compile_lark(reply_grammar('answer: /[a-z]+/\n', GEMMA4, "may"))
    assert accepts(g, "<|channel>thought\nhm, ok\n<channel|>yes") and accepts(g, "yes")
    assert GEMMA4.split("<|channel>thought\nhm\n<channel|>yes", "may") == ("hm", "yes")
    assert GEMMA4.split("<|channel>thou", "may", final=False) == ("", "")  # (the channel's name held back)
    assert reply_grammar("answer: /[a-z]+/\n", GEMMA4, "off") == "start: answer\nanswer: /[a-z]+/\n"  # no block


@pytest.fixture(scope="module")
def thinker(tmp_path_factory):
    """A tiny model with Qwen3's template: it reasons unless enable_thinking is false."""
    engine = ak.Engine(str(make_tiny_model(tmp_path_factory.mktemp("qwen3") / "m", chat="qwen3", max_positions=4096)),
                       num_slots=16384)
    yield engine
    engine.close()


def opens(engine) -> dict:
    """A logit bias that makes the random model open its block (a trained one does by itself)."""
    return {engine.tokenizer.token_to_id("<think>"): 100}


def test_a_reasoning_model_thinks_then_answers_valid_json(thinker):
    out = thinker.chat([{"role": "user", "content": "x?"}], schema=SCHEMA, temperature=1.0, seed=1, n=3,
                       max_tokens=120, max_reasoning_tokens=12, logit_bias=opens(thinker))
    for c in out.completions:
        assert c.reasoning and c.text.startswith("<think>\n") and c.finish_reason == "stop"
        jsonschema.validate(json.loads(c.content), SCHEMA)
        assert c.parsed == json.loads(c.content)
        block = c.text[: c.text.index("</think>")]
        # the budget closed it: 12 tokens, and the close waits for a character to end (a byte-level
        # tokenizer's character takes up to 4 tokens), plus its newline
        assert len(thinker.tokenizer.encode(block)) <= 12 + 3 + 1


def test_enable_thinking_false_does_not_think(thinker):
    out = thinker.chat([{"role": "user", "content": "x?"}], schema=SCHEMA, temperature=1.0, seed=1, n=3,
                       max_tokens=60, logit_bias=opens(thinker), chat_template_kwargs={"enable_thinking": False})
    for c in out.completions:
        assert c.reasoning is None and "<think>" not in c.text
        jsonschema.validate(json.loads(c.text), SCHEMA)


def test_a_block_the_prompt_opened(tmp_path):
    engine = ak.Engine(str(make_tiny_model(tmp_path / "r1", chat="r1", max_positions=4096)), num_slots=8192)
    try:
        out = engine.chat([{"role": "user", "content": "x?"}], schema=SCHEMA, temperature=1.0, seed=2, n=2,
                          max_tokens=80, max_reasoning_tokens=8)
        for c in out.completions:
            assert not c.text.startswith("<think>") and "</think>" in c.text and c.reasoning is not None
            jsonschema.validate(json.loads(c.content), SCHEMA)
    finally:
        engine.close()


def test_a_budget_needs_a_reasoning_model(tiny_engine):
    with pytest.raises(RequestError, match="max_reasoning_tokens"):
        tiny_engine.generate("hi", max_tokens=4, max_reasoning_tokens=8)
    with pytest.raises(RequestError, match="max_reasoning_tokens"):
        ak.SamplingParams(max_reasoning_tokens=0)


class Out(BaseModel):
    x: int = Field(ge=0, le=9)


def test_an_agent_thinks_at_every_step_and_keeps_its_prefix(thinker):
    """Each step reasons, then calls or answers under its grammar; every step's prompt starts with
    the one before (its KV reused), reasoning kept as the template keeps it."""
    seen = []

    @ak.tool
    def add(a: int, b: int) -> int:
        """Add two numbers."""
        seen.append((a, b))
        return a + b

    with ak.Agent("You add.", tools=[add], output_type=Out, tool_choice="required", max_steps=3, engine=thinker,
                  temperature=1.0, seed=2, max_tokens=200, max_reasoning_tokens=16, logit_bias=opens(thinker)) as agent:
        result = agent.run_sync("add 2 and 3")
    assert isinstance(result.output, Out) and seen
    steps = result.steps
    assert all(s.reasoning for s in steps) and steps[0].tool_calls and not steps[-1].tool_calls
    for before, after in zip(steps, steps[1:]):
        assert after.usage.cached_tokens >= before.usage.prompt_tokens


# ---- the server ---------------------------------------------------------------------------------------

openai = pytest.importorskip("openai")


@pytest.fixture(scope="module")
def client(thinker):
    from agentkv.server import create_app
    from tests.server.test_server import KEY, serving

    with serving(create_app(thinker, "tiny", KEY)) as base:
        yield openai.OpenAI(base_url=base, api_key=KEY, max_retries=0, timeout=120)


def test_server_returns_reasoning_content_and_streams_it(client, thinker):
    body = dict(model="tiny", messages=[{"role": "user", "content": "x?"}], max_tokens=120, seed=3, temperature=1.0,
                response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}},
                logit_bias={str(k): v for k, v in opens(thinker).items()})
    msg = client.chat.completions.create(**body, extra_body={"max_reasoning_tokens": 10}).choices[0].message
    assert msg.reasoning_content and "<think>" not in msg.content
    jsonschema.validate(json.loads(msg.content), SCHEMA)
    thought, content = "", ""
    for chunk in client.chat.completions.create(**body, extra_body={"max_reasoning_tokens": 10}, stream=True):
        if chunk.choices:
            thought += getattr(chunk.choices[0].delta, "reasoning_content", None) or ""
            content += chunk.choices[0].delta.content or ""
    assert (thought, content) == (msg.reasoning_content, msg.content)
    off = client.chat.completions.create(**body, extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert getattr(off.choices[0].message, "reasoning_content", None) is None
    jsonschema.validate(json.loads(off.choices[0].message.content), SCHEMA)


def test_server_refuses_template_variables_it_sets(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], max_tokens=2,
                                       extra_body={"chat_template_kwargs": {"messages": []}})
    assert e.value.body["param"] == "chat_template_kwargs"


def test_the_budget_closes_the_block_at_exactly_its_token(tmp_path):
    """max_reasoning_tokens=N: the block's close starts at output token N, unless a character is
    unfinished there (a byte-level tokenizer's character takes up to 4 tokens), then where it ends.
    Checked against a planted off-by-one (closing once N tokens were exceeded, at N + 1): it fails."""
    engine = ak.Engine(str(make_tiny_model(tmp_path / "r1", chat="r1", max_positions=4096)), num_slots=8192)
    try:
        budget, exact = 9, 0
        close = engine.tokenizer.encode(engine.reasoning.close_text, add_bos=False)
        out = engine.chat([{"role": "user", "content": "x?"}], schema=SCHEMA, temperature=1.0, seed=3, n=8,
                          max_tokens=80, max_reasoning_tokens=budget)
        for c in out.completions:
            ids = c.token_ids
            at = next(k for k in range(len(ids)) if ids[k : k + len(close)] == close)
            head = engine.tokenizer.decode(ids[:budget], skip_special_tokens=False)
            if head.endswith("\ufffd"):  # a character unfinished at N: closed where it ends
                assert at > budget and not engine.tokenizer.decode(ids[:at]).endswith("\ufffd")
            else:
                assert at == budget, (at, ids)
                exact += 1
        assert exact > 0
    finally:
        engine.close()

"""The families whose replies reason before they call, each in its own markers: Qwen3.5's opened
`<think>` block, Magistral's [THINK] tokens, gpt-oss's analysis channel, Gemma 4's thought channel
(on where the prompt turns thinking on); tiny models with the families' templates (tests/chat_templates.py)."""

from __future__ import annotations

import jsonschema
import pytest

import agentkv as ak
from agentkv.chat.formats import Gemma4, Harmony, MistralArgs, QwenXml
from tests.server.test_tool_families import ADD, SCHEMAS, WEATHER, ask
from tests.tiny import make_tiny_model

openai = pytest.importorskip("openai")


def test_qwen35_reasons_then_calls_in_xml(tmp_path):
    """Qwen3.5's template opens a reasoning block; the reply reasons (its budget closes the block),
    then calls in the XML format, each call's arguments valid, read back by the tools' schemas."""
    path = make_tiny_model(tmp_path / "q35", chat="qwen3_xml", max_positions=4096)
    with ak.Engine(str(path), num_slots=8192, seed=0) as engine:
        assert isinstance(engine.tool_format, QwenXml) and engine.reasoning is not None
        out = engine.chat(ask("add 1"), tools=[ADD, WEATHER], tool_choice="required", max_tokens=160, temperature=1.0,
                          seed=5, n=4, max_reasoning_tokens=6)
        made = 0
        for c in out.completions:
            assert c.reasoning is not None
            for call in c.tool_calls:
                jsonschema.validate(call.arguments, SCHEMAS[call.name])
            made += len(c.tool_calls)
        assert made


def test_magistral_reasons_in_think_tokens_then_calls_with_args(tmp_path):
    """Magistral's [THINK]...[/THINK] (special tokens, kept in the decoded text so the reply splits
    there) before [TOOL_CALLS]name[ARGS]{...} calls, each valid; through the server too, where the
    block comes back as reasoning_content. Checked against a planted bug (the reasoning markers not
    kept as text): the reply has no reasoning and this fails."""
    from agentkv.chat.reasoning import ReasoningFormat

    path = make_tiny_model(tmp_path / "mag", chat="magistral", max_positions=4096)
    with ak.Engine(str(path), num_slots=8192, seed=0) as engine:
        assert isinstance(engine.tool_format, MistralArgs)
        assert engine.reasoning == ReasoningFormat("[THINK]", "[/THINK]", "", "", "")
        think = engine.tokenizer.token_to_id("[THINK]")
        out = engine.chat(ask("add 1"), tools=[ADD, WEATHER], tool_choice="required", max_tokens=160, temperature=1.0,
                          seed=5, n=4, max_reasoning_tokens=6, logit_bias={think: 50})
        made = 0
        for c in out.completions:
            assert c.reasoning is not None and c.text.startswith("[THINK]")
            for call in c.tool_calls:
                jsonschema.validate(call.arguments, SCHEMAS[call.name])
            made += len(c.tool_calls)
        assert made
        from agentkv.server import create_app
        from tests.server.test_server import KEY, serving

        with serving(create_app(engine, "tiny", KEY)) as base:
            client = openai.OpenAI(base_url=base, api_key=KEY, max_retries=0, timeout=120)
            msg = client.chat.completions.create(
                model="tiny", messages=ask("add 1"), tools=[ADD], tool_choice="required", max_tokens=160, seed=1,
                temperature=1.0, extra_body={"max_reasoning_tokens": 6, "logit_bias": {str(think): 50}}
            ).choices[0].message
            assert msg.model_extra.get("reasoning_content") and msg.tool_calls


def test_gpt_oss_reasons_in_the_analysis_channel_and_answers_in_final(tmp_path):
    """gpt-oss's harmony channels: the analysis message is the reasoning (reasoning_content), a call
    follows in its commentary header, and a text answer comes from the final channel without its
    header, streamed or not. Checked against planted bugs (the next message's header left on the
    answer; the final channel's header left in the content): each fails here."""
    from agentkv.chat.reasoning import HARMONY

    path = make_tiny_model(tmp_path / "oss", chat="gpt_oss", max_positions=4096)
    with ak.Engine(str(path), num_slots=8192, seed=0) as engine:
        assert isinstance(engine.tool_format, Harmony) and engine.reasoning == HARMONY
        channel = engine.tokenizer.token_to_id("<|channel|>")
        out = engine.chat(ask("add 1"), tools=[ADD, WEATHER], tool_choice="required", max_tokens=120, temperature=1.0,
                          seed=5, n=4, max_reasoning_tokens=4, logit_bias={channel: 30})
        for c in out.completions:
            assert c.text.startswith("<|channel|>analysis<|message|>") and c.reasoning is not None
            assert len(c.tool_calls) == 1 or c.finish_reason == "length"
            for call in c.tool_calls:
                jsonschema.validate(call.arguments, SCHEMAS[call.name])
        from agentkv.server import create_app
        from tests.server.test_server import KEY, serving

        with serving(create_app(engine, "tiny", KEY)) as base:
            client = openai.OpenAI(base_url=base, api_key=KEY, max_retries=0, timeout=120)
            request = dict(model="tiny", messages=ask("add 1"), tools=[ADD], max_tokens=100, seed=3, temperature=1.0,
                           extra_body={"max_reasoning_tokens": 4, "logit_bias": {str(channel): 30}})
            msg = client.chat.completions.create(**request, tool_choice="required").choices[0].message
            assert msg.model_extra.get("reasoning_content") is not None and msg.tool_calls
            whole = client.chat.completions.create(**request, tool_choice="none").choices[0].message
            streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
                **request, tool_choice="none", stream=True) if c.choices)
            assert whole.content and "<|" not in whole.content and streamed == whole.content


def test_gemma4_thinks_in_its_thought_channel_where_thinking_is_on(tmp_path):
    """Gemma 4 reasons only where the prompt turns thinking on (`enable_thinking`: `<|think|>` in
    the system turn): the thought channel comes back as reasoning, then the call in its notation;
    with thinking off no channel is opened at all. Checked against a planted bug (the channel's
    name, `thought`, left on the reasoning): it fails here."""
    from agentkv.chat.reasoning import GEMMA4

    path = make_tiny_model(tmp_path / "gemma4", chat="gemma4", max_positions=4096)
    with ak.Engine(str(path), num_slots=8192, seed=0) as engine:
        assert isinstance(engine.tool_format, Gemma4) and engine.reasoning == GEMMA4
        channel = engine.tokenizer.token_to_id("<|channel>")
        kw = dict(tools=[ADD, WEATHER], tool_choice="required", max_tokens=120, temperature=1.0, seed=5, n=4,
                  max_reasoning_tokens=4, logit_bias={channel: 30})
        out = engine.chat(ask("add 1"), chat_template_kwargs={"enable_thinking": True}, **kw)
        for c in out.completions:
            assert c.text.startswith("<|channel>thought\n") and c.reasoning is not None
            assert not c.reasoning.startswith("thought") and (c.tool_calls or c.finish_reason == "length")
            for call in c.tool_calls:
                jsonschema.validate(call.arguments, SCHEMAS[call.name])
        for c in engine.chat(ask("add 1"), **kw).completions:  # thinking off: the channel is not open to it
            assert c.reasoning is None and c.text.startswith("<|tool_call>call:")

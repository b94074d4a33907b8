"""Tool calls in each family's own format, end to end: tiny random-weight models carrying the
families' chat templates and special tokens (tests/chat_templates.py), each of its own architecture,
driven through engine.chat,
ak.Agent, the server with the official `openai` client, and the frameworks people point at it
(pydantic-ai, the OpenAI Agents SDK, langchain-openai)."""

from __future__ import annotations

import json
from typing import Annotated

import jsonschema
import pytest
from pydantic import BaseModel, Field

import agentkv as ak
from agentkv.chat.formats import (
    DeepSeekV3,
    DeepSeekV31,
    FunctionGemma,
    Gemma4,
    Glm,
    Granite,
    Harmony,
    Hermes,
    Kimi,
    Llama3Json,
    Mistral,
    MistralArgs,
    Phi4Mini,
    Pythonic,
    QwenXml,
)
from agentkv.chat.messages import template_messages
from tests.tiny import make_tiny_model
from tests.tiny_families import make_family_model

FAMILIES = {"qwen2.5": Hermes, "llama3": Llama3Json, "mistral": Mistral, "pythonic": Pythonic, "qwen3_coder": QwenXml,
            "mistral_v11": MistralArgs, "glm45": Glm, "kimi_k2": Kimi, "deepseek_v31": DeepSeekV31,
            "deepseek_r1": DeepSeekV3, "granite33": Granite, "phi4_mini": Phi4Mini, "gpt_oss": Harmony,
            "gemma4": Gemma4, "gemma3_pythonic": Pythonic, "gemma3": Pythonic,
            "functiongemma": FunctionGemma}
# Families whose template writes calls and results but not the tools (their definitions go into the
# system prompt in the family's words)
NOT_NATIVE = {"deepseek_v31", "deepseek_r1", "gemma3"}
# How each family's template gives a tool's result back
RESULT_MARK = {"qwen2.5": "<tool_response>\n", "llama3": "<|start_header_id|>ipython<|end_header_id|>",
               "mistral": "[TOOL_RESULTS] {", "pythonic": "<|start_header_id|>ipython<|end_header_id|>",
               "qwen3_coder": "<tool_response>\n", "mistral_v11": "[TOOL_RESULTS]", "glm45": "<tool_response>\n",
               # Kimi's result names the call by the id it wrote
               "kimi_k2": "<|im_middle|>## Return of functions.add:", "deepseek_v31": "<｜tool▁output▁begin｜>",
               "deepseek_r1": "<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>",
               "granite33": "<|start_of_role|>tool<|end_of_role|>", "phi4_mini": "<|tool|>",
               "gemma4": "<|tool_response>response:add{value:<|\"|>",
               "functiongemma": "<start_function_response>response:add{value:<escape>",
               "gemma3_pythonic": "<start_of_turn>user\n<tool_response>\n",
               "gemma3": "<start_of_turn>user\n<tool_response>\n",
               "gpt_oss": "<|start|>functions.add to=assistant<|channel|>commentary<|message|>"}
ADD = {"type": "function", "function": {"name": "add", "description": "Add two numbers.", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9}, "ok": {"type": "boolean"},
                                     "note": {"type": ["string", "null"], "maxLength": 4}},
    "required": ["a"], "additionalProperties": False}}}
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 5}, "unit": {"enum": ["C", "F"]}},
    "required": ["city", "unit"], "additionalProperties": False}}}
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in (ADD, WEATHER)}
Small = Annotated[int, Field(ge=0, le=99)]
# Random weights whose choice between two tool names is not one-sided (at seed 0, the Llama-token
# models pick one name 40 times in 40), so a framework's run can both call a tool and then answer.
WEIGHT_SEEDS = {"qwen2.5": 1, "llama3": 5, "mistral": 0, "pythonic": 1, "qwen3_coder": 2, "mistral_v11": 0, "glm45": 0,
                "kimi_k2": 0, "deepseek_v31": 1, "deepseek_r1": 1, "granite33": 5, "phi4_mini": 0, "gemma4": 4,
                "gemma3_pythonic": 3, "gemma3": 3, "functiongemma": 5,
                "gpt_oss": 0}


# Each family's tiny model of its own architecture: built from transformers' config (tests/tiny_families.py)...
ARCHITECTURE = {"granite33": "granite", "glm45": "glm4_moe", "gpt_oss": "gpt_oss", "kimi_k2": "deepseek_v3",
                "deepseek_v31": "deepseek_v3", "deepseek_r1": "deepseek_v3", "gemma4": "gemma4_text"}
# ... or written by agentkv.testing (its family, and the ModelConfig family that reads it; FunctionGemma is a
# Gemma 3 270M); the rest (Llama 3's, pythonic Llama 3.2's) are Llamas
TINY_ARCHITECTURE = {"qwen2.5": ("qwen2", "qwen2"), "qwen3_coder": ("qwen3_moe", "qwen3_moe"),
                     "mistral": ("mistral", "llama"), "mistral_v11": ("mistral", "llama"),
                     "phi4_mini": ("phi3", "phi3"), "gemma3": ("gemma3_text", "gemma3"),
                     "functiongemma": ("gemma3_text", "gemma3"),
                     "gemma3_pythonic": ("gemma3_text", "gemma3")}


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request, tmp_path_factory):
    out, name = tmp_path_factory.mktemp(request.param) / "m", request.param
    if name in ARCHITECTURE:
        path = make_family_model(out, ARCHITECTURE[name], chat=name, seed=WEIGHT_SEEDS[name],
                                 config={"max_position_embeddings": 4096})
    else:
        arch = TINY_ARCHITECTURE.get(name, ("llama", "llama"))[0]
        path = make_tiny_model(out, arch, chat=name, max_positions=4096, seed=WEIGHT_SEEDS[name])
    engine = ak.Engine(str(path), num_slots=16384, seed=0)
    family = ARCHITECTURE.get(name, TINY_ARCHITECTURE.get(name, ("", "llama"))[1])
    assert engine.model_config.family == {"gemma4_text": "gemma4"}.get(family, family)
    yield name, engine
    engine.close()


def ask(text: str) -> list[dict]:
    return [{"role": "system", "content": "You add numbers."}, {"role": "user", "content": text}]


def test_the_family_is_detected_and_its_prompt_rendered(family):
    name, engine = family
    fmt = engine.tool_format
    assert type(fmt) is FAMILIES[name] and fmt.native == (name not in NOT_NATIVE)
    prompt = engine.render(fmt.offered(ask("add 1"), [ADD]), tools=fmt.template_tools([ADD]))
    # the tool by its JSON name (DeepSeek's prompt writes "### add", gpt-oss's "type add =")
    assert "You add numbers." in prompt and ('"add"' in prompt or name in ("deepseek_v31", "gpt_oss", "gemma4",
                                                                                   "functiongemma"))
    if name == "llama3":  # definitions in the system turn (tools_in_user_message=False), which an agent pins
        system = prompt.split("<|eot_id|>")[0]
        assert "Environment: ipython" in system and '"name": "add"' in system
    expected = {"qwen2.5": "<tools>", "llama3": '"parameters": dictionary', "mistral": "[AVAILABLE_TOOLS] [",
                "pythonic": "[func_name1(", "qwen3_coder": "<function=example_function_name>",
                "mistral_v11": "[AVAILABLE_TOOLS][", "glm45": "<arg_key>{arg-key-1}</arg_key>",
                "kimi_k2": '<|im_system|>tool_declare<|im_middle|>[{"type":"function","function":{"name":"add"',
                "deepseek_v31": "## Tools\nYou have access to the following tools:\n\n### add\nDescription: Add",
                "deepseek_r1": "## Tools\n\n### Function\n\nYou have the following functions available:\n\n- `add`:",
                "granite33": '<|start_of_role|>available_tools<|end_of_role|>[\n    {\n        "type"',
                "phi4_mini": '<|system|>You add numbers.<|tool|>[{"name": "add", "description": "Add two numbers.", ',
                "gemma3_pythonic": 'Example Format: [func_name1(params_name1=params_value1, ',
                "gemma3": "<start_of_turn>user\nYou add numbers.\n\n# Tools\n\nYou may call one or more functions",
                "functiongemma": "You add numbers.\n\nYou are a model that can do function calling with the following "
                                 "functions<start_function_declaration>declaration:add{description:<escape>Add two",
                "gemma4": '<|tool>declaration:add{description:<|"|>Add two numbers.<|"|>,parameters:{properties:{a:{',
                "gpt_oss": "namespace functions {\n\n// Add two numbers.\ntype add = (_: {\na: number,"}[name]
    assert expected in prompt


@pytest.mark.parametrize("choice", ["required", "add", "auto"])
def test_calls_parse_and_validate_in_every_mode(family, choice):
    name, engine = family
    fmt = engine.tool_format
    out = engine.chat(ask("add 1"), tools=[ADD, WEATHER], tool_choice=choice, max_tokens=160, temperature=1.0, seed=5,
                      n=4)
    made = 0
    for c in out.completions:
        for call in c.tool_calls:
            jsonschema.validate(call.arguments, SCHEMAS[call.name])
            assert choice != "add" or call.name == "add"
        made += len(c.tool_calls)
        if choice != "auto":
            assert c.tool_calls or c.finish_reason == "length"
        assert c.finish_reason in (("tool_calls", "length") if c.tool_calls else ("stop", "length"))
        for word in (*fmt.words, "<tool_response>"):  # no markup in the text
            assert word not in c.content
        assert not c.content.lstrip().startswith(fmt.opening)  # nor a call's start (pythonic text may hold "[")
    assert made or choice == "auto"


def test_agent_round_trip_in_the_familys_format(family):
    """The agent's call runs, its result goes back as the family's template writes results, and the
    next step's prompt starts with the last one's (its KV reused), except where the template itself
    rewrites a call (Mistral's adds ids and spacing, gpt-oss's re-spaces the arguments, vLLM's Gemma 3
    template drops the commas between them)."""
    name, engine = family
    seen = []

    @ak.tool
    def add(a: int, b: int) -> int:
        """Add two numbers."""
        seen.append((a, b))
        return a + b

    with ak.Agent("You add numbers.", tools=[add], tool_choice="required", max_steps=2, engine=engine, seed=3,
                  parallel_tool_calls=False,
                  temperature=1.0, max_tokens=120) as agent:
        result = agent.run_sync("add 2 and 3")
    first, second = result.steps
    assert first.tool_calls and seen and first.tool_results[0].value == sum(seen[0])
    # the conversation is in OpenAI's shape; rendered as the agent renders it, in the family's format
    prompt = engine.render(template_messages(result.messages[:-1], engine.tool_format))
    assert RESULT_MARK[name] in prompt and str(sum(seen[0])) in prompt.split(RESULT_MARK[name], 1)[1]
    if name in ("gpt_oss", "gemma3_pythonic"):
        # gpt-oss's template re-spaces a call's arguments (`tojson`); vLLM's Gemma 3 template drops the
        # comma between them (its `first` flag, set inside the loop, never outlives an iteration): the
        # prompt before the call re-reads
        assert second.usage.cached_tokens >= first.usage.prompt_tokens
    elif name != "mistral":
        # all but the reply's end: its last sampled token and the closing text the grammar forced
        # after it were never fed to the model (`}}` and the call's close, up to 6 tokens; an XML
        # call's closing tags, up to a byte token a character where the model sampled their first
        # byte rather than a tag's own token)
        tail = {"qwen3_coder": "\n</parameter>\n</function>\n</tool_call>", "glm45": "</arg_value>\n</tool_call>"}
        slack = len(tail[name]) + 2 if name in tail else 8
        assert second.usage.cached_tokens >= first.usage.prompt_tokens + first.usage.completion_tokens - slack


# ---- the server, with the clients people use -------------------------------------------------------------

openai = pytest.importorskip("openai")


@pytest.fixture(scope="module")
def live(family):
    from agentkv.server import create_app
    from tests.server.test_server import KEY, serving

    name, engine = family
    with serving(create_app(engine, "tiny", KEY)) as base:
        yield name, base, KEY


@pytest.fixture()
def client(live):
    return openai.OpenAI(base_url=live[1], api_key=live[2], max_retries=0, timeout=120)


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "add"}}, "auto"])
def test_openai_client_gets_calls_and_streamed_arguments(client, choice):
    request = dict(model="tiny", messages=ask("add 1"), tools=[ADD, WEATHER], tool_choice=choice, max_tokens=160,
                   temperature=1.0, seed=11)
    msg = client.chat.completions.create(**request).choices[0].message
    whole = [(c.function.name, c.function.arguments) for c in msg.tool_calls or []]
    for fn, args in whole:
        jsonschema.validate(json.loads(args), SCHEMAS[fn])
    assert whole or choice == "auto"
    streamed: dict[int, list[str]] = {}
    reason = None
    for chunk in client.chat.completions.create(**request, stream=True):
        for tc in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            entry = streamed.setdefault(tc.index, [tc.function.name, ""])
            entry[1] += tc.function.arguments or ""
        reason = chunk.choices[0].finish_reason if chunk.choices else reason
    got = [tuple(v) for v in streamed.values()]
    if reason == "length":  # a call cut by max_tokens streams as far as it went, as OpenAI's do
        got = got[:len(whole)]
    assert got == whole


def test_one_call_when_parallel_calls_are_off(client):
    for seed in range(3):
        msg = client.chat.completions.create(model="tiny", messages=ask("add 1"), tools=[ADD], tool_choice="required",
                                             parallel_tool_calls=False, max_tokens=160, temperature=1.0,
                                             seed=seed).choices[0].message
        assert len(msg.tool_calls) == 1


class Sum(BaseModel):
    total: Small


def framework_add(calls: list):
    def add(a: Small, b: Small) -> int:
        """Add two numbers."""
        calls.append((a, b))
        return a + b

    return add


def test_pydantic_ai(live):
    """pydantic-ai's agent calls our tool with arguments it validates, gets a typed output, and sends
    back its tool results (role tool) that the family's template renders."""
    pytest.importorskip("pydantic_ai")
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider
    from pydantic_ai.usage import UsageLimits

    model = OpenAIChatModel("tiny", provider=OpenAIProvider(base_url=live[1], api_key=live[2]))
    for seed in range(8):  # a random model picks between our tool and pydantic-ai's final_result
        calls: list = []
        agent = Agent(model, tools=[framework_add(calls)], output_type=Sum,
                      model_settings={"temperature": 1.0, "seed": seed, "max_tokens": 160})
        result = agent.run_sync("add 2 and 3", usage_limits=UsageLimits(request_limit=6))
        assert isinstance(result.output, Sum)
        if calls:
            break
    assert calls, "no run called the tool"


def test_openai_agents_sdk(live, family):
    """The Agents SDK's chat-completions model: a required call it parses, validates and runs (the
    run stops on it), and a typed output under its response_format. The runs are seeded, and a family
    that reasons first gets a reasoning budget: random weights can reason past max_tokens otherwise
    (finish_reason "length" with no output, which the SDK rightly refuses)."""
    pytest.importorskip("agents")
    from agents import (
        Agent,
        AsyncOpenAI,
        ModelSettings,
        OpenAIChatCompletionsModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )

    set_tracing_disabled(True)
    model = OpenAIChatCompletionsModel(model="tiny", openai_client=AsyncOpenAI(base_url=live[1], api_key=live[2]))
    calls: list = []
    caller = Agent(name="calc", instructions="Add numbers.", tools=[function_tool(framework_add(calls))], model=model,
                   tool_use_behavior="stop_on_first_tool",
                   model_settings=ModelSettings(temperature=1.0, max_tokens=100, tool_choice="required",
                                                extra_args={"seed": 4}))
    result = Runner.run_sync(caller, "add 2 and 3", max_turns=2)
    assert calls and str(result.final_output) == str(sum(calls[0]))
    budget = {"max_reasoning_tokens": 40} if family[1].reasoning is not None else None
    typed = Agent(name="calc", instructions="Add numbers.", output_type=Sum, model=model,
                  model_settings=ModelSettings(temperature=1.0, max_tokens=100, extra_args={"seed": 4},
                                               extra_body=budget))
    assert isinstance(Runner.run_sync(typed, "add 2 and 3", max_turns=1).final_output, Sum)


def test_langchain_openai(live):
    pytest.importorskip("langchain_openai")
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    calls: list = []
    llm = ChatOpenAI(model="tiny", base_url=live[1], api_key=live[2], temperature=1.0, max_tokens=100, seed=2)
    bound = llm.bind_tools([tool(framework_add(calls))], tool_choice="required")
    whole = bound.invoke("add 2 and 3").tool_calls
    assert whole and all(c["name"] == "add" and set(c["args"]) == {"a", "b"} for c in whole)
    merged = None
    for chunk in bound.stream("add 2 and 3"):  # langchain joins the argument deltas itself
        merged = chunk if merged is None else merged + chunk
    assert [(c["name"], c["args"]) for c in merged.tool_calls] == [(c["name"], c["args"]) for c in whole]

"""The agent loop on a tiny random model: whatever the model samples, every tool call is well-formed
and validates; tool_choice, errors, retries, max_steps, pins, streams and batches behave."""

from __future__ import annotations

import asyncio
import json
from typing import Annotated, Literal

import jsonschema
import pytest
from pydantic import BaseModel, Field, field_validator

import agentkv as ak

Short = Annotated[str, Field(max_length=6)]
Small = Annotated[int, Field(ge=0, le=99)]


@ak.tool
def get_weather(city: Short, unit: Literal["C", "F"] = "C") -> str:
    """Weather for a city."""
    return f"sunny in {city}, 18 {unit}"


@ak.tool
def add(a: Small, b: Small) -> int:
    """Add two integers."""
    return a + b


@ak.tool
def broken(x: Small) -> str:
    """Always fails."""
    raise ValueError(f"the service is down for {x}")


class Answer(BaseModel):
    value: Small
    ok: bool


class Refused(BaseModel):
    value: Small

    @field_validator("value")
    @classmethod
    def never(cls, v):
        raise ValueError("no value is ever right")


@pytest.fixture(scope="module")
def engine(tiny_long_dir):
    # seeded: its unseeded requests then draw the same seeds every run (sampling at temperature 1)
    with ak.Engine(str(tiny_long_dir), num_slots=16384, seed=0) as e:
        yield e


def agent(engine, **kw) -> ak.Agent:
    kw.setdefault("tools", [get_weather, add])
    kw.setdefault("max_tokens", 96)
    return ak.Agent("You are terse.", engine=engine, temperature=1.0, **kw)


def check_calls(result: ak.AgentResult, tools) -> int:
    """Every call names an offered tool with arguments that validate; returns how many there were."""
    by_name = {t.name: t for t in tools}
    n = 0
    for step in result.steps:
        assert len(step.tool_results) == len(step.tool_calls)
        for call, res in zip(step.tool_calls, step.tool_results):
            jsonschema.validate(call.arguments, by_name[call.name].parameters)
            assert res.call == call
            n += 1
    return n


def test_required_calls_validate_and_choice_returns_to_auto(engine):
    with agent(engine, tool_choice="required", max_steps=3) as a:
        results = [a.run_sync(f"task {i}") for i in range(4)]
    for r in results:
        first = r.steps[0]
        assert first.tool_choice == "required" and first.tool_calls, first.text
        assert all(s.tool_choice in ("auto", "none") for s in r.steps[1:])
        assert len(r.steps) <= 3 and r.steps[-1].tool_calls == []
        assert r.usage.tool_calls == check_calls(r, [get_weather, add]) >= 1
        for call, res in zip(first.tool_calls, first.tool_results):
            expected = get_weather.call(call.arguments) if call.name == "get_weather" else str(add.call(call.arguments))
            assert res.content == expected and res.error is None
        assert isinstance(r.output, str)
        # a reply cut inside a later call keeps the complete calls only
        # the conversation keeps structured calls (OpenAI's shape), the complete ones only
        turn = r.messages[2]
        assert turn["role"] == "assistant" and [c["function"]["name"] for c in turn["tool_calls"]] == \
            [c.name for c in first.tool_calls]
        assert [json.loads(c["function"]["arguments"]) for c in turn["tool_calls"]] == [
            c.arguments for c in first.tool_calls]
        assert [m["tool_call_id"] for m in r.messages[3 : 3 + len(first.tool_calls)]] == [
            c.id for c in first.tool_calls]


def test_call_cut_before_it_completes_is_retried(engine):
    with agent(engine, tool_choice="required", max_steps=4, max_tokens=20, retries=1) as a:
        with pytest.raises(ak.AgentRetriesError, match="cut at max_tokens") as info:
            a.run_sync("go")
    assert len(info.value.errors) == 2 and info.value.last_output.startswith("<tool_call>")


def test_named_tool_choice(engine):
    with agent(engine, tool_choice="add", max_steps=2) as a:
        r = a.run_sync("add things")
    assert r.steps[0].tool_calls and all(c.name == "add" for c in r.steps[0].tool_calls)
    with agent(engine, tool_choice="add", max_steps=2, parallel_tool_calls=False) as a:
        assert len(a.run_sync("once").steps[0].tool_calls) == 1
    assert r.steps[1].tool_choice == "none"  # the last step answers
    check_calls(r, [add])


def test_auto_calls_are_well_formed(engine):
    # Left alone, the random model writes text: it samples "<" first about once in 256 runs. A logit
    # bias on "<" makes it open calls (text may not start with "<"), so the checks run on calls it
    # chose to make; whatever it writes, a step without calls has no call's opening tag in it.
    lt = engine.tokenizer.encode("<")[-1]
    with agent(engine, tool_choice="auto", max_steps=3, logit_bias={lt: 30.0}) as a:
        results = a.run_batch_sync([f"question {i}" for i in range(8)])
    made = 0
    for r in results:
        made += check_calls(r, [get_weather, add])
        assert r.steps[0].tool_choice == "auto"
        for step in r.steps:
            if not step.tool_calls:
                assert "<tool_call>" not in step.text
    assert made >= len(results), made


pings: list[str] = []


@ak.tool
def ping() -> str:
    """Check that the service is up."""
    pings.append("ping")
    return f"pong {len(pings)}"


def test_repeated_calls_are_not_run_again(engine):
    """Every call of `ping` is the same call: the random model's twins in a step, and its calls in
    later steps, are repeats; each run runs it once, and the step after a repeat goes without it."""
    pings.clear()
    results: list[ak.AgentResult] = []
    with agent(engine, tools=[ping, add], tool_choice="ping", max_steps=4, max_tokens=256) as a:
        for batch in range(4):  # until the random model repeats itself (how soon depends on the host)
            more = a.run_batch_sync([f"check {batch} {i}" for i in range(8)])
            results += more
            if any(res.repeated for r in more for s in r.steps for res in s.tool_results):
                break
    repeats = 0
    for r in results:
        ran: dict[str, str] = {}
        for step, after in zip(r.steps, r.steps[1:] + [None]):
            for res in step.tool_results:
                key = json.dumps([res.call.name, res.call.arguments], sort_keys=True)
                assert res.repeated == (key in ran), step.text
                if res.repeated:
                    assert res.content == ran[key] and res.call.id.startswith(f"call_{step.index}_")
                    repeats += 1
                    assert after is None or all(c.name != res.call.name for c in after.tool_calls)
                ran.setdefault(key, res.content)
        assert r.usage.tool_calls == len(ran)
        # the conversation holds each call once, with its result once
        said = [c for m in r.messages if m["role"] == "assistant" for c in m.get("tool_calls", [])]
        assert len(said) == len(ran) and sum(m["role"] == "tool" for m in r.messages) == len(ran)
    assert repeats > 0 and len(pings) == len(results)  # one ping per run
    # rerun_calls: every call runs. Whether the random model calls twice in a run depends on the host's
    # float rounding, so batches go on (at most four) until one run did
    pings.clear()
    calls = runs = 0
    with agent(engine, tools=[ping], tool_choice="ping", max_steps=4, max_tokens=256, rerun_calls=True) as a:
        for batch in range(4):
            results = a.run_batch_sync([f"check {batch} {i}" for i in range(16)])
            assert not any(res.repeated for r in results for s in r.steps for res in s.tool_results)
            calls += sum(len(s.tool_calls) for r in results for s in r.steps)
            runs += len(results)
            if calls > runs:
                break
    assert len(pings) == calls > runs  # twins and later calls ran too


def test_tool_errors_go_back_to_the_model(engine):
    with agent(engine, tools=[broken], tool_choice="broken", max_steps=2) as a:
        r = a.run_sync("try it")
    res = r.steps[0].tool_results[0]
    assert res.error.startswith("ValueError: the service is down") and not res.refused
    assert res.content == f"error: {res.error}"
    assert res.content in r.messages[-2]["content"]  # the results message, before the final reply
    assert r.usage.retries == 0


def test_refused_output_is_retried_then_raised(engine):
    with agent(engine, output_type=Refused, tool_choice="none", retries=2, max_steps=5) as a:
        with pytest.raises(ak.AgentRetriesError) as info:
            a.run_sync("give a value")
    err = info.value
    assert len(err.errors) == 3 and all("no value is ever right" in e for e in err.errors)
    assert isinstance(err.last_output, str) and err.last_output.startswith('{"value":')


def test_structured_output_with_tools(engine):
    with agent(engine, output_type=Answer, tool_choice="auto", max_steps=3, max_tokens=128) as a:
        results = a.run_batch_sync([f"q{i}" for i in range(4)])
        # the model is told the output's fields (the grammar enforces them either way)
        assert '"value"' in a.system_message["content"] and "JSON object" in a.system_message["content"]
    for r in results:
        assert isinstance(r.output, Answer)
        check_calls(r, [get_weather, add])


def test_max_steps_ends_with_an_output(engine):
    with agent(engine, tool_choice="required", max_steps=2) as a:
        r = a.run_sync("go")
    assert [s.tool_choice for s in r.steps] == ["required", "none"]
    assert r.usage.steps == 2
    assert "<tool_call>" not in r.output  # the answer cannot pose as a call that never runs


def test_pin_is_held_then_released_and_reused(engine):
    before = engine.stats()["pins"]
    a = agent(engine, tool_choice="none", max_tokens=8)
    assert a.pinned_tokens == 0  # pinned on first use
    first = a.run_sync("hello")
    assert engine.stats()["pins"] == before + 1 and a.pinned_tokens > 100
    second = a.run_sync("hello again")
    # the pinned system prompt (with the tool definitions) is served from the cache
    assert second.steps[0].usage.cached_tokens >= a.pinned_tokens
    assert first.steps[0].usage.cached_tokens >= a.pinned_tokens  # pinned before the first step
    a.close()
    assert engine.stats()["pins"] == before and a.pinned_tokens == 0
    with pytest.raises(ak.AgentError):
        a.run_sync("closed")
    with agent(engine, pin=False, tool_choice="none", max_tokens=4) as b:
        b.run_sync("x")
        assert b.pinned_tokens == 0 and engine.stats()["pins"] == before


def test_stream_events_in_order(engine):
    with agent(engine, tool_choice="required", max_steps=2) as a:
        events = list(a.stream_sync("weather?"))
    kinds = [type(e).__name__ for e in events]
    assert kinds[0] == "StepStart" and kinds[-1] == "RunEnd" and kinds.count("StepEnd") == 2
    result = events[-1].result
    text = "".join(e.text for e in events if isinstance(e, ak.TextDelta) and e.step == 1)
    assert text == result.steps[0].text
    calls = [e.call for e in events if isinstance(e, ak.ToolCallEvent)]
    assert calls == result.steps[0].tool_calls
    assert kinds.index("ToolResultEvent") > kinds.index("ToolCallEvent")


def test_history_continues_a_conversation(engine):
    with agent(engine, tool_choice="none", max_tokens=8) as a:
        first = a.run_sync("one")
        second = a.run_sync("two", history=first.messages)
    assert second.messages[: len(first.messages)] == first.messages
    assert second.messages[len(first.messages)] == {"role": "user", "content": "two"}
    # the whole first conversation is cached
    assert second.steps[0].usage.cached_tokens >= len(engine.tokenizer.encode(engine.render(first.messages[:-1])))


def test_run_and_run_sync_inside_an_event_loop(engine):
    async def main():
        with agent(engine, tool_choice="none", max_tokens=4) as a:
            return await a.run("x"), a.run_sync("y")  # run_sync() works inside a running loop too

    r1, r2 = asyncio.run(main())
    assert isinstance(r1.output, str) and isinstance(r2.output, str)


def test_bad_agent_arguments():
    with pytest.raises(ak.RequestError, match="tool_choice"):
        ak.Agent(tools=[add], tool_choice="nope")
    with pytest.raises(ak.RequestError, match="needs tools"):
        ak.Agent(tool_choice="required")
    with pytest.raises(ak.RequestError, match="max_steps >= 2"):
        ak.Agent(tools=[add], tool_choice="required", max_steps=1)
    with pytest.raises(ak.RequestError, match="two tools"):
        ak.Agent(tools=[add, add.func])
    with pytest.raises(ak.RequestError, match="output_type"):
        ak.Agent(json_schema={"type": "object"})
    with pytest.raises(ak.RequestError, match="temperature"):
        ak.Agent(temperature=-1)
    with pytest.raises(ak.GrammarError, match="schema"):
        ak.Agent(output_type=42)


def test_bad_input(engine):
    with agent(engine) as a, pytest.raises(ak.RequestError, match="input"):
        a.run_sync(42)


def test_a_collected_agent_releases_its_pin(engine):
    """Agents made per request and dropped without close() must not use up the pin budget."""
    import gc
    import time

    before = engine.stats()["pins"]
    made = ak.Agent("You are terse.", engine=engine)
    _ = made.system_message  # set up: renders and pins the system prompt
    assert made.pinned_tokens and engine.stats()["pins"] == before + 1
    del made
    gc.collect()
    deadline = time.monotonic() + 10
    while engine.stats()["pins"] != before and time.monotonic() < deadline:  # posted to the engine thread
        time.sleep(0.05)
    assert engine.stats()["pins"] == before
    closed = ak.Agent("You are terse.", engine=engine)
    _ = closed.system_message
    closed.close()  # closed first: the finalizer does nothing more
    del closed
    gc.collect()
    assert engine.stats()["pins"] == before


def test_a_strict_agent_refuses_an_output_its_grammar_cannot_enforce(tiny_engine):
    """strict=True (the schema contract, docs/structured.md): a set's uniqueItems cannot be in the
    grammar, so the run is refused, naming the keyword, before anything is generated."""
    with ak.Agent("x", output_type=set[int], strict=True, engine=tiny_engine) as agent:
        with pytest.raises(ak.GrammarError, match="uniqueItems"):
            agent.run_sync("x")

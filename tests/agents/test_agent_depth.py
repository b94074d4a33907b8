"""The agent machinery a pydantic-ai or Agents SDK user expects, on agentkv.testing's tiny random
model (the real engine and grammar): run context and deps, instruction functions after the pinned
prompt, output types and functions, validators and ModelRetry, per-tool retries, handoffs, agents as
tools, per-step tool selection, approvals, the async-first API and its deprecated sync forms."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Annotated, Literal

import jsonschema
import pytest
from pydantic import BaseModel, Field

import agentkv as ak
from agentkv.chat.messages import template_messages
from agentkv.testing import tiny_engine

Small = Annotated[int, Field(ge=0, le=99)]


@dataclass
class Bank:
    customer: str
    balances: dict


@pytest.fixture(scope="module")
def engine():
    with tiny_engine() as e:
        yield e


@ak.tool
def balance(ctx: ak.RunContext[Bank], account: Literal["checking", "savings"]) -> str:
    """The balance of one of the customer's accounts."""
    return f"{ctx.deps.customer}: {ctx.deps.balances[account]}"


@ak.tool
def add(a: Small, b: Small) -> int:
    """Add two integers."""
    return a + b


class Cat(BaseModel):
    kind: Literal["cat"]
    lives: Small


class Dog(BaseModel):
    kind: Literal["dog"]
    good: bool


def test_a_tool_reads_deps_and_the_context_is_not_shown_to_the_model(engine):
    assert "ctx" not in json.dumps(balance.parameters) and balance.takes_context
    bank = Bank("ada", {"checking": 12, "savings": 30})
    with ak.Agent("Bank helper.", tools=[balance], tool_choice="balance", max_steps=2, engine=engine,
                  deps_type=Bank, max_tokens=160) as agent:
        result = agent.run_sync("my balance?", deps=bank)
    call, res = result.steps[0].tool_calls[0], result.steps[0].tool_results[0]
    assert res.content == f"ada: {bank.balances[call.arguments['account']]}" and res.error is None
    with pytest.raises(ak.ToolDefinitionError, match="RunContext"):
        balance.call({"account": "checking"})  # outside a run, the context must be given
    assert balance.call({"account": "savings"}, ctx=ak.RunContext(bank, None, None, None)) == "ada: 30"


def test_instruction_functions_vary_per_run_after_the_pinned_prompt(engine):
    with ak.Agent("You are a bank assistant.", engine=engine, tool_choice="none", max_tokens=4) as agent:
        @agent.instructions
        def who(ctx: ak.RunContext[Bank]) -> str:
            return f"The customer is {ctx.deps.customer}."

        runs = [agent.run_sync("hi", deps=Bank(name, {})) for name in ("ada", "grace", "linus")]
        pinned = agent.pinned_tokens
    assert pinned > 0
    for r, name in zip(runs, ("ada", "grace", "linus")):
        assert r.messages[0] == agent.system_message and r.messages[1] == {
            "role": "system", "content": f"The customer is {name}."}
        # the pinned prompt is read from cache; the per-run instructions after it are computed
        assert r.steps[0].usage.cached_tokens >= pinned
    prompts = [engine.render(template_messages(r.messages[:-1], engine.tool_format)) for r in runs]
    assert all(p.startswith(engine.render([agent.system_message], add_generation_prompt=False)) for p in prompts)
    assert len({r.steps[0].usage.prompt_tokens - r.steps[0].usage.cached_tokens for r in runs[1:]}) == 1


def test_a_union_output_returns_either_model(engine):
    with ak.Agent("Name a pet.", output_type=[Cat, Dog], engine=engine, temperature=1.0, max_tokens=160,
                  retries=3) as agent:
        outputs = [r.output for r in agent.run_batch_sync([f"pet {i}" for i in range(12)])]
    assert all(isinstance(o, (Cat, Dog)) for o in outputs)
    assert {type(o) for o in outputs} == {Cat, Dog}


def test_primitive_list_and_function_outputs(engine):
    with ak.Agent("Numbers.", output_type=list[Small], engine=engine, temperature=1.0, max_tokens=160) as agent:
        out = agent.run_sync("some numbers").output
    assert isinstance(out, list) and all(isinstance(x, int) and 0 <= x <= 99 for x in out)

    def file_ticket(priority: Literal["low", "high"], code: Small) -> str:
        """File a support ticket."""
        return f"ticket {code} ({priority})"

    with ak.Agent("Triage.", output_type=file_ticket, engine=engine, temperature=1.0, max_tokens=160) as agent:
        out = agent.run_sync("the printer is on fire").output
    assert out.startswith("ticket ") and out.endswith(("(low)", "(high)"))


def test_an_output_validator_asks_for_a_retry(engine):
    seen = []
    with ak.Agent("Pick a number.", output_type=Small, engine=engine, temperature=1.0, max_tokens=16,
                  output_retries=2) as agent:
        @agent.output_validator
        def once(ctx: ak.RunContext, value: int) -> int:
            seen.append(ctx.retry)
            if ctx.retry == 0:
                raise ak.ModelRetry("pick another number")
            return value * 2

        result = agent.run_sync("go")
    assert seen == [0, 1] and isinstance(result.output, int) and result.output % 2 == 0
    assert result.usage.retries == 1 and result.steps[0].error == "pick another number"
    assert result.messages[3] == {"role": "user", "content": "pick another number\n\nFix the errors and try again."}
    with ak.Agent("Pick.", output_type=Small, engine=engine, output_retries=1, max_tokens=16) as agent:
        agent.output_validator(lambda v: (_ for _ in ()).throw(ak.ModelRetry("never")))
        with pytest.raises(ak.AgentRetriesError, match="output_retries=1") as err:
            agent.run_sync("go")
    assert err.value.errors == ["never", "never"]


def test_model_retry_in_a_tool_counts_against_its_own_retries(engine):
    calls = []

    @ak.tool(retries=2)
    def flaky(x: Small) -> str:
        """Never happy."""
        calls.append(x)
        raise ak.ModelRetry(f"x={x} is wrong")

    # a call the tool refused leaves the step's tool_choice in force: the model calls again
    with ak.Agent("Try.", tools=[flaky], tool_choice="flaky", engine=engine, retries=0, max_steps=6,
                  max_tokens=160, rerun_calls=True, parallel_tool_calls=False, temperature=1.0) as agent:
        with pytest.raises(ak.AgentRetriesError, match="retries=2"):
            agent.run_sync("go")
    assert len(calls) == 3  # two retries, then the third refusal ends the run


def test_a_handoff_passes_the_conversation_and_both_prompts_stay_pinned(engine):
    billing = ak.Agent("You handle billing.", name="billing", description="Invoices and refunds.", engine=engine,
                       tool_choice="none", max_tokens=8)
    with billing, ak.Agent("You triage.", name="triage", handoffs=[billing], tool_choice="transfer_to_billing",
                           engine=engine, max_tokens=160) as triage:
        assert "Invoices and refunds" in triage.tools["transfer_to_billing"].description
        result = triage.run_sync("I was charged twice")
        assert triage.pinned_tokens > 0 and billing.pinned_tokens > 0
    assert [s.agent for s in result.steps] == ["triage", "billing"] and result.agent == "billing"
    assert result.steps[0].tool_calls[0].name == "transfer_to_billing"
    assert result.steps[0].tool_results[0].content == "Transferred to billing."
    assert result.messages[0] == billing.system_message and isinstance(result.output, str)
    assert [m["role"] for m in result.messages[1:]] == ["user", "assistant", "tool", "assistant"]


def test_an_agent_as_a_tool_merges_its_usage(engine):
    inner = ak.Agent("Add numbers.", name="adder", tools=[add], tool_choice="add", max_steps=2, engine=engine,
                     max_tokens=160)
    with (
        inner,
        ak.Agent("Delegate.",
                 tools=[inner.as_tool(description="Ask the adder.", input_type=Annotated[str, Field(max_length=8)])],
                 tool_choice="adder", max_steps=2, engine=engine, max_tokens=160) as outer,
    ):
        result = outer.run_sync("1 + 2")
    sub = result.steps[0].tool_results[0]
    assert sub.error is None and isinstance(sub.value, str)
    own = sum(s.usage.completion_tokens for s in result.steps)
    assert result.usage.steps == len(result.steps) + 2 and result.usage.tool_calls == 2
    assert result.usage.completion_tokens > own


def test_a_tool_prepare_tools_leaves_out_cannot_be_called(engine):
    offered = []

    def no_add(ctx, tools):
        offered.append([t.name for t in tools])
        return [t for t in tools if t.name != "add"]

    @ak.tool
    def weather(city: Annotated[str, Field(max_length=8)]) -> str:
        """Weather."""
        return f"sun in {city}"

    with ak.Agent("Helper.", tools=[add, weather], prepare_tools=no_add, tool_choice="required", max_steps=2,
                  engine=engine, temperature=1.0, max_tokens=160) as agent:
        results = agent.run_batch_sync([f"q{i}" for i in range(8)])
        assert '"add"' in agent.system_message["content"]  # still defined in the pinned prompt
    assert offered[0] == ["add", "weather"]
    calls = [c for r in results for s in r.steps for c in s.tool_calls]
    assert calls and all(c.name == "weather" for c in calls)


def test_a_call_waits_for_approval_and_the_run_continues(engine):
    ran = []

    @ak.tool(requires_approval=True)
    def refund(amount: Small) -> str:
        """Refund money."""
        ran.append(amount)
        return f"refunded {amount}"

    with ak.Agent("Refunds.", tools=[refund], tool_choice="refund", max_steps=3, engine=engine,
                  max_tokens=160) as agent:
        paused = agent.run_sync("refund me")
        assert isinstance(paused.output, ak.ApprovalRequired) and not ran
        calls = paused.output.calls
        done = agent.run_sync(history=paused.messages, approvals={c.id: True for c in calls})
        refused = agent.run_sync(history=paused.messages, approvals={c.id: "over the limit" for c in calls})
        with pytest.raises(ak.RequestError, match="wait for approval"):
            agent.run_sync(history=paused.messages, approvals={"other": True})
    call = calls[0]
    assert ran == [c.arguments["amount"] for c in calls] and isinstance(done.output, str)
    assert {"role": "tool", "tool_call_id": call.id, "name": "refund",
            "content": f"refunded {ran[0]}"} in done.messages
    assert any(m.get("content") == "The call was not run: over the limit" for m in refused.messages)


def test_async_first_api_and_deprecated_sync_forms(engine):
    with ak.Agent("Hi.", engine=engine, max_tokens=4) as agent:

        async def main():
            return await agent.run("x"), [e async for e in agent.stream("y")]

        result, events = asyncio.run(main())
        assert isinstance(result.output, str) and isinstance(events[-1], ak.RunEnd)
        with pytest.warns(DeprecationWarning, match="run_sync"):
            assert isinstance(agent.run("z").output, str)  # the form before 0.2
        with pytest.warns(DeprecationWarning, match="stream_sync"):
            assert isinstance(list(agent.stream("z"))[-1], ak.RunEnd)
        with pytest.raises(ak.RequestError, match="unknown options.*temperature"):
            agent.run_sync("x", temperature=0.5)


def test_run_batch_caps_concurrency(engine):
    live, peak = [0], [0]

    @ak.tool
    async def slow(x: Small) -> str:
        """Slow."""
        live[0] += 1
        peak[0] = max(peak[0], live[0])
        await asyncio.sleep(0.05)
        live[0] -= 1
        return "ok"

    with ak.Agent("S.", tools=[slow], tool_choice="slow", max_steps=2, engine=engine, max_tokens=160) as agent:
        results = asyncio.run(agent.run_batch([f"{i}" for i in range(6)], max_concurrency=2))
    assert len(results) == 6 and peak[0] <= 2


def test_history_takes_the_receiving_agents_system_and_keeps_structured_calls(engine):
    with (ak.Agent("First.", tools=[add], tool_choice="add", max_steps=2, engine=engine, max_tokens=160) as a,
          ak.Agent("Second.", engine=engine, max_tokens=4) as b):
        first = a.run_sync("1+1")
        second = b.run_sync("and now?", history=first.messages)
        assert second.messages[0] == b.system_message
    assert second.messages[1:len(first.messages)] == first.messages[1:]
    turn = first.messages[2]
    jsonschema.validate(json.loads(turn["tool_calls"][0]["function"]["arguments"]), add.parameters)


def test_a_forced_final_step_is_flagged(engine):
    with ak.Agent("A.", tools=[add], tool_choice="required", max_steps=2, engine=engine, max_tokens=160) as agent:
        result = agent.run_sync("go")
    assert [s.forced for s in result.steps] == [False, True] and result.forced_final
    with ak.Agent("B.", engine=engine, max_tokens=4) as agent:
        assert not agent.run_sync("go").forced_final


def test_choices_refuse_sampling_options(engine):
    with pytest.raises(ak.RequestError, match="temperature"):
        ak.generate("x", choices=["a", "b"], temperature=0.7, engine=engine)
    with pytest.raises(ak.RequestError, match="max_tokens"):
        ak.gen("v", choices=["a", "b"], max_tokens=5)
    assert asyncio.run(ak.agenerate("x", choices=["a", "b"], engine=engine)) in ("a", "b")
    assert isinstance(asyncio.run(ak.agenerate("x", schema=list[bool], engine=engine, max_tokens=32)), list)


def test_unknown_agent_options_are_named():
    with pytest.raises(ak.RequestError, match="unknown sampling parameter.*foo"):
        ak.Agent("x", foo=1)


class GrammarSpy:
    """An engine (what an agent needs of one: agents/_engine.py) that records each step's grammar."""

    def __init__(self, engine):
        self._engine, self.grammars = engine, []

    def __getattr__(self, name):
        return getattr(self._engine, name)

    def stream(self, prompt, params=None, **sampling):
        self.grammars.append(params.grammar)
        return self._engine.stream(prompt, params, **sampling)


@ak.tool
def refund(invoice: Small) -> str:
    """Refund an invoice."""
    return f"refunded {invoice}"


def test_a_handoff_gives_the_receiving_agent_its_own_tools(engine):
    """The first step after a handoff runs under a grammar that offers the receiving agent's tools,
    not the first agent's (checked on the grammar, not on the step's label). Checked against a planted
    bug: the run keeping the first agent after the transfer; the receiving step's grammar then offers
    `add`, and the test fails."""
    spy = GrammarSpy(engine)
    billing = ak.Agent("You handle billing.", name="billing", tools=[refund], tool_choice="required", engine=spy,
                       max_tokens=160, max_steps=2)
    with billing, ak.Agent("You triage.", name="triage", tools=[add], handoffs=[billing], engine=spy,
                           tool_choice="transfer_to_billing", max_tokens=160, max_steps=3) as triage:
        result = triage.run_sync("I was charged twice")
    assert [s.agent for s in result.steps][:2] == ["triage", "billing"]
    # (each offered tool's call is a part of the step's composed grammar)
    first, second = ("\n".join(g.parts) for g in spy.grammars[:2])
    assert "transfer_to_billing" in first and "refund" not in first
    assert "refund" in second and '"add"' not in second and "transfer_to_billing" not in second

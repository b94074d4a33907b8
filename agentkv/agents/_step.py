"""One step of an agent run: its prompt (the conversation rendered in the model's format), its turn
(chat/turn.py: the step's mode over the offered tools and the output, after any reasoning block),
and how the completion reads back as a Step.
"""

from __future__ import annotations

import dataclasses

from agentkv.agents._result import Step
from agentkv.chat.messages import template_messages
from agentkv.chat.turn import Turn


def agent_prompt(agent, setup, engine, messages: list[dict]) -> str:
    return engine.render(
        template_messages(messages, setup.format), tools=setup.format.template_tools(setup.definitions),
        **agent.chat_template_kwargs)


def step_turn(agent, setup, mode: str, offered: list, state: str, markup_free: bool = False) -> Turn:
    """The step's turn: the grammar of its mode over the offered tools and the output, after a
    reasoning block where the model reasons. `markup_free`: the conversation holds calls, so text
    may not write the format's markup even where this agent has no tools."""
    if mode in agent.tools:  # a named tool: calls of it only
        tools, mode = [agent.tools[mode]], "required"
    elif mode == "none":
        tools = list(agent.tools.values())  # the answer's text may not imitate their markup
    else:
        tools = offered
    return Turn(setup.format, tuple(tools), mode=mode, schema=agent.output_spec.schema,
                parallel=agent.parallel_tool_calls, markup_free=markup_free, reasoning=setup.reasoning, state=state)


def read_step(agent, turn: Turn, index: int, mode: str, completion) -> tuple[Step, str, str]:
    """The step a completion makes, the text the conversation keeps of it (its reasoning included:
    the chat template keeps or drops it, as the model was trained), and of that the part before its
    calls.

    A reply cut by max_tokens keeps the calls it completed (the cut one is dropped); cut before any
    call, it is an error the model is asked to correct, unless it is free text, which is returned as
    it is (as `ak.generate` returns a cut free-text reply). Arguments are not checked here: the run
    validates them with the tool's own model and asks the model to correct a refusal."""
    text, cut = completion.text, completion.finish_reason == "length"
    reply = turn.read_text(text, cut, check=False)
    step = Step(index, mode, text, content=reply.content, reasoning=reply.reasoning)
    if turn.mode == "none":
        if cut and not agent.output_spec.text:
            step.error = f"the reply was cut at max_tokens ({agent.params.max_tokens}) before it was complete"
        return step, text, text
    step.tool_calls = [dataclasses.replace(c, id=c.id or f"call_{index}_{k}") for k, c in enumerate(reply.calls)]
    head = len(text) - len(reply.answer)  # the reasoning block's length
    before = text[: head + max(reply.calls_start, 0)]
    if completion.complete or reply.calls_start < 0 and agent.output_spec.text and mode == "auto":
        return step, text, before
    if reply.calls:
        return step, text[: head + reply.calls_end], before
    step.error = (
        f"the reply was cut at max_tokens ({agent.params.max_tokens}) before it was complete; "
        "write shorter arguments, or fewer calls"
    )
    return step, text, before


def history_content(fmt, before_calls: str, step: Step) -> str:
    """The assistant turn's text before its calls, as the conversation keeps it: so that the format
    writing it back (text, its separator, the calls) gives what the model wrote."""
    sep = fmt.between_text_and_calls
    return before_calls[: -len(sep)] if sep and before_calls.endswith(sep) else before_calls

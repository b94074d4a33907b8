"""One step of an agent run: its prompt (the conversation rendered in the model's format), its
grammar (the step's mode over the offered tools and the output, after any reasoning block), and how
the completion reads back as a Step.
"""

from __future__ import annotations

import dataclasses

from agentkv.agents._result import Step
from agentkv.chat.messages import template_messages
from agentkv.chat.reasoning import reply_grammar


def agent_prompt(agent, setup, engine, messages: list[dict]) -> str:
    return engine.render(
        template_messages(messages, setup.format),
        tools=setup.format.template_tools(setup.definitions),
        **agent.chat_template_kwargs,
    )


def step_params(agent, setup, mode: str, offered: list, state: str, markup_free: bool = False):
    """The sampling parameters of a step: the agent's, with the grammar of the step's mode over the
    offered tools, after a reasoning block where the model reasons. `markup_free`: the conversation
    holds calls, so text may not write the format's markup even where this agent has no tools."""
    schema = agent.output_spec.schema
    if mode in agent.tools:  # a named tool: calls of it only
        tools, mode = [agent.tools[mode]], "required"
    elif mode == "none":
        tools = list(agent.tools.values())  # the answer's text may not imitate their markup
    else:
        tools = offered
    if mode != "none" and not tools:
        mode = "none"
    answer = setup.format.answer_grammar(
        tools,
        mode,
        schema,
        agent.parallel_tool_calls,
        close_objects=agent.params.close_objects,
        markup_free=markup_free,
    )
    grammar = reply_grammar(answer, setup.reasoning, state)
    return agent.params.with_(grammar=grammar) if grammar is not None else agent.params


def read_step(agent, setup, index: int, mode: str, completion, state: str = "off") -> tuple[Step, str, str]:
    """The step a completion makes, the text the conversation keeps of it (its reasoning included:
    the chat template keeps or drops it, as the model was trained), and of that the part before its
    calls.

    A reply cut by max_tokens keeps the calls it completed (the cut one is dropped); cut before any
    call, it is an error the model is asked to correct, unless it is free text, which is returned as
    it is (as `ak.generate` returns a cut free-text reply)."""
    text, fmt = completion.text, setup.format
    thought, answer = setup.reasoning.split(text, state) if state != "off" else (None, text)
    step = Step(index, mode, text, content=answer, reasoning=thought)
    cut = completion.finish_reason == "length"
    if mode == "none":
        if cut and not agent.output_spec.text:
            step.error = f"the reply was cut at max_tokens ({agent.params.max_tokens}) before it was complete"
        return step, text, text
    step.content, calls, end = fmt.parse(answer, cut=cut)
    step.tool_calls = [dataclasses.replace(c, id=f"call_{index}_{k}") for k, c in enumerate(calls)]
    start = fmt.calls_start(answer)
    before = text[: len(text) - len(answer) + max(start, 0)]
    if completion.complete or start < 0 and agent.output_spec.text and mode == "auto":
        return step, text, before
    if calls:
        return step, text[: len(text) - len(answer) + end], before
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

"""A batch of agents sharing one prompt: eight support tickets triaged by the same agent at once.
The engine batches their steps, and every one starts from the agent's pinned system prompt and tool
definitions, so only each ticket's own text is prefilled.

    agentkv run examples/batch_agents.py     (or: python examples/batch_agents.py)
"""

from typing import Annotated, Literal

from pydantic import BaseModel, Field

import agentkv as ak

ORDERS = {"A-100": "shipped on Monday", "A-101": "delayed at customs", "A-102": "delivered yesterday"}
TICKETS = [
    "Order A-100 has not arrived yet, where is it?",
    "I was charged twice for my subscription this month.",
    "The app crashes when I open the settings page.",
    "Can you tell me the status of order A-101?",
    "How do I change the email address on my account?",
    "My package A-102 says delivered but I cannot find it.",
    "Please cancel my account and delete my data.",
    "The checkout page shows an error 500.",
]


@ak.tool
def lookup_order(order_id: Annotated[str, Field(pattern=r"^A-[0-9]{3}$")]) -> str:
    """The shipping status of an order.

    Args:
        order_id: The order's id, like "A-100".
    """
    # (the pattern is the call's grammar: a small model cannot run on in the id, as it may in a bare string)
    return ORDERS.get(order_id, f"no order {order_id}")


class Triage(BaseModel):
    category: Literal["shipping", "billing", "bug", "account"]
    urgent: bool
    reply: str = Field(max_length=160)


agent = ak.Agent(
    "You triage customer support tickets. Look up orders when a ticket names one, then answer with "
    "the ticket's category, whether it is urgent, and a short reply to the customer.",
    tools=[lookup_order],
    output_type=Triage,
    parallel_tool_calls=False,
    max_steps=3,
    max_tokens=128,
)


def main() -> str:
    results = agent.run_batch_sync(TICKETS)
    for ticket, r in zip(TICKETS, results):
        calls = ", ".join(f"{c.name}({c.arguments})" for s in r.steps for c in s.tool_calls)
        print(f"{r.output.category:8} urgent={r.output.urgent!s:5} {ticket}  [{calls or 'no tools'}]")
    prompt = sum(r.usage.prompt_tokens for r in results)
    cached = sum(r.usage.cached_tokens for r in results)
    return (f"{len(results)} tickets, {sum(r.usage.steps for r in results)} steps, "
            f"{cached}/{prompt} prompt tokens from the cache ({cached / prompt:.0%}), "
            f"{agent.pinned_tokens} tokens pinned")


if __name__ == "__main__":
    print(main())
    agent.close()

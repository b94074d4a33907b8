"""A support desk: a triage agent that knows who is asking (deps), looks up their orders with a
tool that reads the run context, and hands billing questions to a billing agent. Both agents'
system prompts stay pinned in the radix cache; the customer's name is a per-run instruction
rendered after the pinned prompt, so it costs only its own tokens.

    agentkv run examples/support_desk.py     (or: python examples/support_desk.py)
"""

from __future__ import annotations

from dataclasses import dataclass

import agentkv as ak


@dataclass
class Customer:
    name: str
    orders: dict[str, str]
    balance_due: float


billing = ak.Agent(
    "You are the billing desk. Answer the customer's billing question in one or two sentences, "
    "using the amount they owe.",
    name="billing",
    description="Questions about invoices, charges and payments.",
    tool_choice="none",
    max_tokens=80,
)


@billing.instructions
def billing_facts(ctx: ak.RunContext[Customer]) -> str:
    return f"The customer is {ctx.deps.name}; they owe {ctx.deps.balance_due:.2f} EUR."


@ak.tool
def order_status(ctx: ak.RunContext[Customer], order_id: str) -> str:
    """The shipping status of one of the customer's orders.

    Args:
        order_id: The order's id, like "A-100".
    """
    return ctx.deps.orders.get(order_id, f"{ctx.deps.name} has no order {order_id}")


triage = ak.Agent(
    "You are a support desk. For a question about an order, call order_status, then answer the "
    "customer with its result in one sentence. For a question about bills, charges or payments, "
    "call transfer_to_billing.",
    name="triage",
    tools=[order_status],
    handoffs=[billing],
    deps_type=Customer,
    tool_choice="required",  # the first step calls a tool or hands off; after it the model decides
    parallel_tool_calls=False,
    max_steps=4,
    max_tokens=80,
)


@triage.instructions
def who(ctx: ak.RunContext[Customer]) -> str:
    return f"The customer is {ctx.deps.name}."


def main() -> str:
    ada = Customer("Ada", {"A-100": "Order A-100 was shipped on Monday and arrives on Thursday."}, 42.5)
    for question in ("Where is my order A-100?", "Why was I charged twice this month?"):
        result = triage.run_sync(question, deps=ada)
        path = " -> ".join(dict.fromkeys(s.agent for s in result.steps))
        calls = ", ".join(f"{c.name}({c.arguments})" for s in result.steps for c in s.tool_calls)
        print(f"{question}\n  {path}: [{calls}]\n  {result.output}")
        print(f"  cache hit {result.usage.cache_hit_rate:.0%}, {result.usage.steps} steps")
    return "done"


if __name__ == "__main__":
    main()
    triage.close()
    billing.close()

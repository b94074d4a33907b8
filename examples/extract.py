"""Extraction with a schema: each record comes back as a validated Pydantic object. The grammar
writes the JSON punctuation and keys itself (jump-forward), so the model spends forward passes only
on the values: compare `forward_passes` with `completion_tokens`.

    python examples/extract.py     (or: agentkv run examples/extract.py)
"""

from typing import Literal

from pydantic import BaseModel, Field

import agentkv as ak


class Invoice(BaseModel):
    vendor: str = Field(max_length=40)
    number: str = Field(pattern=r"^[A-Z]{2}-[0-9]{4}$")
    currency: Literal["EUR", "USD", "GBP"]
    total: float = Field(ge=0)
    paid: bool


TEXTS = [
    "Invoice AB-1234 from Acme GmbH: total 1,250.00 EUR, not yet paid.",
    "Northwind Ltd billed us USD 89.90 (invoice NW-0042); it was paid by card.",
]


def main() -> list[Invoice]:
    engine = ak.default_engine()  # the embedded SmolLM2-135M-Instruct on CPU, or `agentkv run --model`
    invoices = []
    for text in TEXTS:
        messages = [{"role": "user", "content": f"Extract the invoice as JSON: {text}"}]
        out = engine.chat(messages, schema=Invoice, temperature=0.0)
        invoices.append(out.parsed)  # an Invoice; IncompleteOutputError if max_tokens had cut it
        u = out.usage
        print(repr(invoices[-1]))
        print("   ", out.text)
        print(f"    {u.completion_tokens} tokens, {u.jump_forward_tokens} forced by the grammar, "
              f"{u.forward_passes} forward passes")
    print(ak.generate("Is an unpaid invoice overdue after 90 days? Answer:", choices=[" yes", " no"], engine=engine))
    return invoices


if __name__ == "__main__":
    main()

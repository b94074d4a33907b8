"""Structured generation: jump-forward on vs off vs HF transformers `generate` with llguidance masks.

Two workloads, greedy, one request at a time (the latency an agent sees per call):
- tool calls: `{"name": ..., "arguments": {...}}` for eight realistic tools, each asked from a chat
  prompt that states the task;
- extraction: a record (person, invoice, event) from a short passage;
- schemastore: three small real schemas (SchemaStore), no passage to copy from.

agentkv runs both arms on one engine (prompts and grammars warmed by one untimed round, as a
deployed agent's would be); the peer is HF transformers `generate` on the same model, in a worker
process of this run (see common.py), with a logits processor that applies llguidance's token mask.
Every output is validated with jsonschema ("finished": ended before max_tokens; "valid": finished
and valid). Prints forward passes, wall time, validity and the ratios.

    python benchmarks/structured.py [--rounds 2] [--max-tokens 320] [--skip-hf]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import Peer, table

import agentkv as ak

STR = {"type": "string"}
TOOLS = {
    "get_weather": (
        "What's the weather in Paris this weekend, in celsius?",
        {"city": STR, "unit": {"enum": ["celsius", "fahrenheit"]},
         "days": {"type": "integer", "minimum": 1, "maximum": 7}},
    ),
    "search_flights": (
        "Find a flight from JFK to LHR on 2025-03-01 for 2 people.",
        {"origin": {"type": "string", "pattern": "^[A-Z]{3}$"},
         "destination": {"type": "string", "pattern": "^[A-Z]{3}$"}, "date": {"type": "string", "format": "date"},
         "passengers": {"type": "integer", "minimum": 1, "maximum": 9}},
    ),
    "send_email": (
        "Email bob@example.com that the quarterly report will be late.",
        {"to": {"type": "string", "format": "email"}, "subject": {"type": "string", "maxLength": 60},
         "body": {"type": "string", "maxLength": 200}},
    ),
    "create_event": (
        "Put a meeting called Launch review on 2025-04-02 with Dana and Omar.",
        {"title": {"type": "string", "maxLength": 40}, "date": {"type": "string", "format": "date"},
         "attendees": {"type": "array", "items": {"type": "string", "maxLength": 20}, "maxItems": 5}},
    ),
    "convert_currency": (
        "Convert 250 EUR to JPY.",
        {"amount": {"type": "number", "minimum": 0}, "from_currency": {"enum": ["EUR", "USD", "JPY", "GBP"]},
         "to_currency": {"enum": ["EUR", "USD", "JPY", "GBP"]}},
    ),
    "lookup_contact": ("What is Dana Smith's phone number?", {"name": {"type": "string", "maxLength": 40}}),
    "set_reminder": (
        "Remind me to call mom at 18:30.",
        {"text": {"type": "string", "maxLength": 80}, "time": {"type": "string", "pattern": "^[0-2][0-9]:[0-5][0-9]$"}},
    ),
    "query_orders": (
        "Show my shipped orders from March, at most 5.",
        {"status": {"enum": ["open", "shipped", "delivered", "cancelled"]},
         "month": {"type": "integer", "minimum": 1, "maximum": 12},
         "limit": {"type": "integer", "minimum": 1, "maximum": 50}},
    ),
}
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40}, "age": {"type": "integer", "minimum": 0, "maximum": 130},
        "email": {"type": "string", "format": "email"}, "city": {"type": "string", "maxLength": 30},
        "skills": {"type": "array", "items": {"type": "string", "maxLength": 20}, "maxItems": 4}},
    "required": ["name", "age", "email", "city", "skills"],
    "additionalProperties": False,
}
INVOICE = {
    "type": "object",
    "properties": {"vendor": {"type": "string", "maxLength": 40},
                   "number": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{4}$"},
                   "date": {"type": "string", "format": "date"}, "currency": {"enum": ["EUR", "USD", "GBP"]},
                   "total": {"type": "number", "minimum": 0, "maximum": 1000000}, "paid": {"type": "boolean"}},
    "required": ["vendor", "number", "date", "currency", "total", "paid"],
    "additionalProperties": False,
}
EVENT = {
    "type": "object",
    "properties": {"title": {"type": "string", "maxLength": 60}, "date": {"type": "string", "format": "date"},
                   "start": {"type": "string", "pattern": "^[0-2][0-9]:[0-5][0-9]$"},
                   "location": {"type": "string", "maxLength": 40}, "online": {"type": "boolean"}},
    "required": ["title", "date", "start", "location", "online"],
    "additionalProperties": False,
}
EXTRACT = [
    ("Maria Lopez, 34, lives in Madrid. Reach her at maria@lopez.es. She knows Python and SQL.", PERSON),
    ("Contact: Ken Ito (ken.ito@example.jp), age 51, based in Osaka; skills: welding, CAD.", PERSON),
    ("Invoice AB-1234 from Acme GmbH, dated 2025-02-14: total 1,250.00 EUR, not yet paid.", INVOICE),
    ("Northwind Ltd billed us USD 89.90 on 2025-01-03 (invoice NW-0042); it was paid by card.", INVOICE),
    ("The team offsite is on 2025-06-12 at 09:30 in the Lisbon office, in person.", EVENT),
    ("Webinar: Intro to Rust, 2025-05-20, starts 17:00, on Zoom.", EVENT),
]
SCHEMASTORE = ["chart-lock", "imgbotconfig", "cdk"]


def tool_schema(name: str) -> dict:
    props = TOOLS[name][1]
    args = {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}
    return {"type": "object", "properties": {"name": {"const": name}, "arguments": args},
            "required": ["name", "arguments"], "additionalProperties": False}


def workloads() -> dict[str, list[tuple[list[dict], dict]]]:
    tools = [([{"role": "user", "content": f"Call the tool {n} with JSON arguments for: {task}"}], tool_schema(n))
             for n, (task, _) in TOOLS.items()]
    extract = [([{"role": "user", "content": f"Extract the record as JSON: {text}"}], s) for text, s in EXTRACT]
    out = {"tool calls": tools, "extraction": extract}
    root = Path(__file__).resolve().parents[2] / "shared" / "data" / "schemastore"
    store = []
    for name in SCHEMASTORE:
        path = root / f"{name}.json"
        if path.exists():
            s = json.loads(path.read_text())["schema"]
            store.append(([{"role": "user", "content": f"Write an example {name} JSON file."}], s))
    if store:
        out["schemastore"] = store
    return out


def valid(text: str, schema: dict) -> bool:
    import jsonschema

    try:
        jsonschema.validate(json.loads(text), schema)
        return True
    except (ValueError, jsonschema.ValidationError):
        return False


def run_agentkv(engine: ak.Engine, jobs, jump_forward: bool, max_tokens: int) -> dict:
    passes = tokens = jumped = ok = done = 0
    start = time.perf_counter()
    for msgs, schema in jobs:
        out = engine.chat(msgs, schema=schema, temperature=0.0, max_tokens=max_tokens, jump_forward=jump_forward)
        passes += out.usage.forward_passes
        tokens += out.usage.completion_tokens
        jumped += out.usage.jump_forward_tokens
        done += out.finish_reason == "stop"
        ok += out.finish_reason == "stop" and valid(out.text, schema)
    return {"wall": time.perf_counter() - start, "passes": passes, "tokens": tokens, "jumped": jumped, "valid": ok,
            "finished": done}


# -- the peer: HF generate + llguidance, in the worker process -------------------------------------------


def _hf_structured(
    prompts: list[list[int]], schemas: list[dict], max_tokens: int, eos: int) -> tuple[float, list[list[int]]]:
    import common
    import llguidance
    import llguidance.hf
    import llguidance.torch as ltorch
    import torch
    import transformers

    model = common._hf_model
    if getattr(common, "_lltok", None) is None:
        from agentkv.engine.loader import embedded_model_path

        path = embedded_model_path()
        hf_tok = transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        common._lltok = llguidance.hf.from_tokenizer(hf_tok, eos_token=eos)
    lltok = common._lltok

    class Mask(transformers.LogitsProcessor):
        def __init__(self, matcher):
            self.m, self.start, self.bitmask = matcher, None, ltorch.allocate_token_bitmask(1, lltok.vocab_size)

        def __call__(self, input_ids, scores):
            if self.start is None:
                self.start = input_ids.shape[1]
            elif input_ids.shape[1] > self.start:
                self.m.consume_token(int(input_ids[0, -1]))
                self.start = input_ids.shape[1]
            ltorch.fill_next_token_bitmask(self.m, self.bitmask, 0)
            allowed = ((self.bitmask.unsqueeze(-1) >> torch.arange(32, dtype=torch.int32)) & 1).reshape(1, -1)
            return scores.masked_fill(allowed[:, : scores.shape[1]] == 0, float("-inf"))

    outs, start = [], time.perf_counter()
    for ids, schema in zip(prompts, schemas):
        m = llguidance.LLMatcher(lltok, llguidance.LLMatcher.grammar_from_json_schema(
            schema, defaults={"whitespace_flexible": False}))
        with torch.no_grad():
            out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.int64),
                                 max_new_tokens=max_tokens, do_sample=False, eos_token_id=eos, pad_token_id=eos,
                                 logits_processor=transformers.LogitsProcessorList([Mask(m)]))
        outs.append(out[0, len(ids):].tolist())
    return time.perf_counter() - start, outs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=2, help="timed rounds (after one untimed warm round)")
    ap.add_argument("--max-tokens", type=int, default=320)
    ap.add_argument("--skip-hf", action="store_true")
    args = ap.parse_args()

    engine = ak.Engine()
    groups = workloads()
    peer = None if args.skip_hf else Peer()
    rows = []
    for group, jobs in groups.items():
        for jf in (True, False):  # warm: prompts in the radix cache, grammars compiled, masks cached
            run_agentkv(engine, jobs, jf, args.max_tokens)
        res = {"on": [], "off": []}
        for r in range(args.rounds):
            for arm in ("on", "off") if r % 2 == 0 else ("off", "on"):
                res[arm].append(run_agentkv(engine, jobs, arm == "on", args.max_tokens))
        best = {arm: min(rs, key=lambda x: x["wall"]) for arm, rs in res.items()}
        off = best["off"]
        for arm, label in (("on", "agentkv jump-forward on"), ("off", "agentkv jump-forward off")):
            b = best[arm]
            rows.append(
                [group, label, len(jobs), b["finished"], b["valid"], b["passes"], b["tokens"], b["jumped"], b["wall"],
                 1 - b["passes"] / off["passes"], off["wall"] / b["wall"]]
            )
        if peer is not None:
            eos = sorted(engine.tokenizer.eos_ids)[0]
            prompts = [engine.tokenizer.encode(engine.render(m)) for m, _ in jobs]
            schemas = [s for _, s in jobs]
            peer.call(_hf_structured, prompts[:1], schemas[:1], 8, eos)  # warm
            wall, outs = min(
                (peer.call(_hf_structured, prompts, schemas, args.max_tokens, eos) for _ in range(args.rounds)),
                key=lambda x: x[0])
            texts = [engine.tokenizer.decode([t for t in o if t != eos]) for o in outs]
            passes = sum(len(o) for o in outs)
            rows.append([group, "HF generate + llguidance", len(jobs), sum(len(o) < args.max_tokens for o in outs),
                         sum(valid(t, s) for t, s in zip(texts, schemas)),
                         passes, sum(len([t for t in o if t != eos]) for o in outs), 0, wall,
                         1 - passes / off["passes"], off["wall"] / wall])
    print(table(rows, ["workload", "engine", "requests", "finished", "valid", "forward passes", "completion tokens",
                       "jump-forward tokens", "wall s", "passes saved vs off", "speed vs off"]))
    if peer is not None:
        peer.close()
    engine.close()


if __name__ == "__main__":
    main()

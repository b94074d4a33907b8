"""A chat turn on the embedded model, then the same question again: the second is served from the
radix cache (watch `cached_tokens`). Run with `make demo`."""

import time

import agentkv as ak

engine = ak.Engine()  # the embedded SmolLM2-135M-Instruct, on CPU
messages = [
    {"role": "system", "content": "You are a concise assistant. Answer in one sentence."},
    {"role": "user", "content": "What is the capital of France?"},
]
for attempt in (1, 2):
    start = time.perf_counter()
    out = engine.chat(messages, max_tokens=48, temperature=0.0)
    took = time.perf_counter() - start
    u = out.usage
    print(f"[{attempt}] {out.text!r}")
    print(f"    prompt {u.prompt_tokens} tok ({u.cached_tokens} cached), {u.completion_tokens} generated in {took:.2f}s")

messages += [{"role": "assistant", "content": out.text}, {"role": "user", "content": "And of Italy?"}]
out = engine.chat(messages, max_tokens=48, temperature=0.0)
print(f"[3] {out.text!r}  (prompt {out.usage.prompt_tokens} tok, {out.usage.cached_tokens} cached)")
print("engine:", {k: v for k, v in engine.stats().items() if k in ("cache_hit_rate", "cached_tokens", "forward_passes")})
engine.close()

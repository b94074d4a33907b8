"""A chat turn on the embedded model, then the same question again: the second is served from the
radix cache (watch `cached_tokens`).

    python examples/chat.py        (or: agentkv run examples/chat.py)
"""

import time

import agentkv as ak


def main() -> str:
    engine = ak.default_engine()  # the embedded SmolLM2-135M-Instruct on CPU, or `agentkv run --model`
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
        print(
            f"    prompt {u.prompt_tokens} tok ({u.cached_tokens} cached), "
            f"{u.completion_tokens} generated in {took:.2f}s"
        )

    messages += [{"role": "assistant", "content": out.text}, {"role": "user", "content": "And of Italy?"}]
    out = engine.chat(messages, max_tokens=48, temperature=0.0)
    print(f"[3] {out.text!r}  (prompt {out.usage.prompt_tokens} tok, {out.usage.cached_tokens} cached)")
    stats = engine.stats()
    return f"cache hit rate {stats['cache_hit_rate']:.0%}, {stats['forward_passes']} forward passes"


if __name__ == "__main__":
    print(main())

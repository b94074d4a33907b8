"""The library's sampling defaults, in one place.

The library's own calls (`ak.generate`, `ak.agenerate`, `ak.stream`, each step of an `ak.Agent`,
the DSL's `ak.gen`) are deterministic by default: temperature 0.0, so a schema, a tool call or an
extraction is the model's most likely one, and the same input gives the same output. They stop
where their grammar ends, at EOS, or after LIBRARY_MAX_TOKENS tokens, which only bounds a runaway.
Pass `temperature=` (and `seed=` for a repeatable sample) to sample.

The engine's own API (`Engine.generate`, `SamplingParams()`) and the OpenAI-compatible server follow
OpenAI's API instead: temperature 1.0 unless the request says otherwise; `SamplingParams` stops
after 128 tokens unless given `max_tokens` (the server: the context's end).
"""

LIBRARY_TEMPERATURE = 0.0
LIBRARY_MAX_TOKENS = 1024

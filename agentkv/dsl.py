"""The generation DSL: programs that interleave prompt text and generations, SGLang-style.

    @ak.function
    def pros_and_cons(s, topic):
        s += ak.system("You are a careful analyst.")
        s += ak.user(f"Give one argument about {topic}.")
        sides = s.fork(2)                                # both branches share the prompt so far
        for side, lean in zip(sides, ["for", "against"]):
            side += ak.user(f"Argue {lean}.")
            side += ak.assistant(ak.gen("argument", max_tokens=64))
        s += ak.user(f"For: {sides[0]['argument']}\\nAgainst: {sides[1]['argument']}\\nWhich is stronger?")
        s += ak.assistant(ak.select("verdict", ["for", "against"]))

    state = pros_and_cons.run(topic="remote work")      # state["verdict"], state.text(), state.usage

A state runs its operations in order on a thread of its own: `s += ...` returns at once, and reading
a variable waits for it. So the branches of a fork generate concurrently and the engine batches
them; `fork` first prefills the parent's prompt once, so every branch starts from cached KV.
Without roles, a program builds raw text (`s += "Q: ..."; s += ak.gen("a")`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from agentkv.defaults import LIBRARY_MAX_TOKENS, LIBRARY_TEMPERATURE
from agentkv.engine.sampling_params import SamplingParams
from agentkv.errors import RequestError
from agentkv.typed import choose, default_engine


@dataclass(frozen=True)
class Gen:
    """A generation (see `gen`)."""

    name: str | None
    choices: tuple[str, ...] | None = None
    structured: dict = field(default_factory=dict)  # json_schema / regex / grammar
    sampling: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Role:
    role: str
    parts: tuple[Any, ...]  # strings and Gens


def gen(name: str | None = None, *, max_tokens: int = LIBRARY_MAX_TOKENS, stop: str | Sequence[str] | None = None,
        regex: str | None = None, schema: Any = None, choices: Sequence[str] | None = None,
        temperature: float = LIBRARY_TEMPERATURE, **sampling: Any) -> Gen:
    """Generate text here and store it as `state[name]`: free text, text matching `regex`, JSON
    under `schema` (the variable holds the validated object), or the most likely of `choices`.
    Temperature and max_tokens default as the whole library does (agentkv/defaults.py)."""
    if choices is not None:
        if schema is not None or regex is not None:
            raise RequestError("give ak.gen `choices` alone, not with schema or regex")
        given = {**sampling, **({"stop": stop} if stop else {}),
                 **({"max_tokens": max_tokens} if max_tokens != LIBRARY_MAX_TOKENS else {}),
                 **({"temperature": temperature} if temperature != LIBRARY_TEMPERATURE else {})}
        if given:  # the most likely option is scored, not sampled: these would do nothing
            raise RequestError(f"ak.gen with `choices` picks the most likely option; {sorted(given)} do not "
                               "apply to it: remove them")
        return select(name, choices)
    structured = {k: v for k, v in {"json_schema": schema, "regex": regex}.items() if v is not None}
    params = dict(max_tokens=max_tokens, temperature=temperature, stop=stop or (), **structured, **sampling)
    SamplingParams(**params)  # bad options fail here, where the program names them
    return Gen(name, None, structured, {k: v for k, v in params.items() if k not in structured})


def select(name: str | None, choices: Sequence[str]) -> Gen:
    """Choose the option the model finds most likely (mean token logprob) and store it as `state[name]`."""
    choices = tuple(choices)
    if not choices or not all(isinstance(c, str) and c for c in choices):
        raise RequestError("select needs a non-empty list of non-empty strings")
    return Gen(name, choices)


def system(*parts: Any) -> Role:
    return _role("system", parts)


def user(*parts: Any) -> Role:
    return _role("user", parts)


def assistant(*parts: Any) -> Role:
    return _role("assistant", parts)


def _role(role: str, parts: tuple) -> Role:
    flat = [p for part in parts for p in (part if isinstance(part, (list, tuple)) else [part])]
    for p in flat:
        if not isinstance(p, (str, Gen)):
            raise RequestError(f"ak.{role}() takes text and ak.gen/ak.select, not {type(p).__name__}")
        if isinstance(p, Gen) and role != "assistant":
            raise RequestError(f"generate inside ak.assistant(...), not ak.{role}(...)")
    return Role(role, tuple(flat))


class ProgramState:
    """The prompt a program has built so far, its variables, and the usage of its generations."""

    def __init__(self, engine, messages: list[dict] | None = None, raw: str = "", variables: dict | None = None):
        self.engine = engine
        self._messages = messages or []
        self._raw = raw
        self._vars: dict[str, Any] = dict(variables or {})
        self.usage: list = []  # the engine Usage of each generation, in order
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="agentkv-program")
        self._tail: Future | None = None
        self._lock = threading.Lock()
        self._branches: list[ProgramState] = []

    # ---- building ------------------------------------------------------------------------------------

    def __iadd__(self, item: Any) -> ProgramState:
        if isinstance(item, str):
            self._submit(lambda: self._append_text(item))
        elif isinstance(item, Role):
            self._submit(lambda: self._add_role(item))
        elif isinstance(item, Gen):
            self._submit(lambda: self._generate_raw(item))
        else:
            raise RequestError(f"add text, ak.system/user/assistant(...) or ak.gen(...) to a program state, "
                               f"not {type(item).__name__}")
        return self

    def fork(self, n: int) -> Fork:
        """`n` copies of this state that continue independently. The prompt so far is prefilled once
        first, so every branch starts from its cached KV."""
        if not isinstance(n, int) or n < 1:
            raise RequestError(f"fork needs a number of branches >= 1, got {n!r}")
        self.wait()
        prompt = self._prompt(for_generation=False)
        if prompt and self.engine.config.cache.enable_radix_cache:
            self.engine.prefill(prompt)
        branches = [ProgramState(self.engine, [dict(m) for m in self._messages], self._raw, self._vars)
                    for _ in range(n)]
        self._branches.extend(branches)
        return Fork(branches)

    # ---- reading (each waits for the operations before it) ---------------------------------------------

    def __getitem__(self, name: str) -> Any:
        self.wait()
        if name not in self._vars:
            raise KeyError(f"no variable {name!r} in this program state; it has {sorted(self._vars)}")
        return self._vars[name]

    def get(self, name: str, default: Any = None) -> Any:
        self.wait()
        return self._vars.get(name, default)

    @property
    def variables(self) -> dict[str, Any]:
        self.wait()
        return dict(self._vars)

    def text(self) -> str:
        """The whole prompt and generations as the model saw them (chat template applied)."""
        self.wait()
        return self._prompt(for_generation=False)

    def messages(self) -> list[dict]:
        self.wait()
        return [dict(m) for m in self._messages]

    def wait(self) -> ProgramState:
        """Wait for every operation submitted so far (re-raising the first failure)."""
        with self._lock:
            tail = self._tail
        if tail is not None:
            tail.result()
        return self

    def wait_all(self) -> ProgramState:
        """Wait for this state and every branch forked from it (re-raising the first failure), so
        an error in a branch nobody read is not lost."""
        self.wait()
        for b in self._branches:
            b.wait_all()
        return self

    def close(self) -> None:
        """Stop the state's thread and its branches' (after their pending operations)."""
        for b in self._branches:
            b.close()
        self._pool.shutdown(wait=True)

    # ---- operations, run in order on the state's thread -------------------------------------------------

    def _submit(self, op: Callable[[], None]) -> None:
        with self._lock:
            prev = self._tail

            def run() -> None:
                if prev is not None:
                    prev.result()  # an earlier failure stops the program here
                op()

            self._tail = self._pool.submit(run)

    def _append_text(self, text: str) -> None:
        if self._messages:
            self._messages[-1]["content"] += text
        else:
            self._raw += text

    def _add_role(self, item: Role) -> None:
        if self._raw:
            raise RequestError("this program started as raw text; it cannot switch to chat messages")
        self._messages.append({"role": item.role, "content": ""})
        for part in item.parts:
            if isinstance(part, str):
                self._messages[-1]["content"] += part
            else:
                self._messages[-1]["content"] += self._run_gen(part)

    def _generate_raw(self, g: Gen) -> None:
        if self._messages:
            raise RequestError("in a chat program, generate inside ak.assistant(...): s += ak.assistant(ak.gen(...))")
        self._raw += self._run_gen(g)

    def _run_gen(self, g: Gen) -> str:
        prompt = self._prompt(for_generation=True)
        if g.choices is not None:
            text = value = choose(self.engine, prompt, g.choices)
        else:
            out = self.engine.generate(prompt, **g.sampling, **g.structured)
            self.usage.append(out.usage)
            text = out.text
            value = out.parsed if "json_schema" in g.structured else text
        if g.name is not None:
            self._vars[g.name] = value
        return text

    def _prompt(self, for_generation: bool) -> str:
        """The text the model continues: the messages rendered, the open assistant message last."""
        if not self._messages:
            return self._raw
        if for_generation and self._messages[-1]["role"] == "assistant":
            done, partial = self._messages[:-1], self._messages[-1]["content"]
            return self.engine.render(done) + partial if done else partial
        return self.engine.render(self._messages, add_generation_prompt=False)


class Fork(list):
    """The branches of `ProgramState.fork`; `fork["x"]` is the list of each branch's `x`."""

    def __getitem__(self, key):
        if isinstance(key, str):
            return [state[key] for state in self]
        return super().__getitem__(key)

    def join(self) -> Fork:
        """Wait for every branch."""
        for state in self:
            state.wait()
        return self


class Program:
    """A function made a program by `@ak.function`; `run(**kwargs)` gives its final `ProgramState`."""

    def __init__(self, func: Callable[..., Any]):
        self.func = func
        self.__name__, self.__doc__ = func.__name__, func.__doc__

    def run(self, *, engine=None, **kwargs: Any) -> ProgramState:
        state = ProgramState(engine or default_engine())
        try:
            self.func(state, **kwargs)
            return state.wait_all()
        finally:
            state.close()

    def run_batch(self, batch: Sequence[dict], *, engine=None) -> list[ProgramState]:
        """Run the program once per dict of arguments, concurrently (the engine batches them)."""
        batch = list(batch)
        if not batch:
            return []
        with ThreadPoolExecutor(min(len(batch), 64), thread_name_prefix="agentkv-batch") as pool:
            return list(pool.map(lambda kw: self.run(engine=engine, **kw), batch))

    __call__ = run


def function(func: Callable[..., Any]) -> Program:
    """Make `func(s, **kwargs)` a program: `func.run(**kwargs)`, `func.run_batch([...])`."""
    if not callable(func):
        raise RequestError(f"@ak.function needs a function, not {type(func).__name__}")
    return Program(func)

"""The DSL on the tiny model: programs build the prompts engine.generate would get, forks prefill the
parent once and every branch reads it from the cache, select picks the best-scored option."""

from __future__ import annotations

import re

import pytest
from pydantic import BaseModel, Field

import agentkv as ak


class Pair(BaseModel):
    a: int = Field(ge=0, le=9)
    b: bool


@pytest.fixture(scope="module")
def engine(tiny_long_dir):
    with ak.Engine(str(tiny_long_dir), num_slots=8192) as e:
        yield e


def test_raw_program_matches_generate(engine):
    @ak.function
    def qa(s, question):
        s += f"Q: {question}\nA:"
        s += ak.gen("answer", max_tokens=12)
        s += "\nDigits: "
        s += ak.gen("digits", regex=r"[0-9]{3}")

    state = qa.run(question="why?", engine=engine)
    first = engine.generate("Q: why?\nA:", max_tokens=12, temperature=0.0).text
    assert state["answer"] == first
    assert re.fullmatch(r"[0-9]{3}", state["digits"])
    assert state.text() == f"Q: why?\nA:{first}\nDigits: {state['digits']}"
    assert len(state.usage) == 2 and state.usage[1].cached_tokens > 0  # the second gen reads the first's KV


def test_chat_program_renders_like_chat(engine):
    @ak.function
    def chat(s):
        s += ak.system("Be brief.")
        s += ak.user("Hi")
        s += ak.assistant("Sure: ", ak.gen("reply", max_tokens=8))
        s += ak.user("Pair?")
        s += ak.assistant(ak.gen("pair", schema=Pair, temperature=1.0, seed=3))

    state = chat.run(engine=engine)
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    expected = engine.generate(engine.render(msgs) + "Sure: ", max_tokens=8, temperature=0.0).text
    assert state["reply"] == expected
    assert isinstance(state["pair"], Pair)
    assert state.messages()[2] == {"role": "assistant", "content": "Sure: " + expected}
    assert state.text() == engine.render(state.messages(), add_generation_prompt=False)


def test_fork_prefills_once_and_every_branch_hits_the_cache(engine):
    @ak.function
    def branches(s, n):
        s += ak.system("You write tags. " * 20)
        s += ak.user("Write a tag.")
        forks = s.fork(n)
        for i, f in enumerate(forks):
            f += ak.user(f"Variant {i}.")
            f += ak.assistant(ak.gen("tag", max_tokens=6, temperature=1.0, seed=i))
        forks.join()
        s += ak.user("Pick one: " + ", ".join(forks["tag"]))
        s += ak.assistant(ak.select("pick", forks["tag"]))
        s.forks = forks

    before = engine.stats()["prefill_tokens_computed"]
    state = branches.run(n=4, engine=engine)
    parent = [{"role": "system", "content": "You write tags. " * 20}, {"role": "user", "content": "Write a tag."}]
    prefix = len(engine.tokenizer.encode(engine.render(parent, add_generation_prompt=False)))
    assert prefix > 300
    for branch in state.forks:
        assert branch.usage[0].cached_tokens >= prefix
    # the parent's prefix was computed once, not once per branch
    computed = engine.stats()["prefill_tokens_computed"] - before
    assert computed < 2 * prefix
    assert state["pick"] in state.forks["tag"]


def test_select_picks_the_best_scored_option(engine):
    @ak.function
    def pick(s):
        s += "Color: "
        s += ak.select("color", ["red", "green", "blue"])

    state = pick.run(engine=engine)
    scores = engine.score("Color: ", ["red", "green", "blue"])
    means = [sum(x) / len(x) for x in scores]
    assert state["color"] == ["red", "green", "blue"][means.index(max(means))]
    assert state.text() == "Color: " + state["color"]


def test_run_batch(engine):
    @ak.function
    def echo(s, word):
        s += f"{word}: "
        s += ak.gen("x", max_tokens=3)

    states = echo.run_batch([{"word": w} for w in ["a", "b", "c"]], engine=engine)
    assert [st.text().split(":")[0] for st in states] == ["a", "b", "c"]
    assert echo.run_batch([], engine=engine) == []


def test_errors(engine):
    with pytest.raises(ak.RequestError, match="inside ak.assistant"):
        ak.user(ak.gen("x"))
    with pytest.raises(ak.RequestError, match="temperature"):
        ak.gen("x", temperature=-1)
    with pytest.raises(ak.RequestError, match="choices"):
        ak.gen("x", choices=["a"], regex="a")

    @ak.function
    def mixed(s):
        s += "raw text "
        s += ak.user("then a message")  # fails on the state's thread; surfaces at the next read
        s += ak.gen("never", max_tokens=2)

    with pytest.raises(ak.RequestError, match="raw text"):
        mixed.run(engine=engine)

    @ak.function
    def chat_gen(s):
        s += ak.user("hi")
        s += ak.gen("x")

    with pytest.raises(ak.RequestError, match="inside ak.assistant"):
        chat_gen.run(engine=engine)

    @ak.function
    def reads(s):
        s += "x"
        s["missing"]

    with pytest.raises(KeyError, match="missing"):
        reads.run(engine=engine)


def test_an_error_in_an_unread_branch_is_raised(engine):
    @ak.function
    def branchy(s):
        s += "x"
        forks = s.fork(2)
        forks[1] += ak.user("a chat message after raw text fails")  # nobody reads this branch

    with pytest.raises(ak.RequestError, match="raw text"):
        branchy.run(engine=engine)

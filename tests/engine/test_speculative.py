"""Speculative decoding (n-gram drafts from the request's own tokens): every output is the one the
engine makes without it, token for token, greedy and sampled (the acceptance rule's coupling, see
engine/sampler.py), with grammars (drafts cut where the grammar refuses or forces text), under stop
strings, n > 1, logprobs beside it, and memory pressure;
rejected drafts leave no slot behind; and the drafts really are checked and kept. The draft sources and
the length policy alone: test_draft_sources.py."""

from __future__ import annotations

import pytest

import agentkv as ak
from agentkv.engine.speculative import grammar_takes
from tests.test_structured import TOOL_CALL

ECHO = "Repeat this line exactly: the quick brown fox jumps over the lazy dog. " * 3
CYCLE = 8
TRAP = "QRSxQRSxQRSxP"


def cycle(token: int) -> int:
    """The token the cycling model writes after `token` (cycles of CYCLE tokens)."""
    return token // CYCLE * CYCLE + (token % CYCLE + 1) % CYCLE


@pytest.fixture(autouse=True)
def _fixed_cost(fixed_draft_cost):
    """Every test here bounds draft lengths or pass counts, or needs a draft kept: see fixed_draft_cost."""


@pytest.fixture(scope="module")
def cycle_dir(tmp_path_factory):
    return cycle_model(tmp_path_factory.mktemp("cycle") / "llama")


def cycle_model(path, chat: str | None = None):
    """A tiny model that writes cycle(x) after x, greedy always, sampled mostly: its layers add nothing (o_proj and
    down_proj zero) and its output head maps each token's embedding to the next token's row. Its
    replies repeat, as echoing replies do, so drafts are found and kept (and at temperature 1 now and
    then rejected: the noise decides). `chat`: the family whose template it carries (tests/tiny.py)."""
    import torch
    from safetensors.torch import load_file, save_file

    from tests.tiny import make_tiny_model

    out = make_tiny_model(path, chat=chat, tie=False)
    w = load_file(str(out / "model.safetensors"))
    for name in w:
        if name.endswith(("o_proj.weight", "down_proj.weight")):
            w[name] = torch.zeros_like(w[name])
    emb = w["model.embed_tokens.weight"]
    head = torch.zeros_like(emb)  # (a row no token maps to stays 0)
    for x in range(emb.shape[0]):
        head[cycle(x) if cycle(x) < emb.shape[0] else x] = emb[x] * 0.25  # p(cycle) ~0.84 at temperature 1
    w["lm_head.weight"] = head
    save_file(w, str(out / "model.safetensors"))
    return out


def workload() -> list[tuple[str, ak.SamplingParams]]:
    greedy = ak.SamplingParams(temperature=0.0, ignore_eos=True)
    return [
        (ECHO, greedy.with_(max_tokens=40)),
        (ECHO + "Again:", greedy.with_(max_tokens=33, stop=["fox j", "zz"])),
        ("abcabcabcabcabc", greedy.with_(max_tokens=25)),
        # after "QRS" the model writes "T" (see cycle): drafts of "x" are rejected at their first token
        (TRAP, greedy.with_(max_tokens=30)),
        (TRAP, ak.SamplingParams(temperature=1.0, seed=4, max_tokens=30, ignore_eos=True)),
        (TRAP, ak.SamplingParams(temperature=0.7, seed=9, n=3, max_tokens=40, ignore_eos=True)),
        (ECHO, ak.SamplingParams(temperature=1.0, seed=7, max_tokens=30, ignore_eos=True)),
        (ECHO, ak.SamplingParams(temperature=0.7, top_p=0.9, seed=3, n=2, max_tokens=24, ignore_eos=True)),
        (ECHO + "With logprobs.", greedy.with_(max_tokens=12, logprobs=True, top_logprobs=2)),
        ("abcabcabc", greedy.with_(max_tokens=30, repetition_penalty=1.3)),
        ("abcabcabc", ak.SamplingParams(temperature=0.8, seed=11, max_tokens=30, frequency_penalty=0.3,
                                        presence_penalty=0.2, logprobs=True, ignore_eos=True)),
        (ECHO + "Call a tool.", ak.SamplingParams(temperature=0.0, json_schema=TOOL_CALL, max_tokens=120)),
        # grammars: the model's cycle inside the class is drafted and kept; "x" ends the class early
        ("abcabc", ak.SamplingParams(temperature=0.0, regex=r"[`a-g]{20}x[`a-g]{6}", max_tokens=60)),
        ("abcabc", ak.SamplingParams(temperature=0.8, seed=5, regex=r"([`a-g]{3}-){6}", max_tokens=60)),
        # budget closing inside kept drafts: the draft's tokens past the closing text are taken back
        ("abcabc", ak.SamplingParams(temperature=0.0, regex=r"[`a-g]{4,40}xy!", max_tokens=14)),
        ("abcabc", ak.SamplingParams(temperature=0.9, seed=6, regex=r"([`a-g]{2,30}-)+", max_tokens=17)),
        ("Free text that may stop at EOS.", ak.SamplingParams(temperature=1.0, seed=2, max_tokens=50)),
    ]


def run(engine: ak.Engine) -> list[tuple]:
    groups = [engine._make_requests(engine._encode(p), params) for p, params in workload()]
    engine._run_to_end([r for g in groups for r in g])
    outs = [engine._output(g) for g in groups]
    return [(c.token_ids, c.text, c.finish_reason, [(lp.token_id, lp.logprob) for lp in c.logprobs or []])
            for o in outs for c in o.completions]


@pytest.mark.parametrize("options", [
    {"num_slots": 4096},
    {"num_slots": 300, "max_running_requests": 8},  # evictions and retractions
    {"num_slots": 4096, "max_step_tokens": 24},  # chunked prefill beside the drafts
], ids=["roomy", "pressure", "chunked"])
def test_speculation_changes_no_output(cycle_dir, options):
    results, stats, mixed, sizes = {}, {}, [], []
    for spec in (None, "ngram"):
        with ak.Engine(str(cycle_dir), speculative=spec, **options) as engine:
            sched = engine._core.scheduler
            schedule = sched.schedule

            def watched():  # a pass that checks drafts beside a prompt's prefill (chunk or whole)
                b = schedule()
                if b is not None and b.drafts:
                    sizes.append(sum(b.extend_lens))
                    if b.num_decodes + b.num_jumps < len(b.reqs):
                        mixed.append(b)
                return b

            sched.schedule = watched
            results[spec] = run(engine) + run(engine)  # the second time with the prompts cached
            st = stats[spec] = engine.stats()
            assert st["running"] == 0 and st["waiting"] == 0
            assert st["free_slots"] + st["cached_tokens"] == st["total_slots"], "a draft leaked slots"
    for ours, ref in zip(results["ngram"], results[None], strict=True):
        assert ours[:3] == ref[:3]
        assert [t for t, _ in ours[3]] == [t for t, _ in ref[3]]
        assert [lp for _, lp in ours[3]] == pytest.approx([lp for _, lp in ref[3]], abs=1e-4)
    st = stats["ngram"]
    assert st["accepted_draft_tokens"] > 0 and st["draft_tokens"] >= st["accepted_draft_tokens"]
    # (the run's pass count is its longest request's, and under pressure the runs' retractions part
    # ways: a request's own savings are checked below)
    if options["num_slots"] > 1000:
        assert st["forward_passes"] <= stats[None]["forward_passes"]
    if options["num_slots"] < 1000:
        assert st["retractions"] > 0 or st["evicted_tokens"] > 0
    if options.get("max_step_tokens"):
        assert mixed and max(sizes) <= options["max_step_tokens"]


def test_usage_counts_drafts_and_the_passes_they_save(cycle_dir):
    with ak.Engine(str(cycle_dir), speculative="ngram") as engine:
        out = engine.generate("abcabcabcabcabcabcabc", max_tokens=40, temperature=0.0, ignore_eos=True)
    ids = out.token_ids
    assert sum(b == cycle(a) for a, b in zip(ids, ids[1:])) >= 30  # the model cycles
    u = out.usage
    assert u.completion_tokens == 40 and u.accepted_draft_tokens > 0
    assert u.draft_tokens >= u.accepted_draft_tokens
    # each pass makes one token plus the draft tokens it kept (the prompt's pass makes the first)
    assert u.forward_passes == 1 + (u.completion_tokens - 1 - u.accepted_draft_tokens)


def test_speculation_and_overlap_do_not_combine(tiny_dir):
    with pytest.raises(ak.RequestError, match="overlap_schedule"):
        ak.Engine(str(tiny_dir), speculative="ngram", overlap_schedule=True)
    with pytest.raises(ak.RequestError, match="speculative"):
        ak.Engine(str(tiny_dir), speculative="eagle")


def test_the_engine_measures_what_its_drafts_cost(cycle_dir):
    with ak.Engine(str(cycle_dir), speculative="ngram") as engine:
        engine.generate("abcabcabcabc", temperature=0.0, max_tokens=40, ignore_eos=True)
        drafter = engine._core.scheduler.drafter
    assert drafter.costs.decode and drafter.costs.extra is not None
    assert drafter.acceptance.rate("own") > 0.5


def test_a_path_in_the_radix_tree_is_drafted(tiny_dir):
    """Radix lookahead: where a request's tokens are all cached, the tree's path beyond them is its
    draft. Here an earlier request's prompt held the reply (the prompt, then the model's greedy reply
    to it); no request wrote that reply, and a random-weight model's reply repeats little of itself,
    so neither n-gram source can draft it: the reply is the same, and takes a few passes."""
    params = ak.SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    prompt = "Tell me a story about a lighthouse keeper."
    with ak.Engine(str(tiny_dir)) as engine:
        reply = engine.generate(prompt, params)
    with ak.Engine(str(tiny_dir), speculative="ngram") as engine:
        engine.generate(engine._encode(prompt) + reply.token_ids, params.with_(max_tokens=1))
        out = engine.generate(prompt, params)
        st = engine.stats()
    assert (out.token_ids, out.text) == (reply.token_ids, reply.text)
    assert out.usage.accepted_draft_tokens >= 30 and out.usage.forward_passes <= 10, out.usage
    assert st["free_slots"] + st["cached_tokens"] == st["total_slots"]


FORCED = r"[`a-g]{20}QRSTUVWXYZ[`a-g]{12}"


@pytest.mark.parametrize("stop", [None, ["STU"]], ids=["through", "stop-inside"])
def test_a_forced_run_joins_the_draft_and_is_appended_as_without_it(cycle_dir, stop):
    """The grammar's forced text inside the drafted stretch is computed in the drafts' pass (the
    letters before it, the run, the letters after it: far fewer passes than one per drafted stretch
    and one per forced run), and appended as jump-forward appends it: one run, so a stop string that
    ends inside it ends the output where it ends without speculation (after the whole run)."""
    params = ak.SamplingParams(temperature=0.0, regex=FORCED, max_tokens=80, stop=stop)
    with ak.Engine(str(cycle_dir)) as engine:
        expected = engine.generate("abcabcabcabc", params)
    with ak.Engine(str(cycle_dir), speculative="ngram") as engine:
        out = engine.generate("abcabcabcabc", params)
        st = engine.stats()
    assert (out.token_ids, out.text, out.finish_reason) == (expected.token_ids, expected.text, expected.finish_reason)
    assert out.usage.jump_forward_tokens == expected.usage.jump_forward_tokens == 10
    assert st["jump_forward_tokens_computed"] == 10  # computed in the drafts' pass: no jump pass of their own
    assert out.usage.draft_tokens == out.usage.accepted_draft_tokens > 0  # forced tokens are not counted as drafted
    assert out.usage.forward_passes <= (13 if stop is None else 9), out.usage
    assert st["free_slots"] + st["cached_tokens"] == st["total_slots"]


def test_grammar_takes_the_forced_run_and_the_proposal_past_it(tmp_path):
    """grammar_takes on a regex with forced text: a forced run joins the draft at its canonical tokens
    (marked forced), the proposal goes on past it where it has the same tokens and stops where it
    has others, at most k proposed tokens and `room` in all, and the matcher is left as it was. The
    masks of the draft's rows: the grammar's after each token, and the forced token alone where forced
    (the vocabulary's "ghi" makes the grammar allow "g" there too)."""
    import numpy as np

    from agentkv.engine.constrained import MaskWorker
    from agentkv.grammar import Matcher
    from agentkv.testing import write_tiny_model

    with ak.Engine(str(write_tiny_model(tmp_path, tokenizer={"added": ["ghi"]}))) as engine:
        def tok(text):
            return engine.tokenizer.encode(text, add_bos=False)

        r = engine._make_requests([1], ak.SamplingParams(regex=r"[a-b]{2}(cd|ce)fghij[x-z]{3}", max_tokens=20))[0]
        r.matcher = m = Matcher(r.grammar)  # (what start_grammar makes; nothing is forced at the start)
        run = tok("fghij")
        whole = tok("abcd") + run + tok("xyz")
        draft = grammar_takes(m, whole, k=10, room=30)  # "ab" forces "c", "abcd" forces "fghij"
        assert list(draft) == whole and draft.forced == frozenset([2, *range(4, 4 + len(run))])
        assert len(run) == 3 and grammar_takes(m, tok("abdd"), k=10, room=30) == tok("abc")  # "d" where "c" is forced
        assert grammar_takes(m, whole, k=3, room=30) == tok("abcd") + run  # a, b, d proposed; c and the run forced
        assert grammar_takes(m, whole, k=10, room=6) == tok("abcd")  # the run does not fit
        assert grammar_takes(m, whole, k=10, room=30, jump_forward=False) == tok("ab")
        assert m.jump_forward_bytes() == b"" and grammar_takes(m, whole, k=10, room=30) == draft

        worker = MaskWorker(engine.model_config.vocab_size)
        rows, bits = worker.start([r], [draft]).result()
        worker.close()
        assert rows == list(range(len(draft) + 1))
        for j in range(len(draft) + 1):
            if j in draft.forced:
                want = np.zeros(bits.shape[1], dtype=np.uint32)
                want[draft[j] >> 5] = 1 << (draft[j] & 31)
            else:
                m.accept_tokens(list(draft[:j]))
                mask = np.empty((1, bits.shape[1]), dtype=np.int32)
                m.fill_next_token_bitmask(mask, 0)
                m.rollback(j)
                want = mask[0].view(np.uint32)
            assert (bits[j].numpy().view(np.uint32) == want).all(), j


def test_a_reasoning_budget_closes_the_block_where_it_does_without_drafts(tmp_path):
    """The block's end is appended once the reply has written its budget of tokens: no draft
    crosses that point (the reply inside the block repeats, so drafts are there to take)."""
    messages = [{"role": "user", "content": "abcabcabcabc"}]
    options = {"temperature": 0.0, "max_tokens": 60, "max_reasoning_tokens": 26}
    model = str(cycle_model(tmp_path / "r1", chat="r1"))
    with ak.Engine(model) as engine:
        expected = engine.chat(messages, **options)
    with ak.Engine(model, speculative="ngram") as engine:
        out = engine.chat(messages, **options)
    assert out.usage.accepted_draft_tokens > 0 and "</think>" in expected.text
    assert (out.token_ids, out.text) == (expected.token_ids, expected.text)


@pytest.mark.parametrize("options", [
    {"logprobs": True, "top_logprobs": 3},
    {"frequency_penalty": 1.0},  # the repeats a draft brings count: the cycle breaks inside a draft
    {"repetition_penalty": 1.2, "presence_penalty": 0.1, "logprobs": True},
], ids=["logprobs", "frequency", "repetition"])
def test_logprobs_and_penalties_are_drafted_with_each_positions_state(cycle_dir, options):
    """A draft's row counts the draft tokens before it as output (the penalties see them) and gives
    each token made its logprob entry: the same tokens and entries as without speculation, and the
    drafts were checked and some kept. Asked twice: the second time the radix tree drafts the reply
    in drafts of 24 tokens and more, so a draft holds a token of the cycle twice (an n-gram's draft of
    a cycle does not) and the row where the penalty breaks the cycle counts the draft's own repeats."""
    params = ak.SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True, **options)
    with ak.Engine(str(cycle_dir)) as engine:
        expected = engine.generate("abcabcabcabc", params)
    with ak.Engine(str(cycle_dir), speculative="ngram", speculative_tokens=48) as engine:
        first = engine.generate("abcabcabcabc", params)
        out = engine.generate("abcabcabcabc", params)
    assert (first.token_ids, first.text) == (out.token_ids, out.text) == (expected.token_ids, expected.text)
    assert out.usage.accepted_draft_tokens > 0
    if "frequency_penalty" in options:
        assert first.usage.draft_tokens > first.usage.accepted_draft_tokens and out.text[-8:] != expected.text[:8]
    if params.logprobs:
        assert [e.token_id for e in out.logprobs] == out.token_ids
        for ours, ref in zip(out.logprobs, expected.logprobs, strict=True):
            assert ours.logprob == pytest.approx(ref.logprob, abs=1e-4)
            assert [t for t, _, _ in ours.top] == [t for t, _, _ in ref.top]


def test_the_server_reports_kept_and_rejected_drafts_as_openai_does(cycle_dir):
    """usage.completion_tokens_details: OpenAI's accepted / rejected prediction tokens."""
    openai = pytest.importorskip("openai")
    from agentkv.server import create_app
    from tests.server.test_server import KEY, serving

    with ak.Engine(str(cycle_dir), speculative="ngram") as engine, serving(create_app(engine, "tiny", KEY)) as base:
        client = openai.OpenAI(base_url=base, api_key=KEY)
        out = client.completions.create(model="tiny", prompt=TRAP, max_tokens=30, temperature=0)
        details = out.usage.completion_tokens_details
        assert details.accepted_prediction_tokens > 0 and details.rejected_prediction_tokens > 0
        assert out.usage.completion_tokens == 30


def test_an_end_inside_a_kept_draft_gives_its_tail_back(cycle_dir):
    """A stop string that the model completes inside a draft it keeps (its first occurrence ends at
    the 24th token, well into the drafted stretch): the output ends there as without speculation, and
    the K/V computed for the draft tokens after it returns to the pool."""
    params = ak.SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    with ak.Engine(str(cycle_dir)) as engine:
        text = engine.generate("abcabcabcabc", params).text
        expected = engine.generate("abcabcabcabc", params.with_(stop=[text[4:24]]))
    with ak.Engine(str(cycle_dir), speculative="ngram") as engine:
        out = engine.generate("abcabcabcabc", params.with_(stop=[text[4:24]]))
        st = engine.stats()
    assert len(expected.token_ids) == 24 and expected.finish_reason == "stop"
    assert (out.token_ids, out.text) == (expected.token_ids, expected.text) and out.usage.accepted_draft_tokens > 0
    assert st["free_slots"] + st["cached_tokens"] == st["total_slots"]

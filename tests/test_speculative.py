"""Speculative decoding (n-gram drafts from the request's own tokens): every output is the one the
engine makes without it, token for token, greedy and sampled (the acceptance rule's coupling, see
engine/sampler.py), with grammars (drafts cut where the grammar refuses or forces text), under stop
strings, n > 1, logprobs beside it, and memory pressure;
rejected drafts leave no slot behind; and the drafts really are checked and kept."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import agentkv as ak
from agentkv.engine.speculative import MAX_NGRAM, MIN_NGRAM, NgramIndex, Speculation
from tests.test_structured import TOOL_CALL

ECHO = "Repeat this line exactly: the quick brown fox jumps over the lazy dog. " * 3
CYCLE = 8
TRAP = "QRSxQRSxQRSxP"


def cycle(token: int) -> int:
    """The token the cycling model writes after `token` (cycles of CYCLE tokens)."""
    return token // CYCLE * CYCLE + (token % CYCLE + 1) % CYCLE


@pytest.fixture(scope="module")
def cycle_dir(tmp_path_factory):
    """A tiny model that writes cycle(x) after x, greedy always, sampled mostly: its layers add nothing (o_proj and
    down_proj zero) and its output head maps each token's embedding to the next token's row. Its
    replies repeat, as echoing replies do, so drafts are found and kept (and at temperature 1 now and
    then rejected: the noise decides)."""
    import torch
    from safetensors.torch import load_file, save_file

    from tests.tiny import make_tiny_model

    out = make_tiny_model(tmp_path_factory.mktemp("cycle") / "llama", tie=False)
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
        (ECHO + "Call a tool.", ak.SamplingParams(temperature=0.0, json_schema=TOOL_CALL, max_tokens=120)),
        # grammars: the model's cycle inside the class is drafted and kept; "x" ends the class early
        ("abcabc", ak.SamplingParams(temperature=0.0, regex=r"[`a-g]{20}x[`a-g]{6}", max_tokens=60)),
        ("abcabc", ak.SamplingParams(temperature=0.8, seed=5, regex=r"([`a-g]{3}-){6}", max_tokens=60)),
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
    results, stats = {}, {}
    for spec in (None, "ngram"):
        with ak.Engine(str(cycle_dir), speculative=spec, **options) as engine:
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


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 3), min_size=0, max_size=40), st.integers(0, 6))
def test_drafts_are_what_followed_the_longest_earlier_match(ids, k):
    """NgramIndex against a brute force: the longest suffix (MIN_NGRAM..MAX_NGRAM tokens) that
    occurred earlier, its latest earlier occurrence, the k tokens after it; the index built over
    successive calls."""
    index = NgramIndex()
    for cut in range(0, len(ids) + 1, 7):  # as a request's tokens grow
        index.propose(ids[:cut], k)
    expected = []
    for n in range(min(MAX_NGRAM, len(ids)), MIN_NGRAM - 1, -1):
        suffix = ids[len(ids) - n :]
        ends = [e for e in range(n, len(ids)) if ids[e - n : e] == suffix]
        if ends:
            expected = ids[max(ends) : max(ends) + k] if k else []
            break
    assert index.propose(ids, k) == expected


def test_a_request_that_keeps_missing_stops_drafting_for_a_while():
    s = Speculation(6)
    ids = [1, 2, 3, 1, 2, 3]
    for _ in range(3):
        d = s.draft(ids, 10)
        assert d
        s.verified(len(d), 0)
    assert s.draft(ids, 10) == []  # cooling down
    s = Speculation(6)
    d = s.draft(ids, 10)
    s.verified(len(d), len(d))
    assert s.k == 5  # kept whole: the next draft may be longer


def test_the_server_reports_kept_and_rejected_drafts_as_openai_does(cycle_dir):
    """usage.completion_tokens_details: OpenAI's accepted / rejected prediction tokens."""
    openai = pytest.importorskip("openai")
    from agentkv.server import create_app
    from tests.test_server import KEY, serving

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

"""SchemaStore: real schemas, their valid and invalid instances, the embedded model's tokenizer.

For every schema that compiles: each valid instance, in the compact text the grammar writes, is
accepted token by token (as the tokenizer encodes it) and may end there, and passes the check after
generation where the grammar relaxed a keyword; each invalid instance is refused by the grammar or
that check. The share that compiles is printed, and `tests/data/schemastore_compiled.txt` ratchets it.
A `$ref` to another SchemaStore schema resolves through `documents=` (every schema by its `$id`).
On a sample, every token of the walk must also be set in the matcher's mask, and jump-forward
tokens must equal the tokenizer's own encoding of the same text.
"""

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from agentkv.grammar import GrammarCompiler, GrammarError, Matcher
from agentkv.grammar.schema.refs import documents_by_id
from agentkv.grammar.schema.validation import SchemaCheck
from agentkv.grammar.schema.walk import SearchBudgetExceeded, find_serialization
from tests.conftest import shared_data
from tests.grammar_helpers import check_ratchet

RATCHET = Path(__file__).parents[1] / "data" / "schemastore_compiled.txt"
# Instances the data calls valid only because its validator treats `format` as an annotation; the
# grammar asserts formats (docs/grammar.md), as a generator should.
FORMAT_ASSERTED = {
    "webjob-publish-settings[2]": "endTime 2018-12-14T10:00:00 is not an RFC 3339 date-time (no UTC offset)",
}
# Instances the data calls valid that jsonschema, the reference the check after generation uses,
# refuses: each binding matches both a typed binding and `dynamicBinding` of a `oneOf` (the grammar
# relaxes that overlapping oneOf; the check holds it to "exactly one").
JSONSCHEMA_REFUSES = {"function"}
MASK_SAMPLE_TOKENS = 24


def schemastore_documents(root: Path) -> dict:
    """Every SchemaStore schema by its `$id` (draft-04: `id`), for references between them."""
    return documents_by_id(json.loads(p.read_text())["schema"] for p in sorted(root.glob("*.json")))


def test_schemastore_instances_token_by_token(smollm_info, smollm_compiler):
    root = shared_data("schemastore")
    compiler = smollm_compiler
    encode = smollm_info.encode_bytes
    compiled, total, undetermined = set(), 0, 0
    bad_accepted, good_rejected, unmasked = [], [], []
    bitmask = np.zeros((1, smollm_info.words), dtype=np.int32)
    documents = schemastore_documents(root)
    for path in sorted(root.glob("*.json")):
        total += 1
        doc = json.loads(path.read_text())
        try:
            g = compiler.compile_json_schema(doc["schema"], documents=documents)
        except GrammarError:
            continue
        compiled.add(path.stem)
        check = SchemaCheck(doc["schema"], documents) if g.needs_validation else None
        for k, case in enumerate(doc["tests"]):
            try:
                text = find_serialization(g, case["data"], budget=300_000)
            except SearchBudgetExceeded:
                undetermined += 1
                continue
            problem = None if check is None else check.error(case["data"])
            if not case["valid"]:
                if text is not None and problem is None:
                    bad_accepted.append(f"{path.stem}[{k}]")
                continue
            if problem is not None:
                if path.stem not in JSONSCHEMA_REFUSES:
                    good_rejected.append(f"{path.stem}[{k}]: {problem}")
                continue
            if text is None:
                if f"{path.stem}[{k}]" not in FORMAT_ASSERTED:
                    good_rejected.append(f"{path.stem}[{k}]")
                continue
            m = Matcher(g)
            for i, tok in enumerate(encode(text.encode())):
                if i < MASK_SAMPLE_TOKENS and k == 0:
                    m.fill_next_token_bitmask(bitmask)
                    if not (bitmask[0, tok >> 5] >> (tok & 31)) & 1:
                        unmasked.append(f"{path.stem}[{k}] token {i}")
                if not m.accept_token(tok):
                    good_rejected.append(f"{path.stem}[{k}] at token {i}")
                    break
            else:
                if not m.can_terminate():
                    good_rejected.append(f"{path.stem}[{k}] (cannot end)")
    assert not bad_accepted, f"invalid instances accepted: {bad_accepted}"
    assert not good_rejected, f"valid instances refused: {good_rejected}"
    assert not unmasked, f"tokens of valid instances missing from the mask: {unmasked[:10]}"
    check_ratchet(RATCHET, compiled, "schemas that compiled")
    print(f"\nSchemaStore: {len(compiled)}/{total} schemas compile ({100 * len(compiled) / total:.1f}%); "
          f"{undetermined} instances undetermined within the key-order search budget")


@pytest.mark.parametrize("vocab", ["smollm", "qwen"])
def test_jump_forward_tokens_are_canonical(vocab, request):
    """Walk canonical encodings; wherever text is forced, the jump tokens are the next canonical tokens
    (49k: the embedded model's tokenizer; 151k: Qwen's, whose pre-tokenizer cuts let more through)."""
    root = shared_data("schemastore")
    if vocab == "smollm":
        info, compiler = request.getfixturevalue("smollm_info"), request.getfixturevalue("smollm_compiler")
    else:
        info = request.getfixturevalue("qwen_info")
        compiler = GrammarCompiler(info, timeout_s=120)
    encode = info.encode_bytes
    forced = noncanonical = steps = 0
    for path in sorted(root.glob("*.json"))[::6]:
        doc = json.loads(path.read_text())
        try:
            g = compiler.compile_json_schema(doc["schema"])
        except GrammarError:
            continue
        case = next((c for c in doc["tests"] if c["valid"]), None)
        try:
            text = case and find_serialization(g, case["data"], budget=100_000)
        except SearchBudgetExceeded:
            continue
        if not text:
            continue
        toks = encode(text.encode())
        m = Matcher(g)
        i = 0
        while i < min(len(toks), 200):
            jump = m.jump_forward_tokens()
            if jump:
                assert encode(info.decode(jump)) == jump
                assert info.decode(jump) == m.jump_forward_bytes()[:len(info.decode(jump))]
                if jump != toks[i:i + len(jump)]:
                    noncanonical += len(jump)
                    break
                forced += len(jump)
                assert m.accept_tokens(jump)
                i += len(jump)
                continue
            assert m.accept_token(toks[i])
            steps += 1
            i += 1
    print(f"\njump-forward on SchemaStore samples: {forced} forced of {forced + steps} tokens "
          f"({100 * forced / max(1, forced + steps):.1f}%), {noncanonical} non-canonical")
    assert noncanonical == 0


@pytest.mark.parametrize("vocab", ["smollm", "qwen"])
def test_both_walks_give_the_same_masks_along_schemastore_instances(vocab, request, monkeypatch):
    # Every mask along the first valid instance of every 12th schema (its first 32 tokens), by the
    # native walk and by the Python one: the same bits (compared as one hash per schema).
    from agentkv.grammar import native

    if native.load() is None:
        pytest.skip(f"no native token walk: {native.unavailable_reason()}")
    root = shared_data("schemastore")
    info = request.getfixturevalue(f"{vocab}_info")
    compiler = GrammarCompiler(info, timeout_s=120)
    documents = schemastore_documents(root)
    native_load, compared = native.load, 0
    for path in sorted(root.glob("*.json"))[::12]:
        doc = json.loads(path.read_text())
        monkeypatch.setattr(native, "load", native_load)  # (the grammar gets its native cache)
        try:
            g = compiler.compile_json_schema(doc["schema"], documents=documents)
        except GrammarError:
            continue
        case = next((c for c in doc["tests"] if c["valid"]), None)
        try:
            text = case and find_serialization(g, case["data"], budget=300_000)
        except SearchBudgetExceeded:
            continue
        if not text:
            continue
        cids, cid = [], g.initial
        for tok in info.encode_bytes(text.encode())[:32]:
            cids.append(cid)
            cid = g.advance(cid, info.vocab[tok])
        digests = []
        for path_name in ("native", "python"):
            monkeypatch.setattr(native, "load", native_load if path_name == "native" else lambda: None)
            h = hashlib.sha256()
            for c in cids:
                words = np.zeros(info.words, dtype="<i4")
                if path_name == "native":
                    g.walk_tables.mask_into(g.stacks(c), words)
                else:
                    g._mask_in_python(g.stacks(c), words)
                h.update(words.tobytes())
            digests.append(h.hexdigest())
        assert digests[0] == digests[1], path.stem
        compared += 1
    assert compared >= 20

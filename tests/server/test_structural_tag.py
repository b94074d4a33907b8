"""`response_format: {"type": "structural_tag"}` (chat/structural.py) through the server: free text,
except that a trigger starts a tag whose JSON matches its schema exactly, then free text again."""

from __future__ import annotations

import json

import jsonschema
import pytest

openai = pytest.importorskip("openai")

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["n"],
          "additionalProperties": False}
TAG = {"type": "structural_tag", "triggers": ["<t"],
       "structures": [{"begin": "<tag>", "schema": SCHEMA, "end": "</tag>"}]}


def tags_in(text: str, cut: bool) -> int:
    """How many tags `text` holds, each checked: a trigger always starts a whole tag."""
    found, at = 0, 0
    while (at := text.find("<t", at)) >= 0:
        assert text.startswith("<tag>", at), text
        try:
            value, at = json.JSONDecoder().raw_decode(text, at + len("<tag>"))
        except json.JSONDecodeError:
            assert cut, text  # only max_tokens ends a reply inside a tag
            return found
        jsonschema.validate(value, SCHEMA)
        assert text.startswith("</tag>", at) or cut and "</tag>".startswith(text[at:]), text
        found += 1
    return found


@pytest.mark.parametrize("stream", [False, True])
def test_tags_match_their_schema_and_text_stays_free(client, live, stream):
    lt = live[1].tokenizer.encode("<", add_bos=False)[0]  # a random model writes "<" often, and so "<t"
    tags, outside = 0, ""
    for seed in range(6):
        body = dict(model="tiny", messages=[{"role": "user", "content": "x"}], max_tokens=160, temperature=1.0,
                    seed=seed, response_format=TAG, logit_bias={str(lt): 6})
        if stream:
            chunks = list(client.chat.completions.create(**body, stream=True))
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            cut = [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
        else:
            r = client.chat.completions.create(**body)
            text, cut = r.choices[0].message.content, r.choices[0].finish_reason == "length"
        tags += tags_in(text, cut)
        outside += text.split("<t")[0]
    assert tags > 0 and outside.strip()


def test_bad_structural_tags_are_400s(client):
    for bad, what in [({**TAG, "triggers": []}, "triggers"),
                      ({**TAG, "structures": [{"begin": "<x>", "schema": SCHEMA, "end": "</x>"}]}, "begin"),
                      ({**TAG, "structures": [{"begin": "<tag>", "end": "</tag>"}]}, "structures[0]")]:
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], max_tokens=4,
                                           response_format=bad)
        assert what in e.value.body["message"]

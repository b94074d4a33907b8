"""JSON styles: the separators a JSON grammar writes, and the model's choice between them.

A grammar writes one canonical form of each value, so that the text it forces can be appended
without a forward pass (jump-forward). Which form matters to a model: a model trained on
`json.dumps`'s `{"a": 1, "b": 2}` (most chat templates' `tojson`) can write worse values when held
to `{"a":1,"b":2}`, and another model the other way round. So a grammar writes one of two styles:

- "compact": `{"a":1,"b":[1,2]}` (`,` and `:`);
- "spaced": `{"a": 1, "b": [1, 2]}` (`, ` and `: `, as `json.dumps` and Jinja's `tojson` write it);

or lets the model choose ("model"): both styles' rules side by side under one root, so the matcher
carries both until the first separator, where the model's token picks one, and that style holds for
the rest of the value. Each style is still canonical, so jump-forward stays exact after the choice;
before it, the text both styles force is forced.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agentkv.errors import GrammarError
from agentkv.grammar.automata.expr import Ref, alt

JSON_STYLES = ("compact", "spaced", "model")
SEPARATORS = {"compact": (",", ":"), "spaced": (", ", ": ")}  # (between items, after a key)


def check_json_style(style) -> str:
    if style not in JSON_STYLES:
        raise GrammarError(f"json_style={style!r} is not a JSON style; choose one of {list(JSON_STYLES)} "
                           "('model': the model picks compact or spaced at the first separator)")
    return style


def styled_rules(converter: Callable[[str, str], Any], style: str, prefix: str) -> tuple[dict, dict]:
    """A schema's rules in `style`, its root `prefix + "root"`, and the keywords they relaxed.
    `converter(style, prefix)` is a JsonSchemaConverter of the schema in one fixed style under a rule
    prefix. Under "model" both styles are converted, each under its own prefix; a value that writes
    no separator (a string, a number) keeps one copy."""
    check_json_style(style)
    first = converter("compact" if style == "model" else style, prefix + "c/" if style == "model" else prefix)
    rules = first.convert()
    if style != "model":
        return rules, first.relaxed
    if not first.separated:
        rules[prefix + "root"] = Ref(prefix + "c/root")
        return rules, first.relaxed
    spaced = converter("spaced", prefix + "s/")
    rules.update(spaced.convert())
    rules[prefix + "root"] = alt(Ref(prefix + "c/root"), Ref(prefix + "s/root"))
    return rules, {**first.relaxed, **spaced.relaxed}

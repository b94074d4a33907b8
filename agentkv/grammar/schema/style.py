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

from agentkv.errors import GrammarError
from agentkv.grammar.automata.expr import Ref, alt

JSON_STYLES = ("compact", "spaced", "model")
SEPARATORS = {"compact": (",", ":"), "spaced": (", ", ": ")}  # (between items, after a key)


def check_json_style(style) -> str:
    if style not in JSON_STYLES:
        raise GrammarError(f"json_style={style!r} is not a JSON style; choose one of {list(JSON_STYLES)} "
                           "('model': the model picks compact or spaced at the first separator)")
    return style


def styled_rules(convert: Callable[[str, str], tuple[dict, dict, bool]], style: str, prefix: str) -> tuple[dict, dict]:
    """A schema's rules in `style`, its root `prefix + "root"`. `convert(style, prefix)` converts it in
    one fixed style under a rule prefix and returns (rules, relaxed, whether any separator was
    written). Under "model" both styles are converted, each under its own prefix; a value that
    writes no separator (a string, a number) keeps one copy."""
    check_json_style(style)
    if style != "model":
        rules, relaxed, _ = convert(style, prefix)
        return rules, relaxed
    rules, relaxed, separated = convert("compact", prefix + "c/")
    if not separated:
        rules[prefix + "root"] = Ref(prefix + "c/root")
        return rules, relaxed
    spaced, more, _ = convert("spaced", prefix + "s/")
    rules.update(spaced)
    rules[prefix + "root"] = alt(Ref(prefix + "c/root"), Ref(prefix + "s/root"))
    return rules, {**relaxed, **more}

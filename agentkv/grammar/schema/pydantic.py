"""A Pydantic model's JSON schema with the constraints its validators check but its plain schema omits.

Pydantic's own `model_json_schema()` describes what a field's JSON looks like, not everything its
validation refuses: a `Decimal` with `max_digits` / `decimal_places` becomes a bare number or
string, `HttpUrl` a `uri` of any scheme, `datetime` a date-time that may be a leap second (which
Python's datetime refuses, as it refuses year 0), `timedelta` a duration of any size (Pydantic refuses a component past
what a timedelta holds). A grammar built from that schema would let a model write values the
model's validation then refuses. `model_schema` writes those constraints into the schema in
standard keywords (bounds, `multipleOf`, `pattern`), so the grammar enforces them and the schema
shown to a model says them.
"""

from __future__ import annotations

from decimal import Decimal

from agentkv.errors import GrammarError

# Python's date, datetime and time refuse year 0 and a leap second (:60, the only seconds field of 60).
NO_YEAR_ZERO = "^(?!0000)"
NO_LEAP_SECOND = "^(?!.*:60)"
NEITHER = "^(?!0000|.*:60)"
# Schemes whose URLs always have a host (WHATWG's special schemes but file).
HOST_SCHEMES = {"http", "https", "ws", "wss", "ftp"}
# A duration's numbers of at most 6 digits: Pydantic refuses a component of 9 (P489916829M), and
# 999,999 of each unit together still fit a timedelta (about 403 million days of 999 million).
SHORT_DURATION = "^(?!.*[0-9]{7})"
# email-validator wants a dot in the domain (a@b is not an address it accepts).
EMAIL_DOMAIN = r"@[^@.]+(\.[^@.]+)+$"


def model_schema(model: type) -> dict:
    """`model.model_json_schema()` through a generator that adds the constraints above."""
    return model.model_json_schema(schema_generator=constrained_generator())


def type_schema(tp) -> dict:
    """The JSON schema of any type Pydantic validates (`list[int]`, `int`, `A | B`, a TypedDict, a
    dataclass, `Literal[...]`), through the same generator; GrammarError for one it cannot describe."""
    from pydantic import TypeAdapter

    try:
        return TypeAdapter(tp).json_schema(schema_generator=constrained_generator())
    except Exception as e:  # PydanticSchemaGenerationError, PydanticInvalidForJsonSchema, a bad annotation
        raise GrammarError(f"{tp!r} has no JSON schema: {e}; give a Pydantic model, a type Pydantic "
                           "validates (list[int], A | B, a TypedDict, ...) or a JSON schema dict") from None


def is_python_type(schema) -> bool:
    """A schema given as a Python type rather than a JSON schema (a dict, JSON text or a boolean)."""
    return not isinstance(schema, (dict, str, bool)) and schema is not None


_GENERATOR = None


def constrained_generator():
    """The `GenerateJsonSchema` subclass that adds them (made on first use: pydantic is imported then)."""
    global _GENERATOR
    if _GENERATOR is None:
        from pydantic.json_schema import GenerateJsonSchema

        class ConstrainedJsonSchema(GenerateJsonSchema):
            def decimal_schema(self, schema):
                out = super().decimal_schema(schema)
                digits, places = schema.get("max_digits"), schema.get("decimal_places")
                if "anyOf" not in out:
                    return out
                number, text = out["anyOf"]
                if digits is None and places is None:  # any decimal, but as text one Decimal() reads
                    return {"anyOf": [number, _decimal_text(text, None, None)]}
                return {"anyOf": [_decimal_number(number, digits, places), _decimal_text(text, digits, places)]}

            def url_schema(self, schema):
                out = super().url_schema(schema)
                schemes = schema.get("allowed_schemes")
                if schemes:  # HttpUrl: http or https, and (as URLs of those schemes need) a host
                    names = "|".join(sorted(schemes))
                    host = schema.get("host_required") or set(schemes) <= HOST_SCHEMES
                    out["pattern"] = f"^({names}):" + ("//[^/?#@:]" if host else "")
                return out

            def datetime_schema(self, schema):
                return _with_pattern(super().datetime_schema(schema), "date-time", NEITHER)

            def date_schema(self, schema):
                return _with_pattern(super().date_schema(schema), "date", NO_YEAR_ZERO)

            def time_schema(self, schema):
                return _with_pattern(super().time_schema(schema), "time", NO_LEAP_SECOND)

            def timedelta_schema(self, schema):
                out = super().timedelta_schema(schema)
                if out.get("format") == "duration" and "pattern" not in out:
                    out = {**out, "pattern": SHORT_DURATION}
                return out

            def generate(self, schema, mode="validation"):
                out = super().generate(schema, mode)
                _email_domains(out)
                return out

        _GENERATOR = ConstrainedJsonSchema
    return _GENERATOR


def _decimal_number(number: dict, digits: int | None, places: int | None) -> dict:
    """The number form of a Decimal with max_digits / decimal_places: whole digits below 10^(digits -
    places), a step of 10^-places; with max_digits alone, one such case per split of the digits."""
    if digits is None:
        return {**number, "multipleOf": _step(places)}
    if places is not None:
        return {**number, **_digits_case(number, digits - places, places)}
    return {"anyOf": [{**number, **_digits_case(number, whole, digits - whole)} for whole in range(digits + 1)]}


def _digits_case(number: dict, whole: int, places: int) -> dict:
    limit = 10 ** whole
    out: dict = {"multipleOf": _step(places)}
    lo = number.get("minimum", number.get("exclusiveMinimum"))
    hi = number.get("maximum", number.get("exclusiveMaximum"))
    if lo is None or lo <= -limit:
        out["exclusiveMinimum"] = -limit
    if hi is None or hi >= limit:
        out["exclusiveMaximum"] = limit
    return out


def _step(places: int | None):
    if not places:
        return 1
    return float(Decimal(1).scaleb(-places))


def _decimal_text(text: dict, digits: int | None, places: int | None) -> dict:
    """The string form: an optional sign, at most the whole digits, at most `places` fraction digits
    (a subset of what Decimal() reads, and what it writes for such a value)."""
    if "pattern" in text:
        return text
    if digits is None and places is None:
        body = r"(0|[1-9][0-9]*)(\.[0-9]+)?"
    elif digits is None:
        body = r"(0|[1-9][0-9]*)" + ("" if places == 0 else rf"(\.[0-9]{{1,{places}}})?")
    elif places is not None:
        most = digits - places
        whole = "0" if most <= 0 else rf"(0|[1-9][0-9]{{0,{most - 1}}})"
        body = whole + ("" if places == 0 else rf"(\.[0-9]{{1,{places}}})?")
    else:  # max_digits alone: each split of the digits between the whole part and the fraction
        splits = [rf"0(\.[0-9]{{1,{digits}}})?"] + [
            rf"[1-9][0-9]{{{w - 1}}}" + (rf"(\.[0-9]{{1,{digits - w}}})?" if digits > w else "")
            for w in range(1, digits + 1)]
        body = "(" + "|".join(splits) + ")"
    return {**text, "pattern": f"^-?{body}$"}


def _with_pattern(out: dict, fmt: str, pattern: str) -> dict:
    if out.get("type") == "string" and out.get("format") == fmt and "pattern" not in out:
        return {**out, "pattern": pattern}
    return out


def _email_domains(node) -> None:
    """Every `format: email` string also needs a dotted domain (as email-validator does)."""
    if isinstance(node, dict):
        if node.get("format") == "email" and node.get("type") == "string" and "pattern" not in node:
            node["pattern"] = EMAIL_DOMAIN
        for v in node.values():
            _email_domains(v)
    elif isinstance(node, list):
        for v in node:
            _email_domains(v)

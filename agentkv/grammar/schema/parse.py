"""The one way finished text becomes the caller's value: JSON text -> a Pydantic instance (the
model's own validation is the check), a value of another Python type (`list[int]`, `A | B`, a
TypedDict: Pydantic's validation of that type), or a dict checked against the whole JSON schema
(what the grammar relaxed included; validation.py).

The engine's outputs (`ak.generate`, `Completion.parsed`), a chat turn's answer and an agent's
final output all read text through `value_parser`, so a value that fails reads the same
everywhere: `OutputValidationError` naming each field and what is wrong with it (a message the
model can act on when an agent asks it again), or `IncompleteOutputError` where the text is not
whole JSON (cut by max_tokens or a stop string).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from agentkv.errors import IncompleteOutputError, OutputValidationError
from agentkv.grammar.schema.pydantic import is_python_type
from agentkv.grammar.schema.validation import schema_check


def value_parser(schema: Any) -> Callable[[str], Any]:
    """text -> the value `schema` (a Pydantic model, a Python type, or a JSON schema as a dict or
    its JSON text) describes; raises OutputValidationError / IncompleteOutputError."""
    if hasattr(schema, "model_validate_json") or is_python_type(schema):
        from pydantic import TypeAdapter, ValidationError  # a dependency; loaded once per parser, not per import

        adapter = TypeAdapter(schema)
        name = getattr(schema, "__name__", repr(schema))

        def parse_typed(text: str) -> Any:
            whole_json(text)
            try:
                return adapter.validate_json(text)
            except ValidationError as e:
                raise OutputValidationError(f"the output does not validate as {name}: {pydantic_problems(e)}",
                                            text, "stop") from None
            except ValueError as e:  # a validator that raised something else
                raise OutputValidationError(f"the output does not validate as {name}: {e}", text, "stop") from e

        return parse_typed
    check = schema_check(json.loads(schema) if isinstance(schema, str) else schema)

    def parse_json(text: str) -> Any:
        value = whole_json(text)
        failure = check.failure(value)
        if failure is not None:
            raise OutputValidationError(f"the output does not validate against the schema: {failure.message}", text,
                                        "stop", failure.keyword, failure.pointer)
        return value

    return parse_json


def whole_json(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise IncompleteOutputError(f"the output is not complete JSON ({e}); remove stop strings that can occur "
                                    "inside it, or raise max_tokens", text, None) from e


def pydantic_problems(error: Any) -> str:
    """A Pydantic ValidationError as `field.path: message; ...`."""
    return "; ".join(f"{'.'.join(map(str, err['loc'])) or '(output)'}: {err['msg']}" for err in error.errors())

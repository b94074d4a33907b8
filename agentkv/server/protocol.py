"""OpenAI request bodies -> what the engine takes: template messages, tool specs, SamplingParams.

Every field a client sends is used or refused with a 400 naming it; fields this server does not know
(newer clients add some) are accepted and ignored, as OpenAI's own API does with optional fields.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from agentkv.chat import messages
from agentkv.chat.calls import FunctionSpec, ToolCall, tool_name_problem
from agentkv.chat.structural import StructuralTag
from agentkv.errors import CacheError, EngineClosedError, OutputValidationError, RequestError, UnknownAdapterError
from agentkv.grammar.compiler import closed_schema
from agentkv.grammar.schema.numbers import NUMBER_DIGITS
from agentkv.grammar.schema.validation import metaschema_error

# Limits on what one request may carry; past them, a 400 (413 for the body) naming the limit.
MAX_BODY_BYTES = 16 << 20
MAX_STOP, MAX_STOP_CHARS = 16, 512  # stop strings: how many, how long each
MAX_GRAMMAR_CHARS = 64 << 10  # regex, ebnf / grammar
MAX_SCHEMA_BYTES, MAX_SCHEMA_DEPTH = 1 << 20, 64  # a response_format schema or a tool's parameters


class APIError(Exception):
    """An error answered in OpenAI's shape: {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status: int, message: str, param: str | None = None, type: str = "invalid_request_error",
                 code: str | None = None, extra: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.type, self.code = status, message, param, type, code
        self.extra = extra or {}  # more fields of the error object (an invalid output's text and keyword)

    def __reduce__(self):  # raised in Ray replicas and re-raised in the ingress
        return type(self), (self.status, self.message, self.param, self.type, self.code, self.extra)

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code,
                          **self.extra}}


class _Request(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    n: int = 1
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool = False
    stream_options: dict | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None  # OpenAI's: token ids (as strings) -> bias in [-100, 100]
    # extras, as SGLang and vLLM take them
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    ignore_eos: bool = False
    regex: str | None = None
    ebnf: str | None = None
    grammar: str | None = None  # a Lark grammar (llguidance dialect)
    # extensions for structured outputs (docs/structured.md): false cuts a structured output where max_tokens
    # falls instead of closing it; a JSON number's digit bound where its schema leaves it unbounded (null:
    # unbounded, as `strict: true` is)
    budget_closing: bool = True
    number_digits: int | None = NUMBER_DIGITS
    # JSON's separators: "compact", "spaced" or "model" (the model's choice at the first one); null: the
    # chat template's style for calls where it writes them, else the model's choice
    json_style: Literal["compact", "spaced", "model"] | None = None

    def check_limits(self) -> None:
        """400s for stop strings and grammars past the server's limits."""
        stops = [self.stop] if isinstance(self.stop, str) else self.stop or []
        if len(stops) > MAX_STOP or any(len(s) > MAX_STOP_CHARS for s in stops):
            raise APIError(400, f"stop takes at most {MAX_STOP} strings of at most {MAX_STOP_CHARS} characters each",
                           "stop")
        for name in ("regex", "ebnf", "grammar"):
            if len(getattr(self, name) or "") > MAX_GRAMMAR_CHARS:
                raise APIError(400, f"{name} is longer than the {MAX_GRAMMAR_CHARS} characters this server compiles",
                               name)

    def sampling(self, default_max_tokens: int | None) -> dict[str, Any]:
        out: dict[str, Any] = {
            "max_tokens": self.max_tokens if self.max_tokens is not None else default_max_tokens,
            "temperature": 1.0 if self.temperature is None else self.temperature,
            "n": self.n, "stop": self.stop or (), "seed": self.seed, "ignore_eos": self.ignore_eos,
            "presence_penalty": self.presence_penalty, "frequency_penalty": self.frequency_penalty,
            "budget_closing": self.budget_closing, "number_digits": self.number_digits,
            "json_style": self.json_style,
            # a LoRA adapter's name picks it (vLLM's convention); the server's own model name is the base
            # (the engine's adapters know it: LocalHandle registers it)
            "adapter": self.model or None,
        }
        if self.logit_bias:
            try:
                out["logit_bias"] = {int(t): b for t, b in self.logit_bias.items()}
            except ValueError:
                raise APIError(400, "logit_bias maps token ids (integers, as strings) to biases in [-100, 100]",
                               "logit_bias") from None
        for name in ("top_p", "top_k", "min_p", "repetition_penalty"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        given = [k for k in ("regex", "ebnf", "grammar") if getattr(self, k) is not None]
        if len(given) > 1:
            raise APIError(400, f"give one of regex, ebnf and grammar, not {given}", given[1])
        if self.regex is not None:
            out["regex"] = self.regex
        elif given:
            out["grammar"] = getattr(self, given[0])
        return out

    @property
    def include_usage(self) -> bool:
        return bool((self.stream_options or {}).get("include_usage"))


class ChatRequest(_Request):
    messages: list[dict[str, Any]] = Field(min_length=1)
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool = True
    response_format: dict[str, Any] | None = None
    # extensions, as vLLM and SGLang take them: variables for the chat template (Qwen3's
    # enable_thinking), and a budget after which a reasoning block is closed
    chat_template_kwargs: dict[str, Any] | None = None
    max_reasoning_tokens: int | None = None
    # OpenAI's: a session whose conversation stays pinned between its turns (server/sessions.py)
    prompt_cache_key: str | None = None
    # extension: False lets a schema's objects take undeclared keys where it does not say (the server's
    # default, `agentkv serve --open-objects`, fills it in)
    close_objects: bool = True


class CompletionRequest(_Request):
    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: int | None = None
    echo: bool = False
    suffix: str | None = None


# ---- chat --------------------------------------------------------------------------------------------


def chat_tools(req: ChatRequest) -> tuple[list[FunctionSpec], list[dict], str]:
    """(the offered tools, their definitions, the step mode) of a chat request."""
    specs, defs = [], []
    for i, t in enumerate(req.tools or []):
        fn = t.get("function") if isinstance(t, dict) else None
        if t.get("type") != "function" or not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise APIError(400, "each tool must be {\"type\": \"function\", \"function\": {\"name\": ..., "
                                "\"parameters\": {...}}}", f"tools[{i}]")
        if problem := tool_name_problem(fn["name"]):
            raise APIError(400, problem, f"tools[{i}].function.name")
        params = fn.get("parameters") or {"type": "object", "properties": {}}
        checked_schema(params, f"tools[{i}].function.parameters")
        if fn.get("strict"):
            params = closed_schema(params)
        specs.append(FunctionSpec(fn["name"], params))
        defs.append({"type": "function", "function": {k: v for k, v in fn.items() if k != "strict"}})
    choice = req.tool_choice if req.tool_choice is not None else ("auto" if specs else "none")
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name")
        if name not in {s.name for s in specs}:
            raise APIError(400, f"tool_choice names {name!r}, which is not among the tools", "tool_choice")
        return [s for s in specs if s.name == name], defs, "required"
    if choice not in ("auto", "required", "none"):
        raise APIError(400, f"tool_choice must be 'auto', 'required', 'none' or a named function, not {choice!r}",
                       "tool_choice")
    if choice == "required" and not specs:
        raise APIError(400, "tool_choice 'required' needs tools", "tool_choice")
    return specs, defs, choice


def wants_strict(req: ChatRequest) -> bool:
    """A request whose response_format or any tool says `strict: true`: every keyword of its grammar
    enforced exactly, or a 400 before anything is generated."""
    rf = req.response_format or {}
    spec = rf.get("json_schema") if rf.get("type") == "json_schema" else None
    tools = [t.get("function") for t in req.tools or [] if isinstance(t, dict)]
    return bool(isinstance(spec, dict) and spec.get("strict")) or any(
        isinstance(fn, dict) and fn.get("strict") is True for fn in tools)


def invalid_output(e: OutputValidationError) -> APIError:
    """An output that failed the check after generation (each resample too): a 422 carrying the
    output and the keyword that failed, so a client can tell it from a server fault and act on it."""
    return APIError(422, f"the model's output failed a keyword the grammar could not enforce exactly: {e.args[0]}; "
                         "retry, or give strict: true to be told up front which keywords cannot be enforced",
                    None, "invalid_request_error", "invalid_model_output",
                    {"output": e.text, "keyword": e.keyword, "pointer": e.pointer})


def response_schema(req: ChatRequest) -> Any:
    """The json_schema of `response_format` (True for json_object), or None for text."""
    rf = req.response_format
    if rf is None or rf.get("type") in ("text", "structural_tag"):  # (a structural tag: structural_tag below)
        return None
    if rf.get("type") == "json_object":
        return True
    if rf.get("type") == "json_schema":
        spec = rf.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema", {}), (dict, bool)):
            raise APIError(400, "response_format.json_schema must be {\"name\": ..., \"schema\": {...}}",
                           "response_format.json_schema")
        schema = checked_schema(spec.get("schema", True), "response_format.json_schema.schema")
        if spec.get("strict") and isinstance(schema, dict):
            schema = closed_schema(schema)
        return schema
    raise APIError(400, f"response_format.type must be text, json_object, json_schema or structural_tag, not "
                        f"{rf.get('type')!r}", "response_format.type")


def structural_tag(req: ChatRequest) -> StructuralTag | None:
    """The structural tag of `response_format` (chat/structural.py), or None; a 400 naming the field."""
    rf = req.response_format
    if rf is None or rf.get("type") != "structural_tag":
        return None
    if req.tools:
        raise APIError(400, "a structural_tag response_format cannot be combined with tools: a tag is how a reply "
                            "writes its own calls", "response_format")
    try:
        return StructuralTag.parse(rf)
    except RequestError as e:
        raise APIError(400, str(e), "response_format") from None


RESERVED_TEMPLATE_VARIABLES = ("messages", "tools", "add_generation_prompt", "bos_token", "eos_token")


def template_kwargs(req: ChatRequest) -> dict[str, Any]:
    """The request's chat_template_kwargs; a 400 for a variable the server itself sets."""
    kwargs = req.chat_template_kwargs or {}
    taken = [k for k in kwargs if k in RESERVED_TEMPLATE_VARIABLES]
    if taken:
        raise APIError(400, f"chat_template_kwargs may not set {taken}: the server renders those from the request",
                       "chat_template_kwargs")
    return kwargs


def checked_schema(schema: Any, param: str) -> Any:
    """`schema`, or a 400 naming `param` and the pointer where it is not valid JSON Schema, or where
    it is larger or deeper than the server compiles."""
    if len(json.dumps(schema)) > MAX_SCHEMA_BYTES or _depth(schema) > MAX_SCHEMA_DEPTH:
        raise APIError(400, f"{param} is larger than {MAX_SCHEMA_BYTES} bytes of JSON or nested deeper than "
                            f"{MAX_SCHEMA_DEPTH} levels; simplify it", param)
    invalid = metaschema_error(schema)
    if invalid is not None:
        raise APIError(400, f"{param} is not valid JSON Schema: {invalid[0]} (at {invalid[1]})", param)
    return schema


def _depth(value: Any) -> int:
    """How deeply a JSON value nests (without recursion: a hostile value may nest thousands deep)."""
    deepest, todo = 0, [(value, 1)]
    while todo:
        v, d = todo.pop()
        deepest = max(deepest, d)
        if isinstance(v, dict):
            todo.extend((x, d + 1) for x in v.values())
        elif isinstance(v, list):
            todo.extend((x, d + 1) for x in v)
    return deepest


def check_max_tokens(max_tokens: int | None, prompt_tokens: int, context: int, param: str = "max_tokens") -> None:
    """A 400 where the prompt and `max_tokens` cannot fit in the context together (as vLLM answers;
    the engine alone would stop at the context's end)."""
    if isinstance(max_tokens, int) and prompt_tokens + max_tokens > context:
        raise APIError(400, f"{param}={max_tokens} is too large: the context holds {context} tokens and the prompt "
                            f"takes {prompt_tokens}, leaving at most {max(context - prompt_tokens, 0)}; lower {param}",
                       param)


def template_messages(req: ChatRequest, fmt) -> list[dict]:
    """The request's messages as the chat template renders them (messages.template_messages);
    a message that cannot be rendered is a 400 naming it."""
    try:
        return messages.template_messages(req.messages, fmt)
    except messages.MessageError as e:
        raise APIError(400, str(e), e.param) from None


def text_content(content: Any, where: str, kinds: tuple[str, ...] = ("text",)) -> str:
    """A message's content as text (messages.text_content); a 400 naming the part otherwise."""
    try:
        return messages.text_content(content, where, kinds)
    except messages.MessageError as e:
        raise APIError(400, str(e), e.param) from None


def tool_calls_json(calls: list[ToolCall], prefix: str) -> list[dict]:
    """Calls in OpenAI's shape; the arguments as the model wrote them (what streamed deltas add up to)."""
    return [{"id": c.id or call_id(prefix, k), "type": "function",
             "function": {"name": c.name, "arguments": c.arguments_json}} for k, c in enumerate(calls)]


def call_id(prefix: str, k: int) -> str:
    return f"call_{prefix}_{k}"


def logprobs_json(logprobs) -> dict | None:
    if logprobs is None:
        return None

    def entry(token: str, lp: float) -> dict:
        return {"token": token, "logprob": lp, "bytes": list(token.encode())}

    return {"content": [{**entry(t.token, t.logprob), "top_logprobs": [entry(s, v) for _, s, v in t.top]}
                        for t in logprobs]}


def finish_reason(reason: str, has_calls: bool) -> str:
    """Only OpenAI's reasons: a grammar dead end ends the output as a stop does; calls cut short by
    max_tokens (the completed ones returned) are "length"."""
    if has_calls and reason != "length":
        return "tool_calls"
    return "length" if reason == "length" else "stop"


def bad_request(e: RequestError) -> APIError:
    """A RequestError from the engine, with the SamplingParams field it names as `param`."""
    message = str(e)
    param = None
    if message.startswith("SamplingParams."):
        param = message.split("=", 1)[0].removeprefix("SamplingParams.")
    return APIError(400, message, param)


# ---- shared by the single-engine app and the Ray Serve ingress (cluster.py) ----------------------------

def check_access(authorization: str | None, body: dict | None, api_key: str | None, model_name: str,
                 adapters: Callable[[], list[str]] = list) -> None:
    """401 without the API key; 404 when `body` names a model that is neither the base (`model_name`) nor one
    of the LoRA `adapters` loaded."""
    if api_key is not None and authorization != f"Bearer {api_key}":
        raise APIError(401, "invalid or missing API key: send Authorization: Bearer <key>", None,
                       "authentication_error", "invalid_api_key")
    if body is not None and body.get("model") not in (model_name, None):
        loaded = adapters()
        if body.get("model") in loaded:
            return
        also = f" and the LoRA adapters {sorted(loaded)}" if loaded else ""
        raise APIError(404, f"the model {body.get('model')!r} does not exist; this server serves {model_name!r}"
                            f"{also}", "model", "invalid_request_error", "model_not_found")


def no_pin(pin_id: str) -> APIError:
    return APIError(404, f"no pin {pin_id!r}; GET /v1/pins lists them", "pin_id", code="pin_not_found")


def json_object(raw: Any) -> dict:
    if not isinstance(raw, dict):
        raise APIError(400, "the request body must be a JSON object")
    return raw


async def read_json(request: Any) -> Any:
    """The body as JSON: a 413 past MAX_BODY_BYTES, a 400 where it is not JSON (or nests past what
    the parser can read)."""
    if int(request.headers.get("content-length") or 0) > MAX_BODY_BYTES:
        raise APIError(413, f"the request body is over {MAX_BODY_BYTES} bytes", None, code="body_too_large")
    raw = await request.body()
    if len(raw) > MAX_BODY_BYTES:
        raise APIError(413, f"the request body is over {MAX_BODY_BYTES} bytes", None, code="body_too_large")
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise APIError(400, "the request body is not valid JSON") from None
    except RecursionError:
        raise APIError(400, "the request body nests too deeply") from None


def validate(kind: type[BaseModel], body: dict) -> Any:
    """`body` as a `kind` request; a 400 naming the first bad field otherwise."""
    from pydantic import ValidationError

    try:
        req = kind.model_validate(body)
    except ValidationError as e:
        err = e.errors()[0]
        raise APIError(400, f"{'.'.join(map(str, err['loc']))}: {err['msg']}", ".".join(map(str, err["loc"]))) from None
    req.check_limits()
    return req


def engine_error(e: Exception) -> APIError:
    """An engine error as an HTTP error: a bad request or a pin over the budget is 400, a closed engine
    503, anything else 500."""
    if isinstance(e, UnknownAdapterError):  # (unloaded after the model check let its request in)
        return APIError(404, str(e), "model", "invalid_request_error", "model_not_found")
    status = 400 if isinstance(e, (RequestError, CacheError)) else 503 if isinstance(e, EngineClosedError) else 500
    return APIError(status, str(e), type="invalid_request_error" if status == 400 else "server_error")


def model_card(name: str, created: int, parent: str | None = None, root: str | None = None) -> dict:
    """A /v1/models entry; a LoRA adapter's names its base model as `parent` and its files as `root` (vLLM's)."""
    return {"id": name, "object": "model", "created": created, "owned_by": "agentkv", "parent": parent,
            "root": root or name}

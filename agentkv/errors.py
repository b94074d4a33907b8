"""One error hierarchy for everything agentkv raises at its edges.

Each message says what was wrong and what to change. Internal invariants use `assert`; anything a
user can cause raises one of these.
"""

from __future__ import annotations


class AgentKVError(Exception):
    """Base of every error agentkv raises on purpose."""


class ModelLoadError(AgentKVError):
    """A model path, file or architecture that cannot be loaded."""


class AdapterError(ModelLoadError):
    """A LoRA adapter that cannot be loaded onto the engine's model (its files, its targets or its shapes)."""


class RequestError(AgentKVError, ValueError):
    """A request whose parameters or prompt cannot be served as given."""


class UnknownAdapterError(RequestError):
    """A request for a LoRA adapter the engine has not loaded (HTTP 404 in the server)."""


class PromptTooLongError(RequestError):
    """A prompt longer than the model's context or the KV pool (HTTP 413 in the server)."""


class CacheError(AgentKVError):
    """The KV cache refused an operation (a pin over budget, an unknown pin handle)."""


class PinBudgetError(CacheError):
    """A pin that would exceed the pinned-token budget."""


class EngineError(AgentKVError):
    """The engine failed while serving a request; the engine itself keeps serving others."""


class EngineClosedError(EngineError):
    """The engine was shut down before the request finished."""


class GrammarError(AgentKVError, ValueError):
    """A schema, regex or grammar that cannot be compiled exactly (never silently loosened).

    `pointer` is the JSON pointer of the offending schema keyword, when there is one.
    """

    def __init__(self, message: str, pointer: str | None = None):
        super().__init__(f"{message} (at {pointer or '#'})" if pointer is not None else message)
        self.pointer = pointer


class OutputError(AgentKVError):
    """A structured generation whose text cannot be returned as a valid object.

    `text` is the text generated; `finish_reason` why generation ended.
    """

    def __init__(self, message: str, text: str, finish_reason: str | None):
        super().__init__(message)
        self.text, self.finish_reason = text, finish_reason

    def __reduce__(self):  # errors cross processes (Ray replicas): rebuild with every argument
        return type(self), (self.args[0], self.text, self.finish_reason)


class IncompleteOutputError(OutputError):
    """The output ended before the grammar was complete (max_tokens, a stop string, a dead end, an abort)."""


class OutputValidationError(OutputError):
    """The output is complete JSON for the schema but fails a check after generation: a keyword the
    grammar could not enforce exactly (`keyword` and its schema `pointer`, where known), or a model's
    own validators."""

    def __init__(self, message: str, text: str, finish_reason: str | None, keyword: str | None = None,
                 pointer: str | None = None):
        super().__init__(message, text, finish_reason)
        self.keyword, self.pointer = keyword, pointer

    def __reduce__(self):
        return type(self), (self.args[0], self.text, self.finish_reason, self.keyword, self.pointer)


class ToolDefinitionError(AgentKVError, TypeError):
    """A function that cannot be made a tool (an unannotated parameter, *args, a type with no JSON schema)."""


class ModelRetry(AgentKVError):
    """Raised by a tool or an output validator to have the model try again: the message is what the
    model is told. Each raise counts against the tool's (or the output's) retries."""


class ToolArgumentsError(AgentKVError, ValueError):
    """A model's arguments for a tool that do not validate; `tool` names it, the message says what is wrong."""

    def __init__(self, tool: str, problems: str):
        super().__init__(f"invalid arguments for tool {tool!r}: {problems}")
        self.tool, self.problems = tool, problems

    def __reduce__(self):
        return type(self), (self.tool, self.problems)


class AgentError(AgentKVError):
    """An agent run that could not produce its output."""


class JournalError(AgentError):
    """A durable run that cannot be started or resumed as asked (agents/_journal.py): a run_id already
    used or unknown, a journal of another agent definition or format, a run another worker holds."""


class AgentRetriesError(AgentError):
    """The model kept producing output that failed validation (or tool arguments its tools refused)
    after `retries` corrections. `last_output` is the last failed object (text, or the tool call),
    `errors` the message of each failure, in order."""

    def __init__(self, message: str, last_output: object, errors: list[str]):
        super().__init__(message)
        self.last_output, self.errors = last_output, errors

    def __reduce__(self):
        return type(self), (self.args[0], self.last_output, self.errors)

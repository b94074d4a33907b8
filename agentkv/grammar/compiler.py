"""GrammarCompiler: schemas, regexes, choices and Lark text -> CompiledGrammar, cached per source.

One compiler per tokenizer, shared by all requests; compiled grammars are cached by their source
and options (LRU), so an agent's tool schema is compiled once. Compilation is bounded by a timeout
and fails with a `GrammarError`, never by hanging a request. A JSON schema keyword no grammar
enforces exactly is relaxed and listed in the compiled grammar's `relaxed` (schema/relaxed.py), or refused
by a `strict` compiler.
"""

from __future__ import annotations

import gc
import json
import threading
import time
from collections import OrderedDict
from contextlib import contextmanager

from agentkv.errors import GrammarError
from agentkv.grammar.automata import dfa
from agentkv.grammar.automata.automaton import link
from agentkv.grammar.automata.expr import Ref, alt, lit
from agentkv.grammar.automata.regex import match_expr
from agentkv.grammar.compiled import MAX_TABLE_BYTES, CompiledGrammar
from agentkv.grammar.composed import ComposedGrammar
from agentkv.grammar.composer import Composer
from agentkv.grammar.lark.lower import lark_rules
from agentkv.grammar.schema.json_schema import JsonSchemaConverter
from agentkv.grammar.schema.pydantic import is_python_type, model_schema, type_schema
from agentkv.grammar.schema.refs import SchemaResources
from agentkv.grammar.schema.relaxed import Relaxed
from agentkv.grammar.schema.style import check_json_style, styled_rules
from agentkv.grammar.tokens.vocab import TokenizerInfo

DEFAULT_CACHE_BYTES = 1 << 30
BUDGET_CHECK_EVERY = 64  # cache hits between two looks at the byte budget


class GrammarCompiler:
    def __init__(self, info: TokenizerInfo, cache_size: int = 256, timeout_s: float = 10.0, *, strict: bool = False,
                 cache_bytes: int = DEFAULT_CACHE_BYTES, number_digits: int | None = None, json_style: str = "compact"):
        """`strict`: refuse (GrammarError) every JSON schema keyword the grammar cannot enforce exactly,
        instead of relaxing it and listing it in `CompiledGrammar.relaxed` for validation after.

        `number_digits`: JSON numbers in its grammars (JSON Schema, and Lark's %json blocks) have at
        most this many integer, fraction and exponent digits beyond what their schema's bounds need
        (schema/numbers.py; the engine's generation policy, 16). None, the default: exact to the spec.

        `json_style`: the separators its JSON grammars write, "compact" (the default), "spaced" or
        "model" (the model's choice at the first separator; schema/style.py); a Lark `%json:spaced {...}`
        block names its own.

        `cache_size` grammars are kept, and `cache_bytes` bounds what they hold together (automata,
        configuration tables, token masks, token walks): past it the least recently used grammars are
        let go (requests using one keep it until they end). A grammar whose configuration tables pass
        MAX_TABLE_BYTES is renewed: new requests get it with empty tables (CompiledGrammar.renewed)."""
        if not isinstance(info, TokenizerInfo):
            raise GrammarError("GrammarCompiler needs a TokenizerInfo (TokenizerInfo.from_huggingface(tokenizer))")
        self.info = info
        # The byte trie token masks walk, built now rather than in a request's first mask.
        info.trie  # noqa: B018
        self.timeout_s = timeout_s
        self.strict = strict
        self.number_digits = number_digits
        self.json_style = check_json_style(json_style)
        self._cache: OrderedDict = OrderedDict()
        self._cache_size = cache_size
        self.cache_bytes = cache_bytes
        self._evicted = 0
        self._renewed = 0  # grammars whose configuration tables outgrew MAX_TABLE_BYTES
        self._lookups = 0  # lookups and compiles since the last look at every grammar's bytes
        self._estimate = 0  # their bytes at that look, plus each grammar compiled since, as compiled
        self._lock = threading.Lock()
        self.composer = Composer(self)

    def _cached(self, key, build) -> CompiledGrammar:
        check = False
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                if hit.table_bytes() > MAX_TABLE_BYTES:  # (its requests keep it; new ones start afresh)
                    hit = self._cache[key] = hit.renewed()
                    self._renewed += 1
                self._cache.move_to_end(key)
                self._lookups += 1
                check = self._lookups >= BUDGET_CHECK_EVERY  # (caches grow with use, not only at compile)
        if hit is not None:
            if check:
                self._keep_to_budget()
            return hit
        try:
            with _collector_paused():
                g = build(time.monotonic() + self.timeout_s)
        except RecursionError:  # (any front end's parser, Lark's included, or the linker)
            raise GrammarError("the grammar nests too deeply to compile: nest it fewer levels deep (a few "
                               "hundred at most)") from None
        size = g.cache_bytes()
        with self._lock:
            self._cache[key] = g
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
                self._evicted += 1
            # Every grammar's bytes are looked at only when the estimate passes the budget, or after
            # BUDGET_CHECK_EVERY lookups and compiles: looking at each after each compile cost ~2 ms
            # a compile with ~150 grammars kept (their walks and masks counted one by one).
            self._estimate += size
            self._lookups += 1
            check = self._estimate > self.cache_bytes or self._lookups >= BUDGET_CHECK_EVERY
        if check:
            self._keep_to_budget()
        return g

    def _keep_to_budget(self) -> None:
        """Let the least recently used grammars go while all of them hold more than `cache_bytes`
        (the newest always stays). Sizes are read outside the compiler's lock: each grammar's own
        lock guards its caches, and a mask being computed holds it."""
        with self._lock:
            grammars = list(self._cache.items())
        sizes = {key: g.cache_bytes() for key, g in grammars}
        with self._lock:
            total = sum(sizes.get(key, 0) for key in self._cache)
            for key in list(self._cache)[:-1]:
                if total <= self.cache_bytes:
                    break
                total -= sizes.get(key, 0)
                del self._cache[key]
                self._evicted += 1
            self._estimate, self._lookups = total, 0

    def from_rules(self, rules: dict, root: str, description: str, deadline: float,
                   relaxed: tuple[Relaxed, ...] = ()) -> CompiledGrammar:
        auto = link(rules, root, deadline)
        self.check_deadline(deadline, description)
        g = CompiledGrammar(auto, self.info, description, relaxed)
        g.walk_tables  # noqa: B018  (built with the grammar, not in its first mask)
        return g

    def check_deadline(self, deadline: float, description: str) -> None:
        if time.monotonic() > deadline:
            raise GrammarError(f"compiling {description} took longer than {self.timeout_s} s; simplify it "
                               "or raise GrammarCompiler(timeout_s=...)")

    def compile_json_schema(self, schema, *, close_objects: bool = False, whitespace: bool = False,
                            max_whitespace: int = 16, documents: dict | None = None,
                            number_digits: int | None | str = "compiler",
                            json_style: str | None = None) -> CompiledGrammar:
        """A JSON Schema as a dict, a JSON string, or a Pydantic model class.

        `number_digits`, `json_style`: as GrammarCompiler's (its own by default), for this schema.

        `documents` maps URIs to the other schema documents its `$ref`s may point to (nothing is
        fetched); relative references are read against the schema's `$id`.

        `close_objects`: objects without `additionalProperties` take no other keys (xgrammar's strict
        mode; what the engine generates under by default). Without it the grammar is exact to the
        spec: other keys are allowed, so it accepts every valid instance. A Pydantic model's objects
        are closed unless it allows extra fields: its schema omits `additionalProperties`, yet
        Pydantic ignores or refuses extra keys, so writing them would only spend tokens."""
        if _is_closed_model(schema):
            close_objects = True
        schema = schema_dict(schema)
        refs = None
        if documents:  # read them now: the key holds the documents this schema reaches, no others
            refs = SchemaResources(schema, documents)
        # (the text as given, keys unsorted: members are written in the order the schema declares
        # them, so the same schema in another order is another grammar)
        reached = json.dumps(refs.used) if refs else ""
        if number_digits == "compiler":
            number_digits = self.number_digits
        style = "compact" if whitespace else check_json_style(json_style or self.json_style)
        key = ("json", json.dumps(schema), reached, close_objects, whitespace, max_whitespace, number_digits, style)

        def build(deadline):
            rules, relaxed = styled_rules(lambda one, prefix: JsonSchemaConverter(
                schema, close_objects=close_objects, strict=self.strict, whitespace=whitespace,
                max_whitespace=max_whitespace, deadline=deadline, refs=refs, number_digits=number_digits,
                prefix=prefix, style=one), style, "")
            return self.from_rules(rules, "root", "json schema", deadline, tuple(relaxed.values()))

        return self._cached(key, build)

    def compile_builtin_json(self, whitespace: bool = False) -> CompiledGrammar:
        """Any JSON value."""
        return self.compile_json_schema(True, whitespace=whitespace)

    def compile_lark(self, text: str | ComposedGrammar) -> CompiledGrammar:
        """A Lark grammar (llguidance's dialect: see lark/lower.py); the start rule is `start`. A
        `ComposedGrammar` is composed from its parts, each compiled once (grammar/composer.py)."""
        if isinstance(text, ComposedGrammar):
            return self._cached(("composed", text), lambda deadline: self.composer.compose(text, deadline))
        if not isinstance(text, str):
            raise GrammarError("a Lark grammar must be given as text")

        def build(deadline):
            rules, relaxed = self.lark_rules(text, deadline)
            return self.from_rules(rules, "r:start", "lark grammar", deadline, relaxed)

        return self._cached(("lark", text), build)

    def lark_rules(self, text: str, deadline: float) -> tuple[dict, tuple[Relaxed, ...]]:
        """Lark text -> its rules (`%json` blocks converted under this compiler's strictness), and
        the keywords those relaxed."""
        relaxed: dict = {}

        def json_rules(schema, name, python=False, style=None):
            rules, more = styled_rules(lambda one, prefix: JsonSchemaConverter(
                schema, strict=self.strict, deadline=deadline, prefix=prefix, python_literals=python,
                number_digits=self.number_digits, style=one), style or self.json_style, name + "/")
            relaxed.update(more)
            rules[name] = Ref(name + "/root")
            return rules

        rules = lark_rules(text, json_rules)
        return rules, tuple(relaxed.values())

    def compile_regex(self, pattern: str) -> CompiledGrammar:
        """Strings matching `pattern` in full."""
        return self._cached(("regex", pattern), lambda d: self.from_rules(
            {"root": match_expr(pattern)}, "root", f"regex {pattern!r}", d))

    def compile_choices(self, choices: list[str]) -> CompiledGrammar:
        """Exactly one of the given strings."""
        if not choices or not all(isinstance(c, str) for c in choices):
            raise GrammarError("choices must be a non-empty list of strings")
        return self._cached(("choices", tuple(choices)), lambda d: self.from_rules(
            {"root": alt(*[lit(c) for c in choices])}, "root", "choices", d))

    def cache_size(self) -> int:
        return len(self._cache)

    def cache_info(self) -> dict[str, int]:
        """What this compiler's grammars keep, summed (CompiledGrammar.cache_info), with the grammars
        kept and evicted, and the rule automata kept across compilations (dfa.cache_info)."""
        with self._lock:
            grammars = list(self._cache.values())
            out = {"grammars": len(grammars), "grammars_evicted": self._evicted, "grammars_renewed": self._renewed,
                   "budget_bytes": self.cache_bytes}
        for g in grammars:
            for k, v in g.cache_info().items():
                out[k] = out.get(k, 0) + v
        return {**out, **self.composer.cache_info(), **dfa.cache_info()}


_pause_lock = threading.Lock()
_pauses = 0
_resume = False


@contextmanager
def _collector_paused():
    """Python's cyclic collector off while a grammar compiles. A compile allocates hundreds of
    thousands of short-lived containers (expressions, NFA encodings, rule tables), none in cycles
    that outlive it, and each allocation burst set off collections that scanned the whole heap:
    15% of compile time on SchemaStore. Refcounting frees them all the same. Nested and concurrent
    compiles share one pause; the collector comes back on when the last ends, if it was on."""
    global _pauses, _resume
    with _pause_lock:
        if _pauses == 0:
            _resume = gc.isenabled()
            gc.disable()
        _pauses += 1
    try:
        yield
    finally:
        with _pause_lock:
            _pauses -= 1
            if _pauses == 0 and _resume:
                gc.enable()


def _is_closed_model(schema) -> bool:
    """A Pydantic model class that forbids or ignores extra fields (the default), or another Python
    type (`list[Item]`, `A | B`): Pydantic ignores the keys its schema leaves out. (A model that
    allows extra fields says `additionalProperties` in its schema, which closing keeps.)"""
    config = getattr(schema, "model_config", None)
    if isinstance(schema, type) and hasattr(schema, "model_json_schema"):
        return (config or {}).get("extra") != "allow"
    return is_python_type(schema)


def closed_schema(schema):
    """A schema's dict with every object closed (`additionalProperties: false` where it is not
    given; the names it requires without declaring them declared, with any value): what
    `close_objects=True` compiles, as a dict to embed in a Lark `%json` block."""
    schema = schema_dict(schema)

    def close(node):
        if isinstance(node, list):
            return [close(n) for n in node]
        if not isinstance(node, dict):
            return node
        out = {}
        for k, v in node.items():
            if k in _DATA_KEYWORDS:  # values, not schemas
                out[k] = v
            elif k in _SCHEMA_MAPS and isinstance(v, dict):
                out[k] = {name: close(sub) for name, sub in v.items()}
            else:
                out[k] = close(v)
        if ("properties" in node or node.get("type") == "object") and "additionalProperties" not in node:
            out["additionalProperties"] = False
            # a name `required` lists is declared too: closing must not make the object impossible
            required = node.get("required")
            props = out.get("properties", {})
            if isinstance(required, list) and isinstance(props, dict):
                missing = [n for n in required if isinstance(n, str) and n not in props]
                if missing:
                    out["properties"] = {**props, **{n: {} for n in missing}}
        return out

    return close(schema)


_DATA_KEYWORDS = {"const", "enum", "default", "examples", "required", "description", "title"}
_SCHEMA_MAPS = {"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"}


def output_grammar_schema(schema):
    """The dict to embed for an output schema: closed for a Pydantic model that forbids or ignores
    extra fields (as `compile_json_schema` compiles it), as given otherwise."""
    return closed_schema(schema) if _is_closed_model(schema) else schema_dict(schema)


def schema_dict(schema):
    """A schema as a dict (or boolean): parsed from JSON text, or a Pydantic model's JSON schema
    with the constraints its plain schema leaves out (schema/pydantic.py)."""
    if isinstance(schema, str):
        try:
            return json.loads(schema)
        except json.JSONDecodeError as e:
            raise GrammarError(f"the schema string is not valid JSON: {e}") from None
    if isinstance(schema, type) and hasattr(schema, "model_json_schema"):
        return model_schema(schema)
    if isinstance(schema, (dict, bool)):
        return schema
    if schema is None:
        raise GrammarError("a schema must be a dict, a JSON string, a Pydantic model or a Python type, not None")
    return type_schema(schema)  # list[int], A | B, a TypedDict, ...

"""Where a `$ref` leads: the schema itself, the resources embedded in it (subschemas with an `$id` of
their own), and other documents the caller supplies by URI (`compile_json_schema(..., documents=)`).

Every document is read once, up front, and its `$ref`s are rewritten to one absolute form, so a
reference means the same wherever the converter meets it: also after `allOf` has merged a schema
from another document into this one, where a relative reference would otherwise be read against
the wrong base. After rewriting, a reference into the root document is `#<fragment>` (the common
case is left as written and nothing is copied), and a reference into any other resource is
`<absolute URI>#<fragment>`. Nothing is fetched: a reference to a document that was not given is a
`GrammarError` naming it, raised only where the reference is followed.

Pointers (the second value `resolve` returns, which name rules and locate errors) are `#/...` in
the root document, also inside its embedded resources, and `<URI>#/...` in a supplied document.
"""

from __future__ import annotations

from urllib.parse import unquote, urldefrag, urljoin

from agentkv.errors import GrammarError
from agentkv.grammar.schema.objects import pointer_escape

NOT_SCHEMAS = ("enum", "const", "default", "examples", "example")  # values, not subschemas
# Keywords whose value maps names to subschemas: a name there is never a keyword.
SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas", "dependencies")


class SchemaResources:
    def __init__(self, root, documents: dict | None = None):
        documents = documents or {}
        for uri, doc in documents.items():
            if not isinstance(uri, str) or not isinstance(doc, (dict, bool)):
                raise GrammarError(f"documents must map URI strings to schemas (dicts); got {uri!r}: "
                                   f"{type(doc).__name__}")
        # (keys without a fragment are used as given: reading each with urldefrag cost ~1 ms a compile
        # with SchemaStore's 456 documents)
        self.given: dict[str, object] = documents if not any("#" in uri for uri in documents) else {
            urldefrag(uri).url: doc for uri, doc in documents.items()}
        self.base = _own_id(root, "")
        self.resources: dict[str, tuple[object, str]] = {}  # URI ("" for the root) -> (node, pointer)
        self.anchors: dict[str, str] = {}  # "<URI>#<name>" -> pointer
        self.used: dict[str, object] = {}  # the supplied documents the root reaches, as given
        self.missing: set[str] = set()  # documents referenced but not supplied
        self._pending: list[str] = []
        self.root = self._read(root, self.base, "", "#")
        while self._pending:  # documents reached through other documents, transitively
            uri = self._pending.pop()
            if uri in self.resources:
                continue
            if uri in self.given:
                self.used[uri] = doc = self.given[uri]
                self._read(doc, _own_id(doc, uri), uri, f"{uri}#")
            else:
                self.missing.add(uri)

    def _read(self, doc, base: str, uri: str, ptr: str):
        self.resources[uri] = (None, ptr)  # reserved while read: references to it are not queued again
        out = self._rewrite(doc, base, ptr, top=True)
        self.resources[uri] = (out, ptr)
        if uri and base != uri:  # a supplied document is also known by its own $id
            self.resources[base] = (out, ptr)
        return out

    def _rewrite(self, node, base: str, ptr: str, top: bool = False):
        """`node` with its `$ref`s in absolute form (the same object where none changes)."""
        if isinstance(node, list):
            items = [self._rewrite(v, base, f"{ptr}/{i}") for i, v in enumerate(node)]
            return node if all(a is b for a, b in zip(items, node)) else items
        if not isinstance(node, dict):
            return node
        own = node.get("$id")
        embedded = isinstance(own, str) and not top and not own.startswith("#")
        if embedded:
            base = urldefrag(_join(base, own)).url
        elif isinstance(own, str) and own.startswith("#") and len(own) > 1:  # draft-07 plain-name id
            self.anchors[self._key(base, own[1:])] = ptr
        if isinstance(node.get("$anchor"), str):
            self.anchors[self._key(base, node["$anchor"])] = ptr
        out = {}
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str):
                new = self._absolute(value, base)
                out[key] = value if new == value else new
            elif key in NOT_SCHEMAS:
                out[key] = value
            elif key in SCHEMA_MAPS and isinstance(value, dict):
                at = f"{ptr}/{pointer_escape(key)}"
                sub = {k: self._rewrite(v, base, f"{at}/{pointer_escape(k)}") for k, v in value.items()}
                out[key] = value if all(sub[k] is value[k] for k in value) else sub
            else:
                out[key] = self._rewrite(value, base, f"{ptr}/{pointer_escape(key)}")
        result = node if all(out[k] is v for k, v in node.items()) else out
        if embedded and self._doc(base):
            self.resources[base] = (result, ptr)
        return result

    def _doc(self, uri: str) -> str:
        return "" if uri == self.base else uri

    def _key(self, base: str, name: str) -> str:
        return f"{self._doc(base)}#{name}"

    def _absolute(self, ref: str, base: str) -> str:
        doc, frag = urldefrag(_join(base, ref))
        doc = self._doc(doc)
        if doc and doc not in self.resources:
            self._pending.append(doc)
        return f"{doc}#{frag}"

    def resolve(self, ref: str, where: str) -> tuple[object, str]:
        """The schema a (rewritten) reference points to, and its pointer."""
        doc, _, frag = ref.partition("#")
        if doc not in self.resources:
            raise GrammarError(f"$ref '{ref}' points to the document '{doc}', which was not given: pass it "
                               f"as compile_json_schema(..., documents={{'{doc}': schema}}) or inline it", where)
        if frag and not frag.startswith("/"):
            ptr = self.anchors.get(f"{doc}#{unquote(frag)}")
            if ptr is None:
                raise GrammarError(f"$ref '{ref}': no $anchor '{unquote(frag)}' in that document", where)
        else:
            ptr = self.resources[doc][1] + frag
        document, _, path = ptr.partition("#")
        node = self.resources[document][0]
        for part in path.split("/")[1:]:
            key = unquote(part).replace("~1", "/").replace("~0", "~")
            if isinstance(node, list) and key.isdigit() and int(key) < len(node):
                node = node[int(key)]
            elif isinstance(node, dict) and key in node:
                node = node[key]
            else:
                raise GrammarError(f"$ref '{ref}' does not resolve", where)
        return node, ptr


def documents_by_id(schemas) -> dict:
    """Schemas by their own absolute `$id` (draft-04: `id`): the `documents=` for references between
    them (a set of schemas that name one another, as SchemaStore's do)."""
    return {uri: s for s in schemas if (uri := _own_id(s, ""))}


def _own_id(schema, fallback: str) -> str:
    """A document's base URI: its own absolute `$id` (draft-04: `id`), else where it was found."""
    own = schema.get("$id", schema.get("id")) if isinstance(schema, dict) else None
    if isinstance(own, str) and not own.startswith("#"):
        return urldefrag(_join(fallback, own)).url
    return fallback


def _join(base: str, ref: str) -> str:
    """`ref` read against `base` (urljoin drops the base of a fragment under a `urn:` base)."""
    if not base:
        return ref
    return base + ref if ref.startswith("#") else urljoin(base, ref)

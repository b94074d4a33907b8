"""Tokenizer and chat template of a model directory (a GGUF's: its tokenizer files written by gguf_tokenizer.py).

Encoding and decoding use the `tokenizers` library; the chat template is rendered with a sandboxed
Jinja environment as transformers does, so the prompt tokens match what the model was trained on.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from agentkv.errors import ModelLoadError, RequestError


class Tokenizer:
    """Text <-> token ids, special tokens, and the chat template of one model."""

    def __init__(self, directory: Path):
        from tokenizers import Tokenizer as HFTokenizer

        tok_file = directory / "tokenizer.json"
        if not tok_file.exists():
            raise ModelLoadError(f"{directory} has no tokenizer.json; agentkv needs a fast (tokenizers) tokenizer file")
        try:
            self._tok = HFTokenizer.from_file(str(tok_file))
        except Exception as e:
            raise ModelLoadError(f"{tok_file} could not be read: {e}") from None
        cfg = _read_json(directory / "tokenizer_config.json")
        gen = _read_json(directory / "generation_config.json")
        self.chat_template: str | None = cfg.get("chat_template")
        jinja = directory / "chat_template.jinja"
        if self.chat_template is None and jinja.exists():
            self.chat_template = jinja.read_text()
        self.bos_token = _token_text(cfg.get("bos_token"))
        self.eos_token = _token_text(cfg.get("eos_token"))
        self.bos_id = self._tok.token_to_id(self.bos_token) if self.bos_token else None
        self.add_bos = bool(cfg.get("add_bos_token", False)) and self.bos_id is not None
        eos: set[int] = set()
        if self.eos_token and self._tok.token_to_id(self.eos_token) is not None:
            eos.add(self._tok.token_to_id(self.eos_token))
        gen_eos = gen.get("eos_token_id")
        eos.update([gen_eos] if isinstance(gen_eos, int) else gen_eos or [])
        self.eos_ids: frozenset[int] = frozenset(eos)
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        self._chat_env = None
        self.kept_specials: frozenset[str] = frozenset()
        self._skipped_ids: frozenset[int] = frozenset()

    @property
    def special_tokens(self) -> tuple[str, ...]:
        """The texts of the special tokens (`<|im_start|>`, `</s>`, ...): markers no generated text
        should spell out (agentkv/chat/calls.py keeps those the chat template writes out of free text)."""
        return tuple(t.content for t in self._tok.get_added_tokens_decoder().values() if t.special)

    @property
    def backend(self):
        """The underlying `tokenizers.Tokenizer` (the grammar layer reads the vocabulary from it)."""
        return self._tok

    def encode(self, text: str, add_bos: bool | None = None) -> list[int]:
        ids = self._tok.encode(text, add_special_tokens=False).ids
        if (self.add_bos if add_bos is None else add_bos) and self.bos_id is not None:
            if not ids or ids[0] != self.bos_id:
                ids = [self.bos_id, *ids]
        return ids

    def keep_specials(self, texts: Sequence[str]) -> None:
        """Special tokens that decode to their text even where special tokens are skipped: a tool
        format's markup (Mistral's `[TOOL_CALLS]`), which the grammar writes and the parse reads."""
        kept = {t for t in texts if t in self.special_tokens}
        self.kept_specials = frozenset(kept)
        self._skipped_ids = (
            frozenset(
                t_id for t_id, t in self._tok.get_added_tokens_decoder().items() if t.special and t.content not in kept)
            if kept
            else frozenset()
        )

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        if skip_special_tokens and self._skipped_ids:
            return self._tok.decode([i for i in ids if i not in self._skipped_ids], skip_special_tokens=False)
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        return self._tok.id_to_token(token_id)

    def apply_chat_template(
        self,
        messages: Sequence[dict[str, Any]],
        add_generation_prompt: bool = True,
        tools: Sequence[dict[str, Any]] | None = None,
        **extra: Any,
    ) -> str:
        if not self.chat_template:
            raise RequestError("this model has no chat template; give it one (Engine(chat_template=...), agentkv "
                               "serve --chat-template FILE.jinja) or call generate() with a plain prompt")
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or "role" not in m:
                raise RequestError(f"messages[{i}] must be a dict with a 'role' (and usually 'content'), got {m!r}")
        template = self._environment().from_string(self.chat_template)
        return template.render(
            messages=list(messages),
            tools=list(tools) if tools else None,
            add_generation_prompt=add_generation_prompt,
            bos_token=self.bos_token or "",
            eos_token=self.eos_token or "",
            **extra,
        )

    def _environment(self):
        if self._chat_env is None:
            from jinja2.sandbox import ImmutableSandboxedEnvironment

            def raise_exception(message: str) -> None:
                raise RequestError(f"the chat template refused the messages: {message}")

            env = ImmutableSandboxedEnvironment(
                trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
            env.filters["tojson"] = _tojson
            env.globals["raise_exception"] = raise_exception
            env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
            self._chat_env = env
        return self._chat_env


def template_text(template: str) -> str:
    """A chat template given as its text or as the path of a file that holds it."""
    if "{" not in template:  # (a template writes Jinja's {{ }} or {% %}; a path does not)
        path = Path(template).expanduser()
        if not path.is_file():
            raise ModelLoadError(f"chat_template={template!r} is neither a Jinja template nor a file; give the "
                                 "template's text or the path of its .jinja file")
        return path.read_text()
    return template


def _read_json(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {}
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ModelLoadError(f"{path} is not valid JSON: {e}") from None


def _token_text(tok: Any) -> str | None:
    if isinstance(tok, dict):  # AddedToken serialized as a dict
        return tok.get("content")
    return tok


def _tojson(value: Any, indent: int | None = None, separators: tuple[str, str] | None = None,
            sort_keys: bool = False, **_) -> str:
    """Jinja's `tojson` as chat templates use it (HF's arguments: Kimi K2's writes its tools compact
    with `separators=(',', ':')`), without HTML escaping."""
    return json.dumps(value, ensure_ascii=False, indent=indent, separators=tuple(separators) if separators else None,
                      sort_keys=sort_keys)

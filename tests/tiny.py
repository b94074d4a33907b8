"""Tiny random-weight checkpoints (HF directory layout) for fast engine tests: agentkv.testing's,
with a family's chat template and special tokens from tests/chat_templates.py where one is named."""

from __future__ import annotations

import json
from pathlib import Path

from agentkv.testing import CHATML, SPECIALS, write_tiny_model

__all__ = ["CHATML", "SPECIALS", "chat_tokenizer", "make_tiny_model", "write_chat_ends"]


def make_tiny_model(out: Path, family: str = "llama", *, chat: str | None = None, merges: int = 0,
                    **options) -> Path:
    """write_tiny_model's random model; `chat`: a family of tests/chat_templates.py whose template,
    special and added tokens its tokenizer carries (ChatML without); `merges`: BPE merges its
    tokenizer learns (none: a byte tokenizer)."""
    path = write_tiny_model(out, family, tokenizer=chat_tokenizer(chat, merges), **options)
    write_chat_ends(path, chat)
    return path


def chat_tokenizer(chat: str | None, merges: int = 0) -> dict | None:
    """write_byte_tokenizer's options for the chat family `chat` (None: ChatML's)."""
    if not chat:
        return {"merges": merges} if merges else None
    from tests.chat_templates import FAMILIES

    f = FAMILIES[chat]
    return {"specials": list(f.specials), "added": list(f.added), "bos": f.bos, "eos": f.eos,
            "template": f.template, "merges": merges}


def write_chat_ends(path: Path, chat: str | None) -> None:
    """The chat family's end tokens as the checkpoint's generation_config (a special token's id is its
    place among the specials)."""
    if not chat:
        return
    from tests.chat_templates import FAMILIES

    f = FAMILIES[chat]
    if f.ends:
        ends = [f.specials.index(t) for t in (f.eos, *f.ends)]
        (path / "generation_config.json").write_text(json.dumps({"eos_token_id": ends}))

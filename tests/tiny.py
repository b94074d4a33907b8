"""Tiny random-weight checkpoints (HF directory layout) for fast engine tests: agentkv.testing's,
with a family's chat template and special tokens from tests/chat_templates.py where one is named."""

from __future__ import annotations

import json
from pathlib import Path

from agentkv.testing import CHATML, SPECIALS, write_tiny_model

__all__ = ["CHATML", "SPECIALS", "make_tiny_model"]


def make_tiny_model(out: Path, family: str = "llama", *, chat: str | None = None, merges: int = 0,
                    **options) -> Path:
    """write_tiny_model's random model; `chat`: a family of tests/chat_templates.py whose template,
    special and added tokens its tokenizer carries (ChatML without); `merges`: BPE merges its
    tokenizer learns (none: a byte tokenizer)."""
    tokenizer = {"merges": merges} if merges else None
    if chat:
        from tests.chat_templates import FAMILIES

        f = FAMILIES[chat]
        tokenizer = {"specials": list(f.specials), "added": list(f.added), "bos": f.bos, "eos": f.eos,
                     "template": f.template, "merges": merges}
    path = write_tiny_model(out, family, tokenizer=tokenizer, **options)
    if chat and f.ends:  # (a special token's id is its place among the specials)
        ends = [f.specials.index(t) for t in (f.eos, *f.ends)]
        (path / "generation_config.json").write_text(json.dumps({"eos_token_id": ends}))
    return path

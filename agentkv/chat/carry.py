"""The tokens a conversation was written in, carried to its next prompt.

A grammar's output is often not tokenized as the tokenizer would tokenize its text (jump-forward
appends `":` then `"S` where the tokenizer would write `":"` then `S`), and a chat template renders
the reply back as text. Re-tokenized, the next prompt would part from the cached tokens there and
recompute the reply. A `TokenCarry` remembers the last prompt and reply as the ids the engine saw,
and encodes the next prompt as those ids followed by its new text's: the agent loop carries it from
step to step, and a stored response (`/v1/responses`) to the response that continues it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol


class CarryTokenizer(Protocol):
    eos_ids: Any  # a container of the ids that end a turn

    def encode(self, text: str, add_bos: bool = True) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


class TokenCarry:
    def __init__(self, tokenizer: CarryTokenizer):
        self.tokenizer = tokenizer
        self._known: list[tuple[str, list[int]]] = []  # (text, its ids as written), the longest first

    def encode(self, text: str) -> list[int]:
        """`text`'s tokens: where it continues a text written before, that text's ids as they were,
        then the rest's."""
        for before, ids in self._known:
            if text.startswith(before) and len(text) > len(before):
                return ids + self.tokenizer.encode(text[len(before):], add_bos=False)
        return self.tokenizer.encode(text)

    def written(self, prompt: str, prompt_ids: list[int], completion: Any) -> None:
        """Remember `prompt` (given as `prompt_ids`) and the reply `completion` (its text, token_ids
        and finish_reason) written after it."""
        ids = list(completion.token_ids)
        if ids and ids[-1] in self.tokenizer.eos_ids and completion.finish_reason == "stop":
            ids.pop()  # the end of turn is in the template's text, which the next prompt renders
        self._known = [(prompt, list(prompt_ids))]
        if self.tokenizer.decode(ids) == completion.text:  # (not where a stop string cut the text)
            self._known.insert(0, (prompt + completion.text, list(prompt_ids) + ids))

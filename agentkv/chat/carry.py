"""The tokens a conversation was written in, carried to its next prompt.

A grammar's output is often not tokenized as the tokenizer would tokenize its text (jump-forward
appends `":` then `"S` where the tokenizer would write `":"` then `S`), and a chat template renders
the reply back as text. Re-tokenized, the next prompt would part from the cached tokens there and
recompute the reply. A `TokenCarry` remembers the last prompt and reply as the ids the engine saw,
and encodes the next prompt as those ids followed by its new text's: the agent loop carries it from
step to step, a stored response (`/v1/responses`) to the response that continues it, and the
server's chat routes keep one for every conversation they answer (a client re-sending its whole
transcript meets its replies' own tokens), bounded to `capacity` texts, the least recent out first.
The ids carried decode to the text they stand for: the prompt says the same either way.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, Protocol


class CarryTokenizer(Protocol):
    eos_ids: Any  # a container of the ids that end a turn

    def encode(self, text: str, add_bos: bool = True) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


class TokenCarry:
    def __init__(self, tokenizer: CarryTokenizer, capacity: int = 2):
        self.tokenizer, self.capacity = tokenizer, capacity
        self._known: OrderedDict[str, list[int]] = OrderedDict()  # text -> its ids as written, least recent first

    def encode(self, text: str) -> list[int]:
        """`text`'s tokens: where it continues a text written before (the longest such), that text's
        ids as they were, then the rest's."""
        before = max((k for k in self._known if len(k) < len(text) and text.startswith(k)), key=len, default=None)
        if before is None:
            return self.tokenizer.encode(text)
        self._known.move_to_end(before)
        return self._known[before] + self.tokenizer.encode(text[len(before):], add_bos=False)

    def written(self, prompt: str, prompt_ids: list[int], completion: Any) -> None:
        """Remember `prompt` (given as `prompt_ids`) and the reply `completion` (its text, token_ids
        and finish_reason) written after it."""
        ids = list(completion.token_ids)
        if ids and ids[-1] in self.tokenizer.eos_ids and completion.finish_reason == "stop":
            ids.pop()  # the end of turn is in the template's text, which the next prompt renders
        self._keep(prompt, list(prompt_ids))
        if self.tokenizer.decode(ids) == completion.text:  # (not where a stop string cut the text)
            self._keep(prompt + completion.text, list(prompt_ids) + ids)

    def remember(self, text: str, ids: list[int]) -> None:
        """Carry `ids` for `text` (they must decode to it): a next prompt that starts with `text`
        starts with them."""
        self._keep(text, list(ids))

    def state(self) -> list[tuple[str, list[int]]]:
        """What it carries, least recent first (what `restore` takes back: a stored response's carry kept
        through a restart)."""
        return [(k, list(v)) for k, v in self._known.items()]

    def restore(self, state: list[tuple[str, list[int]]]) -> None:
        for text, ids in state:
            self._keep(text, list(ids))

    def _keep(self, text: str, ids: list[int]) -> None:
        self._known[text] = ids
        self._known.move_to_end(text)
        while len(self._known) > self.capacity:
            self._known.popitem(last=False)

"""Reasoning blocks: a model that thinks in `<think>...</think>` before it answers (Qwen3,
DeepSeek-R1 and their distillations), in `[THINK]...[/THINK]` (Magistral), in an analysis message
(gpt-oss's harmony channels) or a thought channel (Gemma 4's): formats as data, each its markers and
the whitespace its templates write around them.

While the model reasons no grammar applies but one rule: the block ends with its closing marker.
After it, the step's grammar (a schema, tool calls, free text) applies. The rendered prompt says
where the reply starts: inside the block (DeepSeek-R1's templates open it), after a closed empty
block (Qwen3's `enable_thinking: false`), or free to open one. The block is written in the shape the
templates render kept reasoning, `<think>\\n...\\n</think>\\n\\n`, so a conversation that keeps a
step's reasoning re-reads it from the radix cache. A budget (`max_reasoning_tokens`) closes the
block where it is spent (engine/request.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from agentkv.chat.calls import text_without, without_partial
from agentkv.chat.formats.base import lark_literal

State = Literal["inside", "may", "off"]


@dataclass(frozen=True)
class ReasoningFormat:
    open: str = "<think>"
    close: str = "</think>"
    after_open: str = "\n"  # the whitespace the templates write around the markers
    before_close: str = "\n"
    after_close: str = "\n\n"
    switch: str = ""  # what a prompt holds where reasoning is on (Gemma 4's <|think|>); none: the markers say

    @property
    def open_text(self) -> str:
        return self.open + self.after_open

    @property
    def close_text(self) -> str:
        """What ends a block: also what a spent budget appends."""
        return self.before_close + self.close + self.after_close

    @property
    def markers(self) -> tuple[str, str]:
        return self.open, self.close

    @classmethod
    def for_template(cls, chat_template: str | None) -> ReasoningFormat | None:
        """The reasoning markers a chat template renders, or None for a model that does not reason."""
        for fmt in KNOWN:
            if chat_template and fmt.open in chat_template and fmt.close in chat_template:
                return fmt
        return None

    def state(self, prompt: str) -> State:
        """Where a reply to `prompt` starts: inside a block, free to open one, or with reasoning off."""
        if self.switch and self.switch not in prompt:
            return "off"
        tail = prompt.rstrip()
        if tail.endswith(self.open):
            return "inside"
        if tail.endswith(self.close):
            return "off"
        return "may"

    def grammar(self, answer: str | None, state: State) -> str | None:
        """The Lark grammar of a reply: the block (where the state allows one), then `answer` (rules
        whose start is `answer`, or None for free text, which needs no grammar)."""
        if answer is None:
            return None
        if state == "off":
            return "start: answer\n" + answer
        # neither marker inside: a template reads the block back by splitting at them (a marker of
        # several special tokens, harmony's, by its first: no `<|channel|>` inside)
        think = f"THINK: /{text_without(tuple(_head(m) for m in (self.close, self.open)))}/\n"
        block = f"THINK {lark_literal(self.close_text)}"
        if state == "inside":
            return f"start: {block} answer\n" + think + answer
        return f"start: ({lark_literal(self.open_text)} {block})? answer\n" + think + answer

    def split(self, text: str, state: State, final: bool = True) -> tuple[str | None, str]:
        """(the reasoning, the answer) of a reply; reasoning None where the reply has no block. Not
        `final` (a reply still being written): a start of a marker it ends with is held back."""
        if state == "off":
            return None, text
        body = text
        if state == "may":
            stripped = text.lstrip()
            if not stripped.startswith(self.open):
                if not final and self.open.startswith(stripped):
                    return "", ""  # it may be opening one
                return None, text
            body = stripped[len(self.open):]
            lead = self.after_open.strip()  # (Gemma 4's channel name, `thought`)
            if lead and body.lstrip().startswith(lead):
                body = body.lstrip()[len(lead):]
            elif lead and not final and lead.startswith(body.lstrip()):
                return "", ""
        head, sep, rest = body.partition(self.close)
        if sep:
            rest, after = rest.lstrip(), self.after_close.strip()  # (harmony's next header, `<|start|>assistant`)
            if after and rest.startswith(after):
                rest = rest[len(after):]
            elif after and not final and after.startswith(rest):
                rest = ""  # the header still being written
            return head.strip("\n"), rest
        if not final:
            # less a start of the closing marker, and the newline that may come before it
            return without_partial(head, self.close).rstrip("\n").lstrip("\n"), ""
        return head.strip("\n"), ""


# Qwen3's and DeepSeek-R1's `<think>\n...\n</think>\n\n`; Magistral's `[THINK]...[/THINK]` (special
# tokens of its tokenizer, written without whitespace of their own); gpt-oss's analysis channel (its
# message ends, and the next one, the answer, opens: `<|end|><|start|>assistant`); Gemma 4's thought
# channel (`<|channel>thought\n...\n<channel|>`, as its template writes kept reasoning), on where the
# system turn holds `<|think|>` (the template's enable_thinking)
HARMONY = ReasoningFormat("<|channel|>analysis<|message|>", "<|end|>", "", "", "<|start|>assistant")
GEMMA4 = ReasoningFormat("<|channel>", "<channel|>", "thought\n", "\n", "", switch="<|think|>")
KNOWN = (HARMONY, GEMMA4, ReasoningFormat(), ReasoningFormat("[THINK]", "[/THINK]", "", "", ""))


def _head(marker: str) -> str:
    """A marker's first special token where it is several (`<|channel|>analysis<|message|>` -> `<|channel|>`)."""
    return marker[:marker.index("|>") + 2] if marker.startswith("<|") and "|>" in marker else marker


def reply_grammar(answer: str | None, reasoning: ReasoningFormat | None, state: State) -> str | None:
    """The grammar of a reply whose answer has the rules `answer` (start rule `answer`; None: free
    text), with a reasoning block before it where the model reasons."""
    if answer is None:
        return None
    if reasoning is None:
        return "start: answer\n" + answer
    return reasoning.grammar(answer, state)

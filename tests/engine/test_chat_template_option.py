"""Engine(chat_template=...) / `agentkv serve --chat-template`: a template given as text or as a file
replaces the model's own (a GGUF may carry none), and the tool format is detected from it."""

from __future__ import annotations

import pytest

import agentkv as ak
from agentkv.errors import ModelLoadError
from tests.chat_templates import FAMILIES

PLAIN = ("{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"
         "{% if add_generation_prompt %}[bot] {% endif %}")


def test_a_given_template_replaces_the_models_own(tiny_dir, tmp_path):
    with ak.Engine(str(tiny_dir), chat_template=PLAIN) as engine:
        assert engine.render([{"role": "user", "content": "hi"}]) == "[user] hi\n[bot] "
    path = tmp_path / "qwen.jinja"
    path.write_text(FAMILIES["qwen2.5"].template)
    with ak.Engine(str(tiny_dir), chat_template=str(path)) as engine:
        assert engine.tool_format.name == "hermes" and engine.tool_format.native
        assert engine.tool_format.json_style == "spaced"  # (read from the given template)
    with pytest.raises(ModelLoadError, match="neither a Jinja template nor a file"):
        ak.Engine(str(tiny_dir), chat_template=str(tmp_path / "missing.jinja"))

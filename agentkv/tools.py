"""Deprecated path: tools moved to `agentkv.agents` (import `Tool` and `tool` from `agentkv`)."""

import warnings

from agentkv.agents._tools import Tool, args_model, parse_docstring, tool

warnings.warn("agentkv.tools is deprecated: import Tool and tool from agentkv (ak.tool) or agentkv.agents",
              DeprecationWarning, stacklevel=2)

__all__ = ["Tool", "args_model", "parse_docstring", "tool"]

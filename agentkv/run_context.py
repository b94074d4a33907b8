"""Deprecated path: RunContext moved to `agentkv.agents` (import it from `agentkv`)."""

import warnings

from agentkv.agents._context import RunContext, is_run_context

warnings.warn("agentkv.run_context is deprecated: import RunContext from agentkv (ak.RunContext) or agentkv.agents",
              DeprecationWarning, stacklevel=2)

__all__ = ["RunContext", "is_run_context"]

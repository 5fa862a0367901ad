"""Engines behind the same flags: `llmopt serve --engine vllm|llama.cpp` and `[[serve]] engine = ...`
translate llmopt's (vLLM-named) serve options into an engine's command line (llmopt's own too, for a
server the bench starts: llmopt.py) and start it in its own process (process.py). Nothing here imports
llmopt's engine or server: a server here is a process spoken to over HTTP."""

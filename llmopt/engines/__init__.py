"""Other engines behind the same flags: `llmopt serve --engine vllm|llama.cpp` and `[[serve]] engine = ...`
translate llmopt's (vLLM-named) serve options into a peer's command line and start it in its own
Python. Nothing here imports llmopt's engine or server: a peer is a process spoken to over HTTP."""

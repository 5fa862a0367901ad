#!/usr/bin/env python3
"""Start llama.cpp's own HTTP server (continuous batching, parallel slots) on 127.0.0.1.

A standalone script, shipped inside llmopt but run by the Python that has the `xllamacpp` wheel (it
embeds llama.cpp's C++ server, so nothing compiles); it imports nothing of llmopt. `llmopt serve
--engine llama.cpp` builds its command line; by hand:

    python -m venv .peer-venv && .peer-venv/bin/pip install xllamacpp
    .peer-venv/bin/python llmopt/engine_servers/llama_cpp_server.py --model PATH.gguf --port 8102 --np 16

It prints `READY <url>` once listening and stops on SIGTERM or SIGINT. The API key, if any, comes from
$LLMOPT_API_KEY (a command line is readable by every user of the machine). Use one thread per core and
as many slots (--np) as the concurrency you test; --ctx is split across slots.
"""

import argparse
import os
import signal
import threading

API_KEY_ENV = "LLMOPT_API_KEY"  # options.API_KEY_ENV, spelled out: this script imports nothing of llmopt


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="path of a .gguf file")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8102)
    ap.add_argument("--np", type=int, default=16, help="parallel slots")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--ctx", type=int, default=16384, help="total context, split across slots")
    ap.add_argument("--batch", type=int, default=2048, help="most tokens a step (llama.cpp's n_batch)")
    ap.add_argument("--alias", default="SmolLM2-135M-Instruct", help="model name served in /v1/models")
    ap.add_argument("--no-cache-prompt", action="store_true", help="no reuse of a slot's cached prefix")
    ap.add_argument("--draft-max", type=int, default=0, help="most tokens speculated a step")
    ap.add_argument("--spec-ngram-size", type=int, default=0, help="n-gram lookup speculation, n-gram length")
    ap.add_argument("--spec-draft", help="draft-model speculation: the draft's .gguf")
    return ap.parse_args()


def speculation(p, a: argparse.Namespace, xlc) -> None:
    kinds = xlc.common_speculative_type
    if a.spec_ngram_size:
        p.speculative.types = [kinds.COMMON_SPECULATIVE_TYPE_NGRAM_SIMPLE]
        p.speculative.ngram_simple.size_n = a.spec_ngram_size
        p.speculative.ngram_simple.size_m = a.draft_max
    elif a.spec_draft:
        p.speculative.types = [kinds.COMMON_SPECULATIVE_TYPE_DRAFT_SIMPLE]
        p.speculative.draft.mparams.path = a.spec_draft
    if a.draft_max:
        p.speculative.draft.n_max = a.draft_max


def params(a: argparse.Namespace, xlc):
    p = xlc.CommonParams()
    p.model.path = a.model
    p.hostnames = [a.host]
    p.port = a.port
    p.n_parallel = a.np
    p.cont_batching = True
    p.n_ctx = a.ctx
    p.n_batch = a.batch
    p.n_ubatch = min(a.batch, 512)  # llama.cpp's default physical batch, never above the logical one
    p.cache_prompt = not a.no_cache_prompt
    p.cpuparams.n_threads = a.threads
    p.cpuparams_batch.n_threads = a.threads
    p.offline = True
    p.endpoint_metrics = True
    if key := os.environ.get(API_KEY_ENV):
        p.api_keys = [key]
    try:
        p.model_alias = {a.alias} if isinstance(p.model_alias, (list, set)) else a.alias
    except Exception as exc:  # the attribute's type differs between xllamacpp releases
        print("model alias not set:", exc, flush=True)
    speculation(p, a, xlc)
    return p


def main() -> None:
    a = parse_args()
    import xllamacpp as xlc

    server = xlc.Server(params(a, xlc))
    print(f"READY http://{a.host}:{a.port}/v1", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    stop.wait()
    del server


if __name__ == "__main__":
    main()

"""`llmopt serve` on llmopt's own engine as a user runs it (a subprocess): --dry-run prints the engine
config the flags make, without loading a model."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import llmopt


@pytest.mark.slow  # a CLI process, seconds
def test_dry_run_shows_the_budget_and_the_sharing_switch():
    result = llmopt("serve", "--dry-run", "--max-num-batched-tokens", "2048", "--no-inflight-prefix-sharing")
    assert result.returncode == 0, result.stderr
    assert "max_num_batched_tokens=2048" in result.stdout and "inflight_prefix_sharing=False" in result.stdout
    default = llmopt("serve", "--dry-run")
    assert default.returncode == 0, default.stderr
    assert "max_num_batched_tokens=512" in default.stdout and "inflight_prefix_sharing=True" in default.stdout
    assert "dtype='auto'" in default.stdout  # each checkpoint in its own format, as vLLM's default
    wide = {**os.environ, "COLUMNS": "400"}  # one option a line, so the help reads as one string
    help_text = subprocess.run(
        [sys.executable, "-m", "llmopt.cli", "serve", "--help"], capture_output=True, text=True, env=wide
    ).stdout
    [dtype_row] = [line for line in help_text.splitlines() if "--dtype " in line and "kv-cache" not in line]
    assert "auto (default)" in dtype_row and "float32: the exact reference" in dtype_row
    assert "[default: auto]" in dtype_row


@pytest.mark.slow  # CLI processes, seconds
def test_kv_cache_dtype_reaches_the_engine_config_and_a_bogus_one_is_a_usage_error():
    result = llmopt("serve", "--dry-run", "--kv-cache-dtype", "int8")
    assert result.returncode == 0, result.stderr
    assert "kv_cache_dtype='int8'" in result.stdout
    bogus = llmopt("serve", "--dry-run", "--kv-cache-dtype", "bogus")
    assert bogus.returncode == 2
    assert "--kv-cache-dtype must be one of auto, int8, not 'bogus'" in bogus.stdout + bogus.stderr
    assert "Traceback" not in bogus.stdout + bogus.stderr


def test_the_engine_configs_defaults_are_the_serve_options():
    """`LLM(model)` runs as `llmopt serve model` does: every option the engine takes defaults alike."""
    import dataclasses

    from llmopt.engine.config import EngineConfig
    from llmopt.engine_servers.options import ENGINE, ServeOptions

    serve = ServeOptions().part(ENGINE)
    engine = {f.name: f.default for f in dataclasses.fields(EngineConfig)}
    assert serve == {name: engine[name] for name in serve}

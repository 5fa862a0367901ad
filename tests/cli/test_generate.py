"""The CLI as a user runs it: a subprocess, real output, real exit codes."""

from __future__ import annotations

import pytest

from tests.conftest import llmopt


def test_generate_prints_the_answer_and_speed(model_dir):
    result = llmopt("generate", "What is the capital of France?", "--chat", "--max-tokens", "12")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip()  # the Q4_1 answer is no "Paris"; tests/server/test_app.py checks fp32's
    assert "tok/s" in result.stderr
    # the default: the GGUF's own blocks, and the line whole (its [reason] is no console markup)
    assert (
        "--dtype auto: weights " in result.stderr
        and "[the GGUF file's own quantized blocks]" in result.stderr
    )


@pytest.mark.slow
def test_generate_with_a_bad_model_is_one_line():
    result = llmopt("generate", "hi", "--model", "/no/such/model")
    assert result.returncode == 1
    assert "model not found" in result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_generate_with_bad_sampling_is_one_line():
    result = llmopt("generate", "hi", "--max-tokens", "0")
    assert result.returncode == 1 and "max_tokens must be at least 1" in result.stderr
    assert "Traceback" not in result.stderr

"""`llmopt cost` as a user runs it: the price list, a request shape over several turns with a cached
share, and a finished bench run priced request by request (a synthetic run folder: no model)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from llmopt.pricing import load_pricing
from tests.run_folders import FakePoint, write_run


def cost(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "llmopt.cli", "cost", *args], capture_output=True, text=True, timeout=120
    )


def rows(output: str, name: str) -> list[list[str]]:
    """Every printed table row whose first cell is `name`, as its cells: a cell folded over several
    lines (the row's following lines, with an empty first cell) is joined back with spaces."""
    found, current = [], None
    for line in output.splitlines():
        cells = [c.strip() for c in line.split("│")[1:-1]]
        if not cells:
            current = None
        elif cells[0] == name:
            current = cells
            found.append(current)
        elif current is not None and cells[0] == "" and len(cells) == len(current):
            for i, piece in enumerate(cells):
                current[i] = f"{current[i]} {piece}".strip()
        else:
            current = None
    assert found, f"no row {name!r} in:\n{output}"
    return found


def row(output: str, name: str) -> str:
    """The first row named `name`, its cells joined by ' | '."""
    return " | ".join(rows(output, name)[0])


def text(output: str) -> str:
    """The output with every run of spaces and line breaks as one space: titles wrapped to a table's
    width read whole."""
    return " ".join(output.split())


@pytest.mark.slow
def test_list_prints_every_pricing_model_with_its_date():
    result = cost("--list")
    assert result.returncode == 0, result.stderr
    for m in load_pricing():
        assert m.name in result.stdout
        assert m.date in row(result.stdout, m.name)
    assert "in $0.88, out $0.88 per 1M tokens" in row(result.stdout, "together/Llama-3.3-70B-Instruct-Turbo")
    terms = "$80/month for 1,000 requests/day, 30/min, at most 16,384 in / 4,096 out tokens per request"
    assert terms in row(result.stdout, "oxlo/pro")


@pytest.mark.slow
def test_a_conversation_priced_across_providers_with_the_answer():
    result = cost("--prompt-tokens", "2000", "--output-tokens", "300", "--turns", "10", "--requests", "100")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "2,000 new prompt + 300 output tokens per turn, 10 turns" in text(out)
    # Together's Llama 3.3 70B: prompts 2000 * 55 + 300 * 45 = 123,500 tokens, output 3,000, at $0.88 / 1M:
    # $0.1113 a conversation, $11.1320 for 100 of them
    together = row(out, "together/Llama-3.3-70B-Instruct-Turbo")
    assert "$0.1113" in together and "$11.1320" in together
    # Oxlo Pro caps prompts at 16K tokens: turn 8 sends 8 * 2000 + 7 * 300 = 18,100
    assert "18,100 prompt tokens > the 16,384 cap (7 of 10 turns fit)" in row(out, "oxlo/pro")
    assert "is the cheapest that serves every request" in out and "x less than" in out
    assert "Llama 3.3 70B: deepinfra/Llama-3.3-70B-Instruct-Turbo is the cheapest" in out
    assert "Break-even at 2,000 new prompt + 300 output tokens per turn" in text(out)
    # DeepInfra's Llama against Pro: cheaper from 17 turns, but Pro's 16K cap stops at 7
    bill, break_even = rows(out, "deepinfra/Llama-3.3-70B-Instruct-Turbo")
    assert "never within its caps (7 turns)" in break_even


@pytest.mark.slow
def test_a_cached_share_lowers_a_cached_price_only():
    plain = cost("--prompt-tokens", "10000", "--output-tokens", "100", "--requests", "1000")
    cached = cost(
        "--prompt-tokens", "10000", "--output-tokens", "100", "--requests", "1000", "--cached-fraction", "0.9"
    )
    assert plain.returncode == cached.returncode == 0, cached.stderr
    # DeepSeek's API: 10,000 * 0.28 + 100 * 0.42 per 1M = $0.002842; 90 % at 0.028: 9000 * 0.028 + 1000 *
    # 0.28 + 100 * 0.42 = $0.000574
    assert "$0.002842" in row(plain.stdout, "deepseek/deepseek-chat")
    assert "$0.000574" in row(cached.stdout, "deepseek/deepseek-chat")
    # Groq has no cached price: the same either way
    assert "$0.005979" in row(plain.stdout, "groq/llama-3.3-70b-versatile")
    assert "$0.005979" in row(cached.stdout, "groq/llama-3.3-70b-versatile")


@pytest.mark.parametrize(
    "args, message",
    [
        ((), "give --prompt-tokens and --output-tokens"),
        (("--prompt-tokens", "1", "--output-tokens", "1", "--cached-fraction", "2"), "--cached-fraction"),
        (("--prompt-tokens", "1", "--output-tokens", "1", "--utilisation", "0"), "--utilisation"),
        (("--prompt-tokens", "1", "--output-tokens", "1", "--turns", "0"), "--turns"),
    ],
)
@pytest.mark.slow
def test_bad_options_are_one_line_errors(args, message):
    result = cost(*args)
    assert result.returncode == 1 and message in result.stderr and "Traceback" not in result.stderr


PRICES = """
[[model]]
name = "tok"
kind = "token"
input_per_1m = 1.0
cached_input_per_1m = 0.5
output_per_1m = 2.0

[[model]]
name = "small-plan"
kind = "plan"
per_month = 30
requests_per_day = 100
max_input_tokens = 2000

[[model]]
name = "gpu"
kind = "gpu-hour"
per_hour = 36
"""


@pytest.mark.slow
def test_a_run_is_priced_request_by_request(tmp_path: Path):
    prices = tmp_path / "prices.toml"
    prices.write_text(PRICES)
    # 20 requests of 1,000 prompt (400 cached) + 100 output tokens, 2 req/s, all within the SLO
    run = write_run(tmp_path / "one", [FakePoint(20, 0.1, 10.0, 1000, 100, 400)], slo="ttft=500ms")
    result = cost("--run", str(run), "--pricing", str(prices))
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "one / local: 20 requests, 1,000 prompt (40% cached) + 100 output tokens per request" in text(out)
    # (600 * 1.0 + 400 * 0.5 + 100 * 2.0) / 1e6 = $0.001 a request, $0.02 for the run's 20
    assert "$0.001000" in row(out, "tok") and "$0.0200" in row(out, "tok")
    # $30 a month for 3,000 requests: $0.01 each; $36 an hour at 2 req/s: $0.005 each
    assert "$0.0100" in row(out, "small-plan") and "$0.005000" in row(out, "gpu")
    assert "self-hosted at 2.00 req/s" in text(out)
    assert "tok is the cheapest that serves every request: $0.001000 per request, 5.0x less than gpu" in out


@pytest.mark.slow
def test_a_multi_turn_run_is_priced_per_conversation(tmp_path: Path):
    prices = tmp_path / "prices.toml"
    prices.write_text(PRICES)
    # 5 sessions of 4 turns of 600 new + 100 output tokens: prompts 600, 1,300, 2,000, 2,700
    run = write_run(tmp_path / "multi", [FakePoint(20, 0.1, 10.0, 600, 100, turns=4)])
    result = cost("--run", str(run), "--pricing", str(prices))
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "20 requests in 5 conversations" in text(out) and "$ / conversation" in text(out)
    # per conversation: (600 + 1300 + 2000 + 2700) * 1.0 + 400 * 2.0 per 1M = $0.0074
    assert "$0.007400" in row(out, "tok")
    # the plan's 2,000-token cap refuses every fourth turn
    assert "2,700 prompt tokens > the 2,000 cap (15 of 20 turns fit)" in row(out, "small-plan")
    # no SLO set: self-hosting at the busiest point
    assert "no SLO" in text(out)


@pytest.mark.slow
def test_a_folder_that_is_no_run(tmp_path: Path):
    result = cost("--run", str(tmp_path))
    assert result.returncode == 1 and "is not a bench run" in result.stderr

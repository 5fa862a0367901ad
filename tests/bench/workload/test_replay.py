"""The replay workload: Mooncake-format traces read (bad lines named), prompts whose shared hash ids are
shared text, and requests sent at the trace's times scaled by the replay speed (scripted endpoint)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from llmopt.bench.bench_error import BenchError
from llmopt.bench.sweep.bench_config import BenchConfig
from llmopt.bench.sweep.recipe import load_recipe
from llmopt.bench.sweep.sweep import run_sweep
from llmopt.bench.workload import count_tokens, replay_prompts
from llmopt.bench.workload.trace import TraceEntry, read_trace, send_times
from llmopt.checkpoints import load_tokenizer
from llmopt.cli import app

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "mooncake_sample.jsonl"
SHIPPED = Path(__file__).resolve().parents[3] / "recipes" / "traces" / "mooncake-sample.jsonl"


@pytest.fixture(scope="module")
def tokenizer(tokenizer_dir):
    return load_tokenizer(tokenizer_dir)


def write_trace(path: Path, lines: list[dict | str]) -> Path:
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return path


def line(timestamp: float, input_length: int = 8, output_length: int = 2, hash_ids=None) -> dict:
    out = {"timestamp": timestamp, "input_length": input_length, "output_length": output_length}
    return out if hash_ids is None else {**out, "hash_ids": hash_ids}


def test_mooncakes_own_trace_lines_are_read():
    entries = read_trace(SAMPLE)
    assert entries[2] == TraceEntry(3052.0, 7234, 794, [0, *range(28, 42)])
    assert send_times(entries) == [0.0, 0.0, 3.052, 3.052]
    shipped = read_trace(SHIPPED)
    assert len(shipped) == 16 and send_times(shipped)[0] == 0.0  # its first timestamp is 600 ms


@pytest.mark.parametrize(
    ("bad", "says"),
    [
        ("{not json", "not JSON"),
        ({"timestamp": 5, "input_length": 8}, 'missing "output_length"'),
        (line(-1), '"timestamp" is milliseconds'),
        (line(5, input_length=0), '"input_length" is a number of tokens'),
        (line(5, output_length=2.5), '"output_length" is a number of tokens'),
        (line(5, input_length=True), '"input_length" is a number of tokens'),
        (line(5, hash_ids="0,1"), '"hash_ids" is a list of whole numbers'),
        ('{"timestamp": NaN, "input_length": 8, "output_length": 2}', '"timestamp" is milliseconds'),
        (line(50), "is before the previous line's 100"),  # timestamps going backwards
        ("[1, 2]", "a line is a JSON object"),
    ],
)
def test_a_bad_line_is_an_error_naming_the_file_and_line(tmp_path, bad, says):
    path = write_trace(tmp_path / "trace.jsonl", [line(0), "", line(100), bad])
    with pytest.raises(ValueError, match=f"trace.jsonl:4: .*{says}"):
        read_trace(path)
    config = BenchConfig.from_settings(endpoint="http://127.0.0.1:1/v1", workload="replay", trace=str(path))
    with pytest.raises(BenchError, match=f"trace.jsonl:4: .*{says}"):
        config.validate()  # before any server starts


def test_the_cli_names_the_bad_line_without_a_traceback(tmp_path):
    path = write_trace(tmp_path / "trace.jsonl", [line(0), line(5, output_length=-3)])
    args = ["bench", "--endpoint", "http://127.0.0.1:1/v1", "--workload", "replay", "--trace", str(path)]
    result = CliRunner().invoke(app, [*args, "--results-dir", str(tmp_path)])
    assert result.exit_code in (1, 2) and "trace.jsonl:2" in result.output
    assert "Traceback" not in result.output


def test_replay_settings_are_checked():
    base = {"endpoint": "http://127.0.0.1:1/v1"}
    with pytest.raises(BenchError, match="needs --trace"):
        BenchConfig.from_settings(**base, workload="replay").validate()
    with pytest.raises(BenchError, match="not --concurrency"):
        BenchConfig.from_settings(**base, workload="replay", trace=str(SAMPLE), concurrencies=[2]).validate()
    with pytest.raises(BenchError, match="for the replay workload"):
        BenchConfig.from_settings(**base, replay_speeds=[2.0]).validate()
    with pytest.raises(BenchError, match="--replay-speed must be positive"):
        BenchConfig.from_settings(
            **base, workload="replay", trace=str(SAMPLE), replay_speeds=[0.0]
        ).validate()


def common_prefix(a: str, b: str) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def test_requests_sharing_leading_hash_ids_share_their_prompt_prefix(tokenizer):
    entries = [
        TraceEntry(0, 48, 4, [0, 1, 2]),
        TraceEntry(0, 40, 4, [0, 1, 5]),  # its last block cut to 8 tokens
        TraceEntry(0, 32, 4, [0, 1]),  # exactly the two shared blocks
        TraceEntry(0, 48, 4, [7, 8, 9]),
        TraceEntry(0, 40, 4, [0]),  # 24 tokens past its one block: text of its own
    ]
    a, b, two, other, own = replay_prompts(tokenizer, entries, block_size=16, seed=3)
    assert a.prompt.startswith(two.prompt) and b.prompt.startswith(two.prompt)
    shared = len(two.prompt)
    assert a.prompt[shared : shared + 20] != b.prompt[shared : shared + 20]
    assert common_prefix(a.prompt, other.prompt) < 10  # no id in common: no prefix in common
    assert own.prompt[: common_prefix(own.prompt, a.prompt)].count(" ") >= 15  # block 0, about 16 words
    assert [r.max_tokens for r in (a, b, two, other, own)] == [4] * 5
    # The word tokenizer here tokenizes the blocks apart as together: each prompt has its exact length.
    assert [count_tokens(tokenizer, r.prompt) for r in (a, b, two, other, own)] == [48, 40, 32, 48, 40]
    assert all(r.prompt_tokens == count_tokens(tokenizer, r.prompt) for r in (a, b, two, other, own))
    again = replay_prompts(tokenizer, entries, block_size=16, seed=4)  # another point: other texts
    assert common_prefix(again[0].prompt, a.prompt) < 10
    assert replay_prompts(tokenizer, entries, block_size=16, seed=3)[0] == a  # seeded


def test_requests_are_sent_at_the_traces_times_scaled_by_the_speed(openai_endpoint, tokenizer, tmp_path):
    offsets_ms = [0, 100, 300, 300, 600, 900]
    trace = write_trace(
        tmp_path / "trace.jsonl",
        [line(1000 + t, 8, n, [0, i]) for i, (t, n) in enumerate(zip(offsets_ms, [1, 2, 3, 4, 5, 6]))],
    )
    config = BenchConfig.from_settings(
        endpoint=openai_endpoint.url,
        api="completions",
        workload="replay",
        trace=str(trace),
        trace_block_size=4,
        replay_speeds=[2.0],
        num_requests=5,  # the first five of the trace's six
        warmup=0,
    )
    [point] = run_sweep(config, tmp_path / "run", False, tokenizer)
    assert point.load == "replay-speed=2x" and point.replay_speed == 2.0
    assert point.requests == point.successful == 5
    records = [json.loads(x) for x in (tmp_path / "run" / "requests.jsonl").read_text().splitlines()]
    starts = [r["start"] for r in sorted(records, key=lambda r: r["index"])]
    for start, due in zip(starts, [t / 1000 / 2 for t in offsets_ms]):
        # At twice the trace's pace: never early, and late only by what a busy machine delays a wake-up
        # (at the trace's own pace the fifth would be 0.3 s late).
        assert due - 0.005 <= start < due + 0.1, (starts, due)
    assert sorted(body["max_tokens"] for _, body in openai_endpoint.seen) == [1, 2, 3, 4, 5]
    prompts = [body["prompt"] for _, body in openai_endpoint.seen]
    assert len({p.split()[0] for p in prompts}) == 1  # block 0 leads every prompt


def test_a_recipe_replays_a_trace_at_several_speeds(tmp_path):
    recipe = tmp_path / "replay.toml"
    recipe.write_text(
        '[target]\nendpoint = "http://127.0.0.1:1/v1"\n'
        f'[workload]\nkind = "replay"\ntrace = "{SHIPPED}"\ntrace_block_size = 64\n'
        "[load]\nreplay_speed = [1, 2.5]\nnum_requests = 100\n"
    )
    config = load_recipe(recipe)
    config.validate()
    assert (config.workload.trace_block_size, config.load.replay_speeds) == (64, [1, 2.5])
    points = config.load_points()
    assert [p.label for p in points] == ["replay-speed=1x", "replay-speed=2.5x"]
    assert points[1].num_requests == 16  # the whole trace, no more
    assert points[1].arrivals(3) == pytest.approx([0.0, 0.6 / 2.5, 0.75 / 2.5])


def test_a_replay_against_the_live_server_counts_what_it_served(server, tmp_path):
    """The shipped trace's first 4 requests (about 200 tokens each, 2 sharing its two leading blocks
    with an earlier one): counts equal the server's /metrics, and shared blocks come from its cache."""
    from tests.conftest import API_KEY

    before = server.metrics()
    command = [sys.executable, "-m", "llmopt.cli", "bench", "--endpoint", server.url + "/v1"]
    command += ["--api-key", API_KEY, "--results-dir", str(tmp_path), "--run-name", "replay"]
    command += ["--workload", "replay", "--trace", str(SHIPPED), "--trace-block-size", "64"]
    command += ["--replay-speed", "2", "--num-requests", "4", "--warmup", "0"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    after = server.wait_idle()
    assert result.returncode == 0, result.stderr + result.stdout
    [point] = json.loads((tmp_path / "replay" / "summary.json").read_text())["points"]
    names = ("request_success_total", "generation_tokens_total", "prompt_tokens_total")
    grew = {name: after[f"llmopt:{name}"] - before[f"llmopt:{name}"] for name in names}
    assert point["successful"] == grew["request_success_total"] == 4
    assert point["output_tokens"] == grew["generation_tokens_total"] == 24 + 24 + 16 + 16
    assert point["prompt_tokens"] == grew["prompt_tokens_total"] and point["token_source"] == "usage"
    assert point["cached_tokens"] >= 64  # requests 3 and 4 lead with blocks 0 and 1, as request 2


def test_the_goodput_search_varies_the_replay_speed():
    config = BenchConfig.from_settings(
        endpoint="http://127.0.0.1:1/v1", workload="replay", trace=str(SHIPPED), goodput_search="ttft=1s"
    )
    config.validate()
    search = config.search()
    assert (search.start, search.integer) == (1.0, False)
    probe = config.search_point(3.0)
    assert probe.label == "replay-speed=3x" and probe.arrivals(2) == pytest.approx([0.0, 0.2])

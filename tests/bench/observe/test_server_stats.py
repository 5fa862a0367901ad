"""Reading a server's Prometheus /metrics page: parsing, scraping over HTTP, the speculation delta."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator

import pytest

from llmopt.bench.observe.server_stats import parse_metrics, scrape, scrape_spec_counters, spec_delta
from llmopt.bench.servers.launcher import free_port

# The shape of an llmopt server's page: labelled gauges and counters, a histogram, a per-position gauge.
PAGE = """\
# HELP llmopt:num_requests_running Requests in the running batch.
# TYPE llmopt:num_requests_running gauge
llmopt:num_requests_running{model_name="smollm2-135m"} 2.0
# HELP llmopt:kv_blocks_used KV cache blocks in use.
# TYPE llmopt:kv_blocks_used gauge
llmopt:kv_blocks_used{model_name="smollm2-135m"} 17.0
# HELP llmopt:prompt_tokens_total Prompt tokens of finished requests.
# TYPE llmopt:prompt_tokens_total counter
llmopt:prompt_tokens_total{model_name="smollm2-135m"} 1234.0
# HELP llmopt:spec_decode_num_drafts_total Speculative verification steps.
# TYPE llmopt:spec_decode_num_drafts_total counter
llmopt:spec_decode_num_drafts_total{model_name="smollm2-135m"} 40.0
# HELP llmopt:spec_decode_num_draft_tokens_total Proposed tokens.
# TYPE llmopt:spec_decode_num_draft_tokens_total counter
llmopt:spec_decode_num_draft_tokens_total{model_name="smollm2-135m"} 120.0
# HELP llmopt:spec_decode_num_accepted_tokens_total Accepted proposed tokens.
# TYPE llmopt:spec_decode_num_accepted_tokens_total counter
llmopt:spec_decode_num_accepted_tokens_total{model_name="smollm2-135m"} 60.0
# HELP llmopt:spec_decode_acceptance_rate_by_position Share of proposals accepted at each position.
# TYPE llmopt:spec_decode_acceptance_rate_by_position gauge
llmopt:spec_decode_acceptance_rate_by_position{model_name="smollm2-135m",position="0"} 0.75
llmopt:spec_decode_acceptance_rate_by_position{model_name="smollm2-135m",position="1"} 0.5
# HELP llmopt:time_to_first_token_seconds Time to first token.
# TYPE llmopt:time_to_first_token_seconds histogram
llmopt:time_to_first_token_seconds_bucket{le="0.1",model_name="smollm2-135m"} 3.0
llmopt:time_to_first_token_seconds_bucket{le="+Inf",model_name="smollm2-135m"} 5.0
llmopt:time_to_first_token_seconds_count{model_name="smollm2-135m"} 5.0
llmopt:time_to_first_token_seconds_sum{model_name="smollm2-135m"} 0.9
"""


def test_parse_metrics_keys_samples_by_their_own_names():
    values = parse_metrics(PAGE)
    assert values["llmopt:num_requests_running"] == 2
    assert values["llmopt:kv_blocks_used"] == 17
    assert values["llmopt:prompt_tokens_total"] == 1234  # a counter keeps its _total
    assert "llmopt:prompt_tokens" not in values
    assert values["llmopt:spec_decode_acceptance_rate_by_position"] == 0.5  # the last label set wins
    assert values["llmopt:time_to_first_token_seconds_count"] == 5
    assert values["llmopt:time_to_first_token_seconds_bucket"] == 5  # +Inf, the last bucket
    assert all(isinstance(v, float) for v in values.values())


def test_parse_metrics_of_an_empty_page_and_of_garbage():
    assert parse_metrics("") == {}
    with pytest.raises(ValueError):
        parse_metrics("<html>Not Found</html>\n")


class Page(http.server.BaseHTTPRequestHandler):
    body = PAGE

    def do_GET(self) -> None:  # noqa: N802 - the name http.server calls
        found = self.path == "/metrics"
        data = (self.body if found else "Not Found").encode()
        self.send_response(200 if found else 404)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def metrics_server() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), Page)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_scrape_spec_counters_over_http(metrics_server):
    assert scrape(metrics_server)["llmopt:kv_blocks_used"] == 17
    assert scrape_spec_counters(metrics_server + "/v1") == {
        "drafts": 40,
        "draft_tokens": 120,
        "accepted_tokens": 60,
    }


def test_scraping_a_server_without_metrics_gives_nothing(metrics_server):
    assert scrape(metrics_server + "/elsewhere") == {}  # HTTP 404
    assert scrape_spec_counters(f"http://127.0.0.1:{free_port()}/v1") == {}  # refused


def test_a_server_without_speculation_has_no_spec_counters(metrics_server, monkeypatch):
    monkeypatch.setattr(Page, "body", "\n".join(PAGE.splitlines()[:9]) + "\n")
    assert scrape(metrics_server)["llmopt:prompt_tokens_total"] == 1234
    assert scrape_spec_counters(metrics_server + "/v1") == {}


def test_spec_delta_over_a_point():
    before = {"drafts": 40, "draft_tokens": 120, "accepted_tokens": 60}
    after = {"drafts": 50, "draft_tokens": 150, "accepted_tokens": 80}
    assert spec_delta(before, after) == {
        "drafts": 10,
        "draft_tokens": 30,
        "accepted_tokens": 20,
        "acceptance_rate": pytest.approx(20 / 30),
        "mean_acceptance_length": pytest.approx(1 + 20 / 10),
    }
    assert spec_delta({}, after)["drafts"] == 50  # counters the first scrape missed count from zero


def test_spec_delta_without_speculation_is_none():
    assert spec_delta({}, {}) is None
    assert spec_delta({}, {"drafts": 0, "draft_tokens": 0, "accepted_tokens": 0}) is None
    counters = {"drafts": 5, "draft_tokens": 9, "accepted_tokens": 3}
    idle = spec_delta(counters, dict(counters))  # a speculating server that drafted nothing this point
    assert idle["drafts"] == 0 and idle["acceptance_rate"] is None and idle["mean_acceptance_length"] is None

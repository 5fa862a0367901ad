"""The report's plots draw what a reader needs to see: a series of one point as a marker (a line of
one point is invisible), cost per conversation growing with the square of the turns under token prices
and linearly under request prices, and a per-request timeline."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmopt.cost.conversation_shape import ConversationShape
from llmopt.pricing import PricingModel
from llmopt.report import plots
from llmopt.report.runs import load_run
from tests.run_folders import FakePoint, write_run


@pytest.fixture
def figures(monkeypatch) -> list:
    """The matplotlib figures the plot functions make, kept instead of turned into SVG."""
    kept = []
    monkeypatch.setattr(plots, "to_svg", lambda fig: kept.append(fig) or "<svg/>")
    return kept


def test_a_series_of_one_point_is_drawn_as_markers(tmp_path: Path, figures):
    one = load_run(write_run(tmp_path / "one", [FakePoint(1)]))
    plots.latency([one])
    plots.cdfs([one])
    latency, cdf = figures
    assert {line.get_marker() for ax in latency.axes for line in ax.lines} == {"o"}
    assert {line.get_marker() for ax in cdf.axes for line in ax.lines} == {"o"}
    several = load_run(write_run(tmp_path / "several", [FakePoint(10), FakePoint(10, concurrency=4)]))
    plots.latency([several])
    plots.cdfs([several])
    assert {line.get_marker() for ax in figures[2].axes for line in ax.lines} == {"."}
    assert {line.get_marker() for ax in figures[3].axes for line in ax.lines} == {"None"}


def test_cost_per_conversation_against_turns(figures):
    token = PricingModel("tok", "token", input_per_1m=1.0, cached_input_per_1m=0.1, output_per_1m=2.0)
    plan = PricingModel("plan", "plan", per_month=30, requests_per_day=100, max_input_tokens=5000)
    plots.cost_vs_turns([token], [(plan, 0.01)], ConversationShape(1000, 100, 4, 0.5))
    [fig] = figures
    lines = {line.get_label(): line for line in fig.axes[0].lines}
    uncached = lines["tok (per token)"].get_ydata()
    # turn k sends 1100 k - 100 tokens: T turns cost (1100 T (T + 1) / 2 - 100 T + 200 T) / 1e6
    assert uncached[:3] == pytest.approx([1.2e-3, 3.5e-3, 6.9e-3])
    assert "tok, 50% cached" in lines  # what the cached price does, dashed
    flat = lines["plan (plan)"]
    # $0.01 a turn, ending at the cap: turn 5 sends 5,400 > 5,000 tokens, so 4 turns
    assert list(flat.get_xdata()) == [1, 2, 3, 4] and list(flat.get_ydata()) == pytest.approx(
        [0.01, 0.02, 0.03, 0.04]
    )


def test_the_per_request_timeline(tmp_path: Path, figures):
    run = load_run(write_run(tmp_path / "r", [FakePoint(6), FakePoint(8, concurrency=4)]))
    plots.timeline([run])
    [fig] = figures
    [ax] = fig.axes  # one series: its busiest point
    bars = ax.patches
    assert len(bars) == 2 * 8  # each request: its wait for the first token, then its answer
    assert ax.get_title() == "local in 100 concurrency=4"

import pytest

from llmopt.bench.measure.request_metrics import meets_slo, summarize, tpot
from llmopt.bench.schema import RequestRecord
from llmopt.bench.slo import parse_slo


def record(
    ttft: float, e2e: float, out: int, itl: list[float] | None = None, ok: bool = True
) -> RequestRecord:
    return RequestRecord(
        index=0, ttft=ttft, e2e=e2e, output_tokens=out, prompt_tokens=10, itl=itl or [], success=ok
    )


def test_tpot_is_decode_time_per_token_after_the_first():
    assert tpot(record(ttft=0.2, e2e=1.2, out=11)) == pytest.approx(0.1)
    assert tpot(record(ttft=0.2, e2e=0.2, out=1)) is None


def test_summary_by_hand():
    records = [
        record(0.1, 1.1, 11, [0.1] * 10),
        record(0.3, 2.3, 11, [0.2] * 10),
        RequestRecord(index=2, error="HTTP 500: boom", status=500),
    ]
    s = summarize(records, wall_s=4.0, slo=parse_slo("ttft=200ms,tpot=150ms"))
    assert (s["requests"], s["successful"], s["failed"]) == (3, 2, 1)
    assert s["output_throughput"] == pytest.approx(22 / 4)
    assert s["total_token_throughput"] == pytest.approx((22 + 20) / 4)
    assert s["request_throughput"] == pytest.approx(0.5)
    assert s["ttft_ms"]["mean"] == pytest.approx(200) and s["ttft_ms"]["median"] == pytest.approx(200)
    assert s["tpot_ms"]["mean"] == pytest.approx(150)
    assert s["itl_ms"]["p50"] == pytest.approx(150)
    assert s["goodput"] == pytest.approx(1 / 4)  # only the first meets both SLOs
    assert s["slo_attainment"] == pytest.approx(1 / 3)
    assert s["errors"] == ["HTTP 500: boom"]


def test_percentiles_are_configurable():
    records = [record(t / 100, 1.0, 5) for t in range(1, 101)]
    s = summarize(records, 10.0, percentiles=(90, 99.9))
    assert s["ttft_ms"]["p90"] == pytest.approx(900.1, rel=1e-3)
    assert "p99.9" in s["ttft_ms"]


def test_slo_parsing_and_checks():
    assert parse_slo("ttft=500ms, tpot=0.05s,e2e=2000") == {"ttft": 0.5, "tpot": 0.05, "e2e": 2.0}
    with pytest.raises(ValueError, match="bad SLO"):
        parse_slo("latency=1s")
    assert not meets_slo(RequestRecord(index=0), {"ttft": 1.0})  # a failed request never counts


def test_tokens_per_chunk_is_the_clients_tokens_per_decode_step():
    one_each = [
        RequestRecord(index=i, ttft=0.1, itl=[0.01] * 3, e2e=0.13, output_tokens=4, success=True)
        for i in range(2)
    ]
    # a speculating server: 3 chunks carrying 8 tokens (steps that accepted proposals send several)
    spec = [RequestRecord(index=0, ttft=0.1, itl=[0.02, 0.02], e2e=0.14, output_tokens=8, success=True)]
    assert summarize(one_each, wall_s=1.0)["tokens_per_chunk"] == 1.0
    assert summarize(spec, wall_s=1.0)["tokens_per_chunk"] == 8 / 3
    whole = [
        RequestRecord(index=0, ttft=0.5, e2e=0.5, output_tokens=8, success=True)
    ]  # not streamed: no estimate
    assert summarize(whole, wall_s=1.0)["tokens_per_chunk"] is None

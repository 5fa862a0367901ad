"""Synthetic bench run folders, written as the bench writes them (bench/rundir.py,
bench/measure/request_metrics.py), for the tests of `llmopt cost --run` and `llmopt report --fail-if`: no
model and no server needed."""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from llmopt.bench.measure.request_metrics import summarize
from llmopt.bench.rundir import RunDir
from llmopt.bench.schema import PointSummary, RequestRecord, RunSettings
from llmopt.bench.slo import parse_slo


@dataclass
class FakePoint:
    """One load point's requests: `ttft_s` (seconds) per request with +-`noise` relative jitter."""

    requests: int = 40
    ttft_s: float = 0.1
    wall_s: float = 10.0
    prompt_tokens: int = 100
    output_tokens: int = 10
    cached_tokens: int | None = None
    turns: int | None = None  # multi-turn: sessions of this many turns (prompts grow with the history)
    concurrency: int = 1
    server: str = "local"
    noise: float = 0.05
    seed: int = 0
    ttfts: list[float] | None = None  # exact TTFTs instead of jittered ones
    extra: dict | None = None  # more summary fields, e.g. the "repeats" of `--num-runs`

    @property
    def key(self) -> str:
        load = f"concurrency={self.concurrency}"
        return f"{self.server}|prompt={self.prompt_tokens}|output={self.output_tokens}|{load}"

    def records(self) -> list[tuple[RequestRecord, dict]]:
        """(record, extra fields of its requests.jsonl line)."""
        rng = random.Random(self.seed)
        out = []
        for i in range(self.requests):
            ttft = self.ttfts[i] if self.ttfts else self.ttft_s * (1 + self.noise * rng.uniform(-1, 1))
            extra: dict = {"point": self.key}
            prompt = self.prompt_tokens
            if self.turns:
                turn = i % self.turns
                extra.update(session=i // self.turns, turn=turn)
                prompt = (turn + 1) * self.prompt_tokens + turn * self.output_tokens
            record = RequestRecord(
                index=i,
                ttft=ttft,
                itl=[0.01] * (self.output_tokens - 1),
                e2e=ttft + 0.01 * (self.output_tokens - 1),
                prompt_tokens=prompt,
                output_tokens=self.output_tokens,
                cached_tokens=self.cached_tokens,
                status=200,
                success=True,
            )
            out.append((record, extra))
        return out


def write_run(path: Path, points: list[FakePoint], slo: str | None = None) -> Path:
    """A finished run folder holding `points`: requests.jsonl, summary.json and summary.csv."""
    run = RunDir(path)
    summaries = []
    with run.open_records() as f:
        for point in points:
            pairs = point.records()
            for record, extra in pairs:
                f.write(record.to_json(**extra) + "\n")
            summary = summarize([r for r, _ in pairs], point.wall_s, parse_slo(slo))
            summary.update(
                {
                    "key": point.key,
                    "server": point.server,
                    "model": "m",
                    "endpoint": "http://127.0.0.1:1/v1",
                    "prompt_len": point.prompt_tokens,
                    "output_len": point.output_tokens,
                    "load": f"concurrency={point.concurrency}",
                    "concurrency": point.concurrency,
                    "request_rate": None,
                    "server_args": None,
                }
            )
            summary.update(point.extra or {})
            summaries.append(PointSummary.from_json(summary))
    config = {"slo": slo, "workload": "random", "api": "chat"}
    run.write_summaries(summaries, RunSettings(config, started="2026-12-01T12:00:00"))
    return path

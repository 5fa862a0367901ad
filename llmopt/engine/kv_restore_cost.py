"""Whether a prefix found on disk is loaded or computed again: the cheaper of the two, both measured on
this machine, so that a slow disk never makes a request's first token later.

- Reading: seconds per block (open, read, checksum, copy into the pool), from a cold read of probe
  files at start-up (written, synced and dropped from the page cache), then a moving average of the
  loads themselves (a load that came from the page cache makes the next estimate cheaper, one from a
  slow disk dearer).
- Computing: prompt tokens per second of prefill, the fastest the step log has seen (a step's forward
  seconds over its prefill tokens, steps of at least two blocks), seeded by the previous run's figure
  (saved beside the blocks) and the warm-up's prefill. The fastest, not the mean: a step shared with
  decode rows or long contexts reads slower than a prefill is, and an estimate that errs on the fast
  side errs towards recomputing, which is never worse than today.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from llmopt.engine.step_log import StepRecord

# A load's weight in the moving average of read time: the latest load says most about the disk now.
READ_EMA = 0.5
MIN_PREFILL_BLOCKS = 2  # shorter steps are dominated by fixed costs, not by the tokens


@dataclass
class RestoreCost:
    block_size: int
    read_s_per_block: float | None = None
    prefill_tokens_per_s: float | None = None

    def observe_read(self, blocks: int, seconds: float) -> None:
        if blocks <= 0:
            return
        latest = seconds / blocks
        old = self.read_s_per_block
        self.read_s_per_block = latest if old is None else READ_EMA * latest + (1 - READ_EMA) * old

    def observe_prefill(self, tokens: int, seconds: float) -> None:
        if tokens < MIN_PREFILL_BLOCKS * self.block_size or seconds <= 0:
            return
        self.prefill_tokens_per_s = max(self.prefill_tokens_per_s or 0.0, tokens / seconds)

    def observe_step(self, record: StepRecord) -> None:
        """A step log observer (step_log.py): every step's prefill, timed."""
        if record.prefill_tokens:
            self.observe_prefill(record.prefill_tokens, record.forward_s)

    def prefill_s_per_block(self) -> float | None:
        rate = self.prefill_tokens_per_s
        return None if not rate else self.block_size / rate

    def worth_loading(self) -> bool:
        """Reading a block is measured to be faster than computing it (False while either is unknown)."""
        compute = self.prefill_s_per_block()
        return self.read_s_per_block is not None and compute is not None and self.read_s_per_block < compute

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self)))

    def seed_from(self, path: Path) -> None:
        """The prefill rate a previous run measured (the disk is probed afresh at every start)."""
        try:
            saved = json.loads(path.read_text())
        except (OSError, ValueError):
            return
        if not isinstance(saved, dict) or saved.get("block_size") != self.block_size:
            return
        rate = saved.get("prefill_tokens_per_s")
        if isinstance(rate, (int, float)) and rate > 0:
            self.prefill_tokens_per_s = max(self.prefill_tokens_per_s or 0.0, float(rate))

"""run_oneshot's workaround for llm-compressor's AWQ on a machine without a GPU: pinning is skipped
during that oneshot call only, and llm-compressor's class is as it was afterwards. oneshot and the
model are stand-ins (no model, no calibration): what is checked is the state around the call."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmopt.quant.quantize import QuantizeConfig, run_oneshot


class FakeConfig:
    _name_or_path = ""

    def save_pretrained(self, folder: str) -> None:
        (Path(folder) / "config.json").write_text("{}")


class FakeModel:
    config = FakeConfig()

    def save_pretrained(self, out: Path, save_compressed: bool) -> None:
        (out / "model.safetensors").write_bytes(b"")


class FakeTokenizer:
    def save_pretrained(self, out: Path) -> None:
        (out / "tokenizer.json").write_text("{}")


@pytest.mark.parametrize("fails", [False, True])
@pytest.mark.slow
def test_awq_skips_pinning_for_the_oneshot_call_only(tmp_path: Path, monkeypatch, fails: bool):
    import llmcompressor
    import torch
    import transformers
    from llmcompressor.pipelines.cache import IntermediatesCache

    original = IntermediatesCache.pin_memory
    during = []

    def oneshot(**kwargs) -> None:
        during.append(IntermediatesCache.pin_memory)
        assert IntermediatesCache.pin_memory(object(), 0) is None  # a no-op, whatever the instance
        if fails:
            raise RuntimeError("calibration failed")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(llmcompressor, "oneshot", oneshot)
    monkeypatch.setattr(
        transformers.AutoModelForCausalLM, "from_pretrained", classmethod(lambda cls, *a, **k: FakeModel())
    )
    config = QuantizeConfig(model=None, out=tmp_path / "out", method="awq", calib_samples=1, seq_len=16)
    samples = [[1] * 16]
    if fails:
        with pytest.raises(RuntimeError, match="calibration failed"):
            run_oneshot(tmp_path, tmp_path, FakeTokenizer(), samples, config, 32)
    else:
        run_oneshot(tmp_path, tmp_path, FakeTokenizer(), samples, config, 32)
    assert during and during[0] is not original
    assert IntermediatesCache.pin_memory is original

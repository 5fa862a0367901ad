"""What each quantization method means to llm-compressor: its bit widths, group sizes, calibration
pipeline and default sample count, and the modifier recipe built from them.

llm-compressor's default pipeline traces the model and calibrates it layer by layer; on this 2-core CPU
that took over 30 minutes for GPTQ on a 135M model. The "basic" pipeline runs the calibration samples
through the whole model once and compresses every layer at the end: about a minute here. AWQ keeps the
sequential pipeline (its grid search needs it) and so gets a smaller default calibration set.
"""

from __future__ import annotations

from pathlib import Path

METHODS = ("gptq", "awq", "int8")
BITS = {"gptq": (4, 8), "awq": (4,), "int8": (8,)}
# Default group size at 4 bits: the first of these that divides every quantized layer's input size.
# AWQ prefers small groups: on SmolLM2-135M, group 32 gave perplexity +10.5 % against +16.9 % at group 64
# (8 samples each); GPTQ's error feedback does well at 64 (+7.8 %).
GROUP_SIZES = {"gptq": (128, 64, 32), "awq": (32, 64, 128), "int8": (128, 64, 32)}
# GPTQ and INT8 calibrate in one pass over the whole model ("basic"): about a minute here instead of
# 30. AWQ's scale search needs each layer's inputs as the layers before it were smoothed: sequential.
PIPELINES = {"gptq": "basic", "awq": "sequential", "int8": "basic"}
# AWQ's grid search runs every layer 20 times over the samples: 8 x 256 tokens take about 3 minutes here.
CALIBRATION_SAMPLES = {"gptq": 64, "awq": 8, "int8": 8}


def quantized_input_sizes(model_dir: Path) -> dict[str, int]:
    """Input size of each kind of linear layer llm-compressor quantizes, from the checkpoint's config."""
    from llmopt.engine.models.model_config import checkpoint_fields

    config = checkpoint_fields(model_dir)
    hidden = config["hidden_size"]
    head_dim = config.get("head_dim") or hidden // config["num_attention_heads"]
    return {
        "q/k/v/gate/up_proj": hidden,
        "o_proj": config["num_attention_heads"] * head_dim,
        "down_proj": config["intermediate_size"],
    }


def choose_group_size(method: str, bits: int, group_size: int | None, model_dir: Path) -> int | None:
    """The group size to use (None = per channel); raises before any work when it cannot work."""
    sizes = quantized_input_sizes(model_dir)
    valid = [g for g in GROUP_SIZES[method] if all(size % g == 0 for size in sizes.values())]
    if group_size is None:
        if bits == 8:
            return None
        if not valid:
            raise ValueError(f"no group size of 128, 64 or 32 divides the layer input sizes {sizes}")
        return valid[0]
    if group_size < 1 or any(size % group_size for size in sizes.values()):
        sizes_text = ", ".join(f"{name} {size}" for name, size in sizes.items())
        raise ValueError(
            f"--group-size {group_size} must divide every quantized layer's input size "
            f"({sizes_text}); valid choices include {', '.join(map(str, valid)) or 'none of 128/64/32'}"
        )
    return group_size


def recipe(method: str, bits: int, group_size: int | None):
    """llm-compressor's modifier(s) for `method`: one modifier, or AWQ's smoothing then rounding."""
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme

    weights = QuantizationArgs(
        num_bits=bits,
        type="int",
        # At 4 bits a zero point per group loses much less on small models (GPTQ on SmolLM2-135M,
        # group 64: perplexity +10 % with zero points, +28 % symmetric); 8 bits needs none.
        symmetric=bits == 8,
        strategy="channel" if group_size is None else "group",
        group_size=group_size,
    )
    groups = {"group_0": QuantizationScheme(targets=["Linear"], weights=weights)}
    if method == "gptq":
        from llmcompressor.modifiers.quantization import GPTQModifier

        return GPTQModifier(config_groups=groups, ignore=["lm_head"])
    from llmcompressor.modifiers.quantization import QuantizationModifier

    quantization = QuantizationModifier(config_groups=groups, ignore=["lm_head"])
    if method == "awq":
        from llmcompressor.modifiers.transform.awq import AWQModifier

        return [AWQModifier(), quantization]  # AWQ smooths activation outliers, then weights are rounded
    return quantization

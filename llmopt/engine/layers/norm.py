"""RMSNorm, compiled or through PyTorch."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, compiled: bool) -> torch.Tensor:
    # F.rms_norm runs six ATen ops on CPU (about 17 us for one row here); the compiled kernel one (5 us).
    if compiled:
        return torch.ops.llmopt.rms_norm(x, weight, eps)
    return F.rms_norm(x, weight.shape, weight, eps)

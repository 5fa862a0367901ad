"""The token embedding of a GGUF model kept as the file's blocks: Qwen2.5-Coder-1.5B's 151,936 x 1,536
table is 131 MB as Q4_K and 933 MB in fp32, and a step needs only its tokens' rows, which the `gguf`
package dequantizes (0.09 ms for one row, 21 ms for a 2,000-token prompt's, here)."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

ROWS_AT_ONCE = 8192  # rows dequantized together by dense(): bounds its temporaries


class QuantizedEmbedding(torch.nn.Module):
    def __init__(self, blocks: torch.Tensor, qtype: GGMLQuantizationType, hidden_size: int):
        super().__init__()
        self.blocks = blocks  # uint8 [vocab, bytes a row], as the file holds them
        self.qtype = int(qtype)
        self.hidden_size = hidden_size

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        rows = self.blocks[input_ids].numpy()
        values = dequantize(rows, GGMLQuantizationType(self.qtype))
        return torch.from_numpy(np.ascontiguousarray(values, np.float32)).view(
            len(input_ids), self.hidden_size
        )

    def dense(self) -> torch.Tensor:
        """The whole table in fp32 [vocab, hidden] (an fp32 output layer tied to it)."""
        ids = torch.arange(self.blocks.shape[0])
        return torch.cat([self(part) for part in ids.split(ROWS_AT_ONCE)])


def embed_tokens(table: torch.Tensor | QuantizedEmbedding, input_ids: torch.Tensor) -> torch.Tensor:
    if isinstance(table, QuantizedEmbedding):
        return table(input_ids)
    return F.embedding(input_ids, table)

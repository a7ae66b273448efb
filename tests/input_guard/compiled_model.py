"""A module TorchScript and torch.compile can read the source of (they cannot for a test's
local class defined in a string)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Lookup(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 4)

    def forward(self, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)
        picked = torch.gather(h, 1, ids[:, None] % 4)
        return F.cross_entropy(h, labels) + picked.sum() + h[ids % 2].sum()

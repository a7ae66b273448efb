"""Objects a spawned DataLoader worker can import: they hold whatever function they are given
(a test gives them torch's ops as seen inside a guard)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn


class Classifier(nn.Module):
    def __init__(self, loss_fn: Callable[..., torch.Tensor]) -> None:
        super().__init__()
        self.head = nn.Linear(4, 3)
        self.loss_fn = loss_fn

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.loss_fn(self.head(x), y)


class Picked(torch.utils.data.Dataset[torch.Tensor]):
    """Item i: row i of a table, picked with the function it is given (``torch.gather``)."""

    def __init__(self, pick: Callable[..., torch.Tensor]) -> None:
        self.pick = pick
        self.table = torch.arange(12.0).reshape(4, 3)

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.pick(self.table, 0, torch.full((1, 3), i))[0]


class Stack:
    """A collate function holding a function (``torch.stack`` is no checked op; ``one_hot`` is)."""

    def __init__(self, encode: Callable[..., Any]) -> None:
        self.encode = encode

    def __call__(self, rows: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        batch = torch.stack(rows)
        return batch, self.encode((batch[:, 0] / 3).long() % 3, 3)

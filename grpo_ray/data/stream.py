"""Prompt batches in a seeded order, epoch after epoch, with a position that can be saved and restored."""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass
class Position:
    epoch: int = 0
    index: int = 0
    """Rows of this epoch's order already handed out."""


class PromptStream:
    def __init__(
        self, rows: list[dict], batch_size: int, seed: int, shuffle: bool = True, position: Position | None = None
    ):
        self.rows, self.batch_size, self.seed, self.shuffle = rows, batch_size, seed, shuffle
        self.position = position or Position()
        self._order = self._order_of(self.position.epoch)

    def _order_of(self, epoch: int) -> list[int]:
        order = list(range(len(self.rows)))
        if self.shuffle:
            random.Random(f"{self.seed}/{epoch}").shuffle(order)
        return order

    @property
    def steps_per_epoch(self) -> int:
        return len(self.rows) // self.batch_size

    def next_batch(self) -> list[tuple[int, dict]]:
        """(row index, row) for the next batch; the incomplete tail of an epoch is skipped."""
        if self.position.index + self.batch_size > len(self.rows):
            self.position = Position(self.position.epoch + 1, 0)
            self._order = self._order_of(self.position.epoch)
        start = self.position.index
        self.position.index += self.batch_size
        return [(i, self.rows[i]) for i in self._order[start : start + self.batch_size]]

"""Real English text, shipped with CPython itself (no downloads): the Python documentation topics in
`pydoc_data.topics` (~0.7 MB), as bytes clipped to ASCII, cut into fixed-length training sequences."""

from __future__ import annotations

import torch


def corpus() -> bytes:
    from pydoc_data.topics import topics

    text = "\n\n".join(topics[k] for k in sorted(topics))
    return bytes(b if b < 128 else 32 for b in text.encode("utf-8"))


def batches(batch_size: int, block_size: int, seed: int) -> BatchStream:
    return BatchStream(corpus(), batch_size, block_size, seed)


class BatchStream:
    """Random (input, target) windows of the corpus, reproducible from the seed: same batches on every rank."""

    def __init__(self, data: bytes, batch_size: int, block_size: int, seed: int) -> None:
        self.data = torch.tensor(list(data), dtype=torch.long)
        self.batch_size, self.block_size = batch_size, block_size
        self.gen = torch.Generator().manual_seed(seed)

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        idx = torch.randint(len(self.data) - self.block_size - 1, (self.batch_size,), generator=self.gen)
        x = torch.stack([self.data[i:i + self.block_size] for i in idx])
        y = torch.stack([self.data[i + 1:i + 1 + self.block_size] for i in idx])
        return x, y

"""A byte-level tokenizer for demos: every UTF-8 byte is a token (V = 256), no download needed."""

from __future__ import annotations

import torch


class ByteTokenizer:
    """Text <-> byte ids. ``encode`` returns a (1, T) LongTensor ready for the model."""

    vocab_size = 256

    def encode(self, text: str, device: torch.device | str | None = None) -> torch.Tensor:
        if not isinstance(text, str) or not text:
            raise ValueError("encode needs a non-empty string")
        return torch.tensor([list(text.encode("utf-8"))], dtype=torch.long, device=device)  # (1, T)

    def encode_batch(self, texts: list[str], device: torch.device | str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Left-pad a list of texts: returns ``ids`` (B, T) and ``attention_mask`` (B, T), 1 = real token."""
        rows = [list(t.encode("utf-8")) for t in texts]
        if not rows or any(not r for r in rows):
            raise ValueError("encode_batch needs a non-empty list of non-empty strings")
        T = max(len(r) for r in rows)
        ids = torch.tensor([[0] * (T - len(r)) + r for r in rows], dtype=torch.long, device=device)
        mask = torch.tensor([[0] * (T - len(r)) + [1] * len(r) for r in rows], dtype=torch.long, device=device)
        return ids, mask

    def decode(self, ids: torch.Tensor | list[int]) -> str:
        """Bytes back to text; bytes that do not form valid UTF-8 show as U+FFFD."""
        if isinstance(ids, torch.Tensor):
            ids = ids.flatten().tolist()
        return bytes(int(i) for i in ids).decode("utf-8", errors="replace")

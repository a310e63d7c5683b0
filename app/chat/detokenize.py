"""Token ids -> text pieces, one per token, for streaming and per-token colouring."""
from __future__ import annotations

from typing import TYPE_CHECKING

from tokenizers.decoders import DecodeStream

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


class IncrementalDecoder:
    """Each token's text piece as it arrives, at a cost that does not grow with the answer:
    the tokenizers library's streaming decoder keeps only the last few tokens. A token that
    ends inside a multi-byte character yields "" and its bytes show up with the next token.
    The pieces join to exactly what decoding all ids at once gives (special tokens skipped)."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.pieces: list[str] = []
        backend = getattr(tokenizer, "backend_tokenizer", None)
        self._stream = (backend, DecodeStream(skip_special_tokens=True)) if backend is not None else None

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    def push(self, token_id: int) -> str:
        self.ids.append(token_id)
        if self._stream is not None:
            backend, stream = self._stream
            piece = stream.step(backend, token_id) or ""
        else:  # a tokenizer without a Rust backend: decode everything again (slow, but exact)
            text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
            piece = "" if text.endswith("\ufffd") else text[len(self.text):]
        self.pieces.append(piece)
        return piece

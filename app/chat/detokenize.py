"""Token ids -> text pieces, one per token, for streaming and per-token colouring."""
from __future__ import annotations

from transformers import PreTrainedTokenizerBase


class IncrementalDecoder:
    """Decodes the whole answer each time so merges and spacing come out as in a full
    decode; a token that ends inside a multi-byte character yields "" and its bytes
    show up with the next token."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.text = ""

    def push(self, token_id: int) -> str:
        self.ids.append(token_id)
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if text.endswith("\ufffd"):
            return ""
        piece, self.text = text[len(self.text) :], text
        return piece

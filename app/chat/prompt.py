"""Chat messages -> prompt token ids, through the tokenizer's own chat template."""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # transformers takes seconds to import; the window opens before it is
    from transformers import PreTrainedTokenizerBase


def switches_thinking(tokenizer: PreTrainedTokenizerBase) -> bool:
    """Whether the chat template lets thinking be switched off (Qwen3's `enable_thinking`: off, the
    answer opens with an empty thinking block and goes straight to the point)."""
    return bool(tokenizer.chat_template) and "enable_thinking" in tokenizer.chat_template


def chat_prompt_ids(tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, str]], thinking: bool = True) -> list[int]:
    """messages: [{"role": "system" | "user" | "assistant", "content": str}, ...]; thinking: False
    switches a reasoning model's thinking off where its template can (else nothing changes)."""
    if tokenizer.chat_template:
        switch = {} if thinking or not switches_thinking(tokenizer) else {"enable_thinking": False}
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, **switch)
    else:  # a base model without a template: plain turns
        text = "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant: "
    return tokenizer(text, add_special_tokens=False).input_ids

"""Chat messages -> prompt token ids, through the tokenizer's own chat template."""
from __future__ import annotations

from transformers import PreTrainedTokenizerBase


def chat_prompt_ids(tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, str]]) -> list[int]:
    """messages: [{"role": "system" | "user" | "assistant", "content": str}, ...]"""
    if tokenizer.chat_template:
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    else:  # a base model without a template: plain turns
        text = "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant: "
    return tokenizer(text, add_special_tokens=False).input_ids

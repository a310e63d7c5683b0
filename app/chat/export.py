"""Export a conversation to Markdown."""
from __future__ import annotations

from .conversation import Conversation


def to_markdown(conversation: Conversation) -> str:
    lines = [f"# {conversation.title}", ""]
    for message in conversation.messages:
        lines.append(f"**{'You' if message.role == 'user' else 'Assistant'}:**")
        lines.append("")
        lines.append(message.content)
        stats = message.stats
        if message.role == "assistant" and stats:
            lines.append("")
            lines.append(
                f"*{stats.mode}: {stats.emitted} tokens, {stats.tokens_per_s:.2f} tokens/s, acceptance "
                f"{stats.acceptance_rate:.0%}, mean accepted length {stats.mean_accepted_length:.2f}*"
            )
        lines.append("")
    return "\n".join(lines)

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
                f"*{stats.get('mode', '')}: {stats.get('tokens', 0)} tokens, "
                f"{stats.get('tokens_per_s', 0):.2f} tokens/s, acceptance {stats.get('acceptance_rate', 0):.0%}, "
                f"mean accepted length {stats.get('mean_accepted_length', 0):.2f}*"
            )
        lines.append("")
    return "\n".join(lines)

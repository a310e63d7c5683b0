"""Export a conversation to Markdown."""
from __future__ import annotations

from .conversation import Conversation


def to_markdown(conversation: Conversation) -> str:
    lines = [f"# {conversation.title}", ""]
    if conversation.system_prompt:
        lines += ["**System prompt:**", "", conversation.system_prompt, ""]
    for message in conversation.messages:
        lines.append(f"**{'You' if message.role == 'user' else 'Assistant'}:**")
        lines.append("")
        lines.append(message.content)
        stats = message.stats
        if message.role == "assistant" and stats:
            # a plain answer drafted nothing: it has no acceptance to tell
            speculated = (f", acceptance {stats.acceptance_rate:.0%}, mean accepted length "
                          f"{stats.mean_accepted_length:.2f}") if stats.drafted else ""
            lines.append("")
            lines.append(f"*{stats.mode}: {stats.emitted} tokens, {stats.tokens_per_s:.2f} tokens/s{speculated}*")
        lines.append("")
    return "\n".join(lines)

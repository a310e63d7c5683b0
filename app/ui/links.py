"""The chat view's links: each answer token is a link (tok:MESSAGE:TOKEN, for its tooltip), and
each action under a message is one (act:ACTION:MESSAGE:EXTRA, EXTRA a code block or a version).
The window acts on them in message_actions.py."""
from __future__ import annotations


def token_href(message_index: int, token_index: int) -> str:
    return f"tok:{message_index}:{token_index}"


def parse_href(href: str) -> tuple[int, int] | None:
    if not href.startswith("tok:"):
        return None
    _, message_index, token_index = href.split(":")
    return int(message_index), int(token_index)


def action_href(action: str, message_index: int, extra: int = 0) -> str:
    return f"act:{action}:{message_index}:{extra}"


def parse_action(href: str) -> tuple[str, int, int] | None:
    if not href.startswith("act:"):
        return None
    _, action, message_index, extra = href.split(":")
    return action, int(message_index), int(extra)

"""Messages -> HTML for the chat view: each answer token a link styled by its provenance,
fenced code blocks in a monospace box, rejected drafts as struck-through ghost text."""
from __future__ import annotations

import re
from dataclasses import dataclass
from html import escape

from ..chat.conversation import AnswerStats, Comparison, Message, TokenRecord
from ..engine.steps import FinishReason
from .theme import Theme


@dataclass(frozen=True)
class RenderOptions:
    theme: Theme
    colouring: bool = True
    ghosts: bool = False  # show rejected draft tokens


def token_href(message_index: int, token_index: int) -> str:
    return f"tok:{message_index}:{token_index}"


def parse_href(href: str) -> tuple[int, int] | None:
    if not href.startswith("tok:"):
        return None
    _, message_index, token_index = href.split(":")
    return int(message_index), int(token_index)


def _token_html(message_index: int, index: int, token: TokenRecord, text: str, options: RenderOptions,
                style: str = "") -> str:
    theme = options.theme
    colour = theme.colour(token.source) if options.colouring else theme.text
    decoration = "underline" if options.colouring and token.source == "corrected" else "none"
    weight = "font-weight:600;" if options.colouring and token.source == "bonus" else ""
    return (f'<a href="{token_href(message_index, index)}" style="color:{colour};'
            f'text-decoration:{decoration};{weight}{style}">{escape(text)}</a>')


_INLINE_MARKERS = re.compile(r"(\*\*|`)")
_INLINE_STYLE = {"`": "font-family:monospace;", "**": "font-weight:700;"}


def _ghost_html(token: TokenRecord, options: RenderOptions) -> str:
    if not (options.ghosts and token.rejected):
        return ""
    return (f'<span style="color:{options.theme.muted};text-decoration:line-through">'
            f"{escape(token.rejected)}</span>")


def _lines(tokens: list[TokenRecord]) -> list[list[tuple[str, int]]]:
    """Split the answer into lines of (text, token index) fragments."""
    lines: list[list[tuple[str, int]]] = [[]]
    for index, token in enumerate(tokens):
        for part_index, part in enumerate(token.text.split("\n")):
            if part_index:
                lines.append([])
            if part:
                lines[-1].append((part, index))
    return lines


def _line_html(message_index: int, line: list[tuple[str, int]], tokens: list[TokenRecord],
               options: RenderOptions, ghosted: set[int], markdown: bool) -> str:
    """One line of an answer; with `markdown`, inline `code`, **bold** and # headings are
    styled and their markers hidden (code blocks keep every character)."""
    text = "".join(fragment for fragment, _ in line)
    heading = 0
    if markdown and text.startswith("#") and text.lstrip("#").startswith(" "):
        heading = len(text) - len(text.lstrip("#"))
    to_skip = heading + 1 if heading else 0  # the '#'s and the space after them
    open_markers: set[str] = set()
    parts = []
    for fragment, i in line:
        if to_skip:
            dropped = min(to_skip, len(fragment))
            fragment, to_skip = fragment[dropped:], to_skip - dropped
        if i not in ghosted:  # ghost text goes before the token's first fragment
            ghosted.add(i)
            parts.append(_ghost_html(tokens[i], options))
        for piece in _INLINE_MARKERS.split(fragment) if markdown else [fragment]:
            if markdown and piece in _INLINE_STYLE:
                open_markers ^= {piece}
            elif piece:
                style = "".join(_INLINE_STYLE[m] for m in sorted(open_markers))
                parts.append(_token_html(message_index, i, tokens[i], piece, options, style))
    html = "".join(parts)
    if heading:
        size = {1: "x-large", 2: "large"}.get(heading, "medium")
        return f'<span style="font-size:{size};font-weight:700">{html}</span>'
    return html


def answer_html(message_index: int, tokens: list[TokenRecord], options: RenderOptions) -> str:
    blocks: list[str] = []
    current: list[str] = []
    in_code = False
    ghosted: set[int] = set()

    def flush(code: bool) -> None:
        if not current:
            return
        body = "\n".join(current) if code else "<br>".join(current)
        if code:
            blocks.append(f'<table width="100%" cellpadding="8" style="margin:4px 0" '
                          f'bgcolor="{options.theme.code_background}"><tr><td>'
                          f'<pre style="font-family:monospace;margin:0">{body}</pre></td></tr></table>')
        else:
            blocks.append(f'<p style="white-space:pre-wrap;margin:2px 0">{body}</p>')
        current.clear()

    for line in _lines(tokens):
        text = "".join(fragment for fragment, _ in line)
        if text.lstrip().startswith("```"):
            flush(in_code)
            in_code = not in_code
            language = text.strip().strip("`")
            if language:
                blocks.append(f'<p style="color:{options.theme.muted};font-family:monospace;margin:6px 0 0 0">'
                              f"{escape(language)}</p>")
            continue
        current.append(_line_html(message_index, line, tokens, options, ghosted, markdown=not in_code))
    flush(in_code)
    return "".join(blocks)


FINISH_TEXT = {FinishReason.STOP: "done", FinishReason.LENGTH: "length limit", FinishReason.CONTEXT: "context full",
               FinishReason.CANCELLED: "stopped", FinishReason.INTERRUPTED: "interrupted"}


def stats_line(stats: AnswerStats | None) -> str:
    if not stats:
        return ""
    parts = [stats.mode, f"{stats.tokens} tokens", f"{stats.tokens_per_s:.2f} tok/s"]
    if stats.first_token_seconds is not None:
        parts.append(f"first token {stats.first_token_seconds:.2f} s")
    if stats.drafted:
        parts.append(f"acceptance {stats.acceptance_rate:.0%}")
        parts.append(f"mean accepted length {stats.mean_accepted_length:.2f}")
    if stats.finish is not None:
        parts.append(FINISH_TEXT[stats.finish])
    return " · ".join(p for p in parts if p)


def comparison_html(comparison: Comparison) -> str:
    """Compare's result in one line: both speeds, the speedup, and whether the texts agree."""
    same = ("<b>identical texts</b>" if comparison.identical else
            f"<b>texts differ from character {comparison.first_difference}</b> "
            "(expected only when sampling with temperature > 0)")
    return (f"speculative {comparison.speculative_tokens_per_s:.2f} tok/s vs plain "
            f"{comparison.plain_tokens_per_s:.2f} tok/s: <b>{comparison.speedup:.2f}x</b>, {same}")


def _comparison_card(comparison: Comparison, theme: Theme) -> str:
    return (f'<table cellpadding="6" style="margin:4px 0" bgcolor="{theme.code_background}"><tr><td>'
            f'<small>Compare: {comparison_html(comparison)}</small></td></tr></table>')


def conversation_html(messages: list[Message], options: RenderOptions) -> str:
    theme = options.theme
    out = [f'<body style="color:{theme.text};background:{theme.background}">']
    for index, message in enumerate(messages):
        if message.role == "user":
            out.append(f'<p style="color:{theme.muted};margin:10px 0 2px 0"><b>You</b></p>'
                       f'<table width="100%" cellpadding="8" bgcolor="{theme.user_bubble}"><tr><td>'
                       f'<p style="white-space:pre-wrap;margin:0">{escape(message.content)}</p></td></tr></table>')
        else:
            out.append(f'<p style="color:{theme.muted};margin:10px 0 2px 0"><b>Assistant</b>'
                       f'&nbsp;&nbsp;<small>{escape(stats_line(message.stats))}</small></p>')
            out.append(answer_html(index, message.tokens, options) if message.tokens
                       else f'<p style="white-space:pre-wrap">{escape(message.content)}</p>')
            if message.stats and message.stats.comparison:
                out.append(_comparison_card(message.stats.comparison, theme))
    out.append("</body>")
    return "".join(out)

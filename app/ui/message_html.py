"""A message's chrome: its header, the links under it, its stats line and the Compare card."""
from __future__ import annotations

from html import escape

from ..chat.conversation import AnswerStats, Comparison, Message
from ..engine.api import FinishReason
from .links import action_href
from .theme import Theme
from .token_html import RenderOptions, answer_html

FINISH_TEXT = {FinishReason.STOP: "done", FinishReason.LENGTH: "length limit", FinishReason.CONTEXT: "context full",
               FinishReason.CANCELLED: "stopped", FinishReason.INTERRUPTED: "interrupted",
               FinishReason.FAILED: "the server failed mid-answer"}


def stats_line(stats: AnswerStats | None) -> str:
    if not stats:
        return ""
    parts = [stats.mode, f"{stats.emitted} tokens", f"{stats.tokens_per_s:.2f} tok/s"]
    if stats.first_token_seconds is not None:
        parts.append(f"first token {stats.first_token_seconds:.2f} s")
    if stats.drafted:
        parts.append(f"acceptance {stats.acceptance_rate:.0%}")
        parts.append(f"mean accepted length {stats.mean_accepted_length:.2f}")
    if stats.finish is not None:
        parts.append(FINISH_TEXT[stats.finish])
    return " · ".join(p for p in parts if p)


def comparison_html(comparison: Comparison) -> str:
    """Compare's result in one line: both decoding speeds, the speedup, and whether the texts agree."""
    why = (f"sampling with temperature > 0 draws otherwise; greedy, {comparison.rounding_note}"
           if comparison.rounding_note else "expected only when sampling with temperature > 0")
    same = ("<b>identical texts</b>" if comparison.identical else
            f"<b>texts differ from character {comparison.first_difference}</b> ({escape(why)})")
    return (f"speculative {comparison.speculative_tokens_per_s:.2f} tok/s vs plain "
            f"{comparison.plain_tokens_per_s:.2f} tok/s decoding: <b>{comparison.speedup:.2f}x</b>, {same}")


def _links(theme: Theme, *links: tuple[str, str]) -> str:
    return "&nbsp;&nbsp;".join(f'<a href="{href}" style="color:{theme.link}">{label}</a>' for label, href in links)


def message_header_html(index: int, message: Message, options: RenderOptions, last: bool, streaming: bool) -> str:
    theme = options.theme
    if message.role == "user":
        actions = _links(theme, ("edit", action_href("edit", index)), ("copy", action_href("copy", index)),
                         ("fork", action_href("fork", index)))
        return f'<p style="color:{theme.muted};margin:10px 0 2px 0"><b>You</b>&nbsp;&nbsp;<small>{actions}</small></p>'
    if streaming:
        return f'<p style="color:{theme.muted};margin:10px 0 2px 0"><b>Assistant</b>&nbsp;&nbsp;<small>writing...</small></p>'
    links = [("copy", action_href("copy", index)), ("fork", action_href("fork", index))]
    if last:
        links.append(("regenerate", action_href("regenerate", index)))
        if message.stopped_early:
            links.append(("continue", action_href("continue", index)))
    if len(message.versions) > 1:
        if message.shown > 0:
            links.append(("&lsaquo;", action_href("version", index, message.shown - 1)))
        links.append((f"{message.shown + 1}/{len(message.versions)}", action_href("version", index, message.shown)))
        if message.shown < len(message.versions) - 1:
            links.append(("&rsaquo;", action_href("version", index, message.shown + 1)))
    return (f'<p style="color:{theme.muted};margin:10px 0 2px 0"><b>Assistant</b>&nbsp;&nbsp;'
            f'<small>{escape(stats_line(message.stats))}&nbsp;&nbsp;{_links(theme, *links)}</small></p>')


def message_html(index: int, message: Message, options: RenderOptions, last: bool = False) -> str:
    """One finished message: header, body, and Compare's card under an answer that has one."""
    theme = options.theme
    header = message_header_html(index, message, options, last, streaming=False)
    if message.role == "user":
        return (header + f'<table width="100%" cellpadding="8" bgcolor="{theme.user_bubble}"><tr><td>'
                f'<p style="white-space:pre-wrap;margin:0">{escape(message.content)}</p></td></tr></table>')
    body = (answer_html(index, message.tokens, options) if message.tokens
            else f'<p style="white-space:pre-wrap">{escape(message.content)}</p>')
    card = ""
    if message.stats and message.stats.comparison:
        card = (f'<table cellpadding="6" style="margin:4px 0" bgcolor="{theme.code_background}"><tr><td>'
                f'<small>Compare: {comparison_html(message.stats.comparison)}</small></td></tr></table>')
    return header + body + card


def unanswered_html(index: int, options: RenderOptions) -> str:
    return (f'<p style="color:{options.theme.muted}"><i>No answer yet.</i> '
            f'<a href="{action_href("answer", index)}" style="color:{options.theme.link}">Answer it</a></p>')


def body_start(options: RenderOptions) -> str:
    return f'<body style="color:{options.theme.text};background:{options.theme.background}">'

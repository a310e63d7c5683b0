"""Markdown as the chat renders it: CommonMark with tables and strikethrough (markdown-it-py),
and TeX math (\\( \\), \\[ \\], $$ $$, $ $) kept as one token for math_text to write as text."""
from __future__ import annotations

import re
from html import escape

from markdown_it import MarkdownIt
from markdown_it.rules_inline import StateInline

# A math span of up to 4,000 characters: an unclosed delimiter costs a bounded look ahead. A
# single $ follows Pandoc's rule, so that prices stay text ("$18 and $20"): no space inside either
# dollar, none of it across lines, and no digit right after the closing one.
MATH = re.compile(r"\\\((.{1,4000}?)\\\)|\\\[(.{1,4000}?)\\\]|\$\$(.{1,4000}?)\$\$"
                  r"|\$(?![\s$])([^\n$]{1,400}?)(?<![\s\\])\$(?!\d)", re.DOTALL)
MATH_OPEN = {1: "\\(", 2: "\\[", 3: "$$", 4: "$"}  # by the pattern's group
MATH_CLOSE = {"\\(": "\\)", "\\[": "\\]", "$$": "$$", "$": "$"}


def _math_rule(state: StateInline, silent: bool) -> bool:
    """A math span anywhere in a paragraph: models open display math mid-paragraph, where a
    block rule cannot see it. Runs before the escape rule, which would make \\[ a plain [."""
    match = MATH.match(state.src, state.pos) if state.src[state.pos] in "\\$" else None
    if match is None or not match.group(match.lastindex).strip():
        return False
    if not silent:
        token = state.push("math", "", 0)
        token.content, token.markup = match.group(match.lastindex), MATH_OPEN[match.lastindex]
    state.pos = match.end()
    return True


def _render_math(self, tokens, index: int, options, env) -> str:
    return f'<tex-math open="{escape(tokens[index].markup)}">{escape(tokens[index].content)}</tex-math>'


MARKDOWN = MarkdownIt("commonmark", {"html": False, "breaks": True}).enable(["table", "strikethrough"])
MARKDOWN.inline.ruler.before("escape", "math", _math_rule)
MARKDOWN.add_render_rule("math", _render_math)


def code_blocks(text: str) -> list[str]:
    """The code of each fenced or indented block of a Markdown text, in order (for copying)."""
    return [token.content for token in MARKDOWN.parse(text) if token.type in ("fence", "code_block")]

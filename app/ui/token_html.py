"""An answer's text -> HTML in which every character is still its token's link.

The Markdown is rendered (markdown.py), then every character of the rendered text is traced back
to the answer token it came from (the rendered text is the source minus Markdown's markers; math
is aligned with its TeX), so each token stays a link coloured by its provenance, with its
tooltip, inside lists, tables, headings, math and code blocks alike. With provenance colours off,
code blocks are coloured by their syntax (Pygments)."""
from __future__ import annotations

from dataclasses import dataclass
from difflib import SequenceMatcher
from html import escape
from html.parser import HTMLParser
from itertools import groupby, repeat

from pygments.lexers import get_lexer_by_name
from pygments.styles import get_style_by_name
from pygments.token import Generic
from pygments.util import ClassNotFound

from ..chat.conversation import TokenRecord
from ..engine.api import Source
from .links import action_href, token_href
from .markdown import MARKDOWN, MATH_CLOSE, code_blocks
from .math_text import math_text
from .theme import Theme
from .thinking import THINK_CLOSE, thinking_span

LOOKAHEAD = 240  # how far a rendered character is looked for in the source (past markers and fences)


@dataclass(frozen=True)
class RenderOptions:
    theme: Theme
    colouring: bool = True
    ghosts: bool = False  # show rejected draft tokens
    marks: bool = False  # accepted tokens also dotted-underlined: told apart other than by colour


def source_marks(source: Source, options: RenderOptions) -> str:
    """The CSS that tells a token's source other than by its colour: corrected underlined, bonus
    bold, and (options.marks) accepted dotted-underlined."""
    if source is Source.CORRECTED:
        return "text-decoration:underline;"
    if source is Source.BONUS:
        return "font-weight:600;"
    if source is Source.ACCEPTED and options.marks:
        return "text-underline-style:dotted;"  # (Qt reads the CSS word; a link is underlined already)
    return "text-decoration:none;"


def token_owners(tokens: list[TokenRecord]) -> list[int]:
    """For each character of the answer's text, the index of the token it belongs to."""
    return [index for index, token in enumerate(tokens) for _ in token.text]


class _Colourer(HTMLParser):
    """Re-emits markdown-it's HTML with each text run wrapped in its token's link."""

    def __init__(self, source: str, owners: list[int], message_index: int, tokens: list[TokenRecord],
                 options: RenderOptions, first_code_block: int, thinking: bool = False) -> None:
        super().__init__(convert_charrefs=True)
        self.source, self.owners, self.message_index = source, owners, message_index
        self.tokens, self.options, self.theme = tokens, options, options.theme
        self.thinking = thinking  # a reasoning model's thinking: italic, and muted where provenance colours are off
        self.position = 0  # next source character to match
        self.out: list[str] = []
        self.in_link = self.in_pre = 0
        self.code_blocks = first_code_block
        self.ghosted: set[int] = set()
        self.math_open: str | None = None  # the opening delimiter of the math span being read
        self.code_language = ""  # the language of the fenced block being read

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        theme = self.theme
        if tag == "tex-math":
            self.math_open = dict(attrs)["open"]
            return
        if tag == "code" and self.in_pre:  # a fenced block: language and copy link above a shaded box
            language = next((v[len("language-"):] for k, v in attrs if k == "class" and v and v.startswith("language-")), "")
            self.code_language = language
            link = f'<a href="{action_href("copycode", self.message_index, self.code_blocks)}" style="color:{theme.link}">copy</a>'
            self.out.append(f'<p style="color:{theme.muted};font-family:monospace;margin:6px 0 0 0">'
                            f'{escape(language)}{" · " if language else ""}{link}</p>'
                            f'<table width="100%" cellpadding="8" style="margin:2px 0 4px 0" '
                            f'bgcolor="{theme.code_background}"><tr><td><pre style="font-family:monospace;margin:0">')
            self.code_blocks += 1
            self._skip_fence_line()
            return
        if tag == "pre":
            self.in_pre += 1
            return
        if tag == "a":
            self.in_link += 1
        if tag == "table":
            attrs = [("border", "1"), ("cellpadding", "4"), ("cellspacing", "0"), ("style", "border-collapse:collapse")]
        rendered = "".join(f' {k}="{escape(v or "", quote=True)}"' for k, v in attrs)
        self.out.append(f"<{tag}{rendered}>")

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.out.append(f"<{tag}>")

    def handle_endtag(self, tag: str) -> None:
        if tag == "tex-math":
            self.math_open = None
            return
        if tag == "code" and self.in_pre:
            self.out.append("</pre></td></tr></table>")
            return
        if tag == "pre":
            self.in_pre -= 1
            return
        if tag == "a":
            self.in_link -= 1
        self.out.append(f"</{tag}>")

    def handle_data(self, text: str) -> None:
        if self.math_open:
            self._math(text)
            return
        if not text.strip("\n"):  # the newlines markdown-it puts between block tags
            self.out.append(text)
            return
        if self.in_pre and text.endswith("\n"):
            text = text[:-1]  # the fence's last newline: <pre> would show it as an empty line
        colours = (syntax_colours(text, self.code_language, self.theme.code_style)
                   if self.in_pre and self.code_language and not self.options.colouring else None)
        self._emit(text, [self._owner_of(char) for char in text], colours)

    def _emit(self, text: str, owners: list[int | None], colours: list[str | None] | None = None) -> None:
        """`text` as runs of links, one per token (owners[i]: the token of text[i]); colours[i]:
        text[i]'s syntax colour where provenance colours are off (None: the text colour)."""
        keys = zip(owners, colours or repeat(None))
        for (owner, colour), run in groupby(zip(keys, text), key=lambda pair: pair[0]):
            piece = escape("".join(char for _, char in run))
            if owner is not None and not self.in_link:
                self.out.append(self._token_html(owner, piece, colour))
            else:
                self.out.append(f'<span style="color:{colour}">{piece}</span>' if colour else piece)

    def _math(self, tex: str) -> None:
        """A math span as text, each character owned by the token of the TeX it came from; a row
        of the TeX per line."""
        text = math_text(tex)
        opening = self.source.find(self.math_open, self.position, self.position + LOOKAHEAD)
        start = opening + len(self.math_open)
        close = MATH_CLOSE[self.math_open]
        closing = self.source.find(close, start + 1) if opening >= 0 else -1
        if closing < 0:
            owners = [self._owner_of(char) for char in text]
        else:  # aligned with the source's own span, whose lines may carry a list's indentation
            self.position = closing + len(close)
            owners = [self._owner_at(start + index) for index in _aligned(self.source[start:closing], text)]
        line_start = 0
        for number, line in enumerate(text.split("\n")):
            if number:
                self.out.append("<br />")
            self._emit(line, owners[line_start : line_start + len(line)])
            line_start += len(line) + 1

    def _skip_fence_line(self) -> None:
        """Moves past a fence's opening line, whose language name would otherwise take the
        code's first letters."""
        window = self.source[self.position : self.position + LOOKAHEAD]
        fence = min((i for i in (window.find("```"), window.find("~~~")) if i >= 0), default=-1)
        if fence >= 0:
            end = window.find("\n", fence)
            self.position += (end + 1) if end >= 0 else len(window)

    def _owner_of(self, char: str) -> int | None:
        found = self.source.find(char, self.position, self.position + LOOKAHEAD)
        if found < 0:
            return None
        self.position = found + 1
        return self._owner_at(found)

    def _owner_at(self, index: int) -> int | None:
        return self.owners[index] if index < len(self.owners) else None

    def _token_html(self, index: int, piece: str, syntax_colour: str | None = None) -> str:
        """piece: escaped HTML."""
        token, options, theme = self.tokens[index], self.options, self.theme
        ghost = ""
        if index not in self.ghosted:  # rejected drafts go before the token's first character
            self.ghosted.add(index)
            if options.ghosts and token.rejected:
                ghost = (f'<span style="color:{theme.muted};text-decoration:line-through">'
                         f"{escape(token.rejected)}</span>")
        colour = theme.colour(token.source) if options.colouring else \
            syntax_colour or (theme.muted if self.thinking else theme.text)
        marks = source_marks(token.source, options) if options.colouring else "text-decoration:none;"
        italic = "font-style:italic;" if self.thinking else ""
        link = lambda text, style: (f'<a href="{token_href(self.message_index, index)}" '
                                    f'style="color:{colour};{style}{italic}">{text}</a>')
        lead = piece[: len(piece) - len(piece.lstrip())]
        if "underline" not in marks or not lead:
            return ghost + link(piece, marks)
        body = piece[len(lead):]  # a token's indentation is not underlined
        return ghost + link(lead, "text-decoration:none;") + (link(body, marks) if body else "")


def syntax_colours(code: str, language: str, style: str) -> list[str | None]:
    """For each character of `code`, its colour in the Pygments `style` (None: the text colour);
    all None for a language Pygments does not know."""
    try:
        lexer = get_lexer_by_name(language, stripnl=False, ensurenl=False)
    except ClassNotFound:
        return [None] * len(code)
    colours_by_type = get_style_by_name(style)
    colours: list[str | None] = []
    for token_type, value in lexer.get_tokens(code):
        # a program's printed output (an "output" block) reads as text, not as a colour of code
        colour = None if token_type in Generic.Output else colours_by_type.style_for_token(token_type)["color"]
        colours += [f"#{colour}" if colour else None] * len(value)
    return (colours + [None] * len(code))[: len(code)]  # the lexer may normalise line ends


def _aligned(source: str, text: str) -> list[int]:
    """For each character of `text` (a conversion of `source`), the index of the source
    character it came from: the same character where both have it, else the position of the
    TeX it replaced (× -> \\times)."""
    where: list[int] = []
    for _, source_start, source_end, text_start, text_end in SequenceMatcher(None, source, text, autojunk=False).get_opcodes():
        span, length = source_end - source_start, text_end - text_start
        where += [min(source_start + offset * span // length, len(source) - 1) for offset in range(length)]
    return where


def markdown_html(message_index: int, text: str, owners: list[int], tokens: list[TokenRecord],
                  options: RenderOptions, first_code_block: int = 0, thinking: bool = False) -> str:
    """`text` (a Markdown part of an answer) as HTML; owners[i] is the token of text[i]."""
    colourer = _Colourer(text, owners, message_index, tokens, options, first_code_block, thinking)
    colourer.feed(MARKDOWN.render(text))
    colourer.close()
    return "".join(colourer.out)


def answer_part_html(message_index: int, text: str, owners: list[int], tokens: list[TokenRecord],
                     options: RenderOptions, start: int = 0, end: int | None = None, first_code_block: int = 0) -> str:
    """text[start:end] of an answer as HTML (owners[i]: the token of text[i]): a reasoning model's
    thinking goes in an indented block under a "Thinking" label, in italics (and muted where
    provenance colours are off), its markers left out; the rest is rendered as it is."""
    end = len(text) if end is None else end
    span = thinking_span(text)
    if span is None:
        return markdown_html(message_index, text[start:end], owners[start:end], tokens, options, first_code_block)
    think_start, think_end = span  # before the thinking: at most blanks and its opening marker
    answer_start = think_end + len(THINK_CLOSE) if text.startswith(THINK_CLOSE, think_end) else think_end
    parts = []
    if start <= think_start < end:
        parts.append(f'<p style="color:{options.theme.muted};margin:4px 0 0 0"><small>Thinking</small></p>')
    a, b = max(start, think_start), min(end, think_end)
    if text[a:b].strip():
        thinking = markdown_html(message_index, text[a:b], owners[a:b], tokens, options, first_code_block, thinking=True)
        parts.append(f"<blockquote>{thinking}</blockquote>")
        first_code_block += len(code_blocks(text[a:b]))
    a = max(start, answer_start)
    if text[a:end].strip():
        parts.append(markdown_html(message_index, text[a:end], owners[a:end], tokens, options, first_code_block))
    return "".join(parts)


def answer_html(message_index: int, tokens: list[TokenRecord], options: RenderOptions) -> str:
    return answer_part_html(message_index, "".join(t.text for t in tokens), token_owners(tokens), tokens, options)

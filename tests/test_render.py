"""Answer rendering: provenance styles per token, code blocks, inline Markdown, ghosts."""
from app.chat.conversation import TokenRecord
from app.ui.render import RenderOptions, answer_html, parse_href
from app.ui.theme import DARK, LIGHT


def tok(text, source="accepted", **extra):
    return TokenRecord(text, source, 0.9, 0.8, **extra)


def test_each_token_is_a_link_in_its_colour():
    tokens = [tok("Hello"), tok(" big", "corrected", replaced=" small", rejected=" small world"), tok(" world", "bonus")]
    html = answer_html(3, tokens, RenderOptions(LIGHT))
    for index, token in enumerate(tokens):
        assert f'href="tok:3:{index}" style="color:{LIGHT.colour(token.source)}' in html
    assert "line-through" not in html  # ghosts are off by default
    assert "small world" in answer_html(3, tokens, RenderOptions(LIGHT, ghosts=True))
    assert parse_href("tok:3:1") == (3, 1)


def test_colouring_off_uses_the_text_colour():
    html = answer_html(0, [tok("a", "corrected"), tok("b", "bonus")], RenderOptions(DARK, colouring=False))
    assert DARK.corrected not in html and DARK.bonus not in html and DARK.text in html


def test_code_block_and_inline_markdown():
    tokens = [tok("Use "), tok("`x"), tok("`"), tok(" and "), tok("**bold**"), tok("\n```"), tok("python\n"),
              tok("print(1)"), tok("\n```")]
    html = answer_html(0, tokens, RenderOptions(LIGHT))
    assert "`" not in html.replace("```", "") and "**" not in html
    assert "font-family:monospace;" in html and "font-weight:700;" in html
    assert "<pre" in html and "print(1)" in html
    assert ">python</p>" in html  # the fence's language label


def test_heading_markers_are_hidden():
    html = answer_html(0, [tok("## "), tok("Title")], RenderOptions(LIGHT))
    assert "##" not in html and "Title" in html and "font-size:large" in html

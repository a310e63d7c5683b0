"""Answer rendering: Markdown through markdown-it-py with every token still a coloured link."""
import re

from app.chat.conversation import TokenRecord
from app.ui.links import parse_action, parse_href
from app.ui.markdown import code_blocks
from app.ui.token_html import RenderOptions, answer_html, markdown_html, token_owners
from app.ui.theme import DARK, LIGHT


def tok(text, source="accepted", **extra):
    return TokenRecord(text, source, 0.9, 0.8, **extra)


def linked_text(html: str) -> dict[int, str]:
    """token index -> the text rendered inside its links."""
    found: dict[int, str] = {}
    for index, text in re.findall(r'href="tok:\d+:(\d+)"[^>]*>([^<]*)</a>', html):
        found[int(index)] = found.get(int(index), "") + text
    return found


def test_each_token_is_a_link_in_its_colour():
    tokens = [tok("Hello"), tok(" big", "corrected", replaced=" small", rejected=" small world"), tok(" world", "bonus")]
    html = answer_html(3, tokens, RenderOptions(LIGHT))
    for index, token in enumerate(tokens):
        assert f'href="tok:3:{index}" style="color:{LIGHT.colour(token.source)}' in html
    assert linked_text(html) == {0: "Hello", 1: " big", 2: " world"}
    assert "line-through" not in html  # ghosts are off by default
    assert "small world" in answer_html(3, tokens, RenderOptions(LIGHT, ghosts=True))
    assert parse_href("tok:3:1") == (3, 1)


def test_colouring_off_uses_the_text_colour():
    html = answer_html(0, [tok("a", "corrected"), tok("b", "bonus")], RenderOptions(DARK, colouring=False))
    assert DARK.corrected not in html and DARK.bonus not in html and DARK.text in html


def test_markdown_markers_are_rendered_and_tokens_keep_their_text():
    tokens = [tok("## "), tok("Title"), tok("\n\nUse "), tok("`x"), tok("`"), tok(" and "), tok("**bold**"),
              tok("\n\n1. one\n2. t"), tok("wo", "corrected"), tok("\n\n| a | b |\n|---|---|\n| 1 | 2 |\n"),
              tok("\n```"), tok("python\n"), tok("print(1 < 2)"), tok("\n```\nSee [the docs](https://x.y) & more")]
    html = answer_html(0, tokens, RenderOptions(LIGHT))
    assert "**" not in html and "`" not in html and "##" not in html and "|" not in html
    for tag in ("<h2>", "<code>", "<strong>", "<ol>", "<li>", "<table", "<th>", "<td>", "<pre", '<a href="https://x.y">'):
        assert tag in html, tag
    text = linked_text(html)
    assert text[1] == "Title" and text[3] == "x" and text[6] == "bold" and text[8] == "wo"
    assert text[12] == "print(1 &lt; 2)"  # the code, not the fence's language name
    assert "python · " in html and 'href="act:copycode:0:0"' in html
    assert 'href="tok:0:8" style="color:#D55E00;text-decoration:underline' in html


def test_code_blocks_are_found_for_copying():
    text = "Intro\n```python\ndef f():\n    return 1\n```\nand\n\n    indented code\n"
    assert code_blocks(text) == ["def f():\n    return 1\n", "indented code\n"]
    assert parse_action("act:copycode:4:1") == ("copycode", 4, 1)


def test_a_part_of_an_answer_renders_with_global_token_indices():
    tokens = [tok("First paragraph.\n\n"), tok("Second "), tok("one.", "bonus")]
    text = "".join(t.text for t in tokens)
    cut = len(tokens[0].text)
    html = markdown_html(0, text[cut:], token_owners(tokens)[cut:], tokens, RenderOptions(LIGHT))
    assert linked_text(html) == {1: "Second ", 2: "one."}


def test_a_corrected_token_underlines_its_words_not_its_indentation():
    html = answer_html(0, [tok("```\nx = 1\n"), tok("    return", "corrected"), tok("\n```")], RenderOptions(LIGHT))
    assert 'text-decoration:none;">    </a>' in html and 'text-decoration:underline;">return</a>' in html


def test_math_is_written_as_text_and_each_character_keeps_the_token_of_its_tex():
    tokens = [tok("So \\( 9 "), tok("\\times", "corrected"), tok(" 2 = "), tok("18", "bonus"), tok(" \\) per day.")]
    html = answer_html(0, tokens, RenderOptions(LIGHT))
    assert "\\times" not in html and "\\(" not in html and "\\)" not in html
    assert linked_text(html) == {0: "So 9 ", 1: "×", 2: " 2 = ", 3: "18", 4: " per day."}
    assert 'href="tok:0:1" style="color:#D55E00;text-decoration:underline' in html


def test_display_math_mid_paragraph_gets_its_own_lines_and_a_line_per_row():
    text = "Eggs left:\n\\[\n\\text{Eggs} = 16 - 3 = 13 \\\\ 13 \\times 2 = 26\n\\]\nSo $26."
    html = answer_html(0, [tok(text[i:i + 4]) for i in range(0, len(text), 4)], RenderOptions(LIGHT))
    shown = re.sub(r"<[^>]+>", "|", html).replace("|", "")
    assert shown.strip() == "Eggs left:\nEggs = 16 - 3 = 1313 × 2 = 26\nSo $26."
    assert re.search(r"13</a><br />", html)  # the TeX row break


def test_math_inside_code_and_unclosed_math_stay_tex():
    html = answer_html(0, [tok("`\\(x^2\\)` and\n```\nprint(\\[a\\])\n```\nthen \\( 9 \\times")], RenderOptions(LIGHT))
    text = "".join(linked_text(html).values())
    assert "\\(x^2\\)" in text and "print(\\[a\\])" in text and "\\times" in text and "×" not in text


def test_math_in_a_list_item_aligns_with_its_indented_source():
    tokens = [tok("1. Then\n   \\[\n   48"), tok(" + "), tok("24"), tok("\n   \\]\n2. Done")]
    html = answer_html(0, tokens, RenderOptions(LIGHT))
    assert linked_text(html) == {0: "Then48", 1: " + ", 2: "24", 3: "Done"}


def test_code_takes_syntax_colours_when_provenance_colours_are_off():
    tokens = [tok("```python\n"), tok("def", "corrected"), tok(" f():\n    return 'x'\n"), tok("```\n")]
    plain = answer_html(0, tokens, RenderOptions(LIGHT, colouring=False))
    assert 'href="tok:0:1" style="color:#008000' in plain  # a keyword, in Pygments' default style
    assert "color:#BA2121" in plain  # the string
    assert linked_text(plain) == linked_text(answer_html(0, tokens, RenderOptions(LIGHT)))  # still every token
    coloured = answer_html(0, tokens, RenderOptions(LIGHT))
    assert "#008000" not in coloured and 'href="tok:0:1" style="color:#D55E00' in coloured
    unknown = answer_html(0, [tok("```nosuchlanguage\n48.0\n```")], RenderOptions(LIGHT, colouring=False))
    assert f"color:{LIGHT.text}" in unknown


def test_every_image_a_theme_names_exists():
    from pathlib import Path

    from app.ui.theme import THEMES
    for theme in THEMES.values():
        for image in re.findall(r"url\(([^)]*)\)", theme.stylesheet()):
            assert Path(image).is_file(), (theme.name, image)


def test_single_dollar_math_converts_but_prices_stay_text():
    def shown(text):
        return re.sub(r"<[^>]+>", "", answer_html(0, [tok(text)], RenderOptions(LIGHT))).strip()
    assert shown("Let $x^2$ and $y_1$ be given, $10 more.") == "Let x² and y₁ be given, $10 more."
    for prices in ("It costs $18 and $20 today.", "$5+$3 = $8", "between $1,000 and $2,000", "$ 5 and 6 $"):
        assert shown(prices) == prices


THINKING = [tok("<think>"), tok("\nLet"), tok(" me"), tok(" add", "corrected"), tok(".\n\n"), tok("Two"), tok(" twos."),
            tok("</think>"), tok("\n\nThe"), tok(" answer"), tok(" is"), tok(" 4", "bonus"), tok(".")]


def test_a_reasoning_models_thinking_is_set_apart_with_its_tokens():
    """Qwen3 and DeepSeek-R1's distillations think between <think> and </think> first: the
    thinking shows indented under a label, its markers left out, every token still a link."""
    html = answer_html(0, THINKING, RenderOptions(LIGHT))
    assert "Thinking" in html and "&lt;think&gt;" not in html and "&lt;/think&gt;" not in html
    thinking = html[html.index("<blockquote>"):html.index("</blockquote>")]
    assert linked_text(thinking) == {1: "Let", 2: " me", 3: " add", 4: ".", 5: "Two", 6: " twos."}
    assert linked_text(html[html.index("</blockquote>"):]) == {8: "The", 9: " answer", 10: " is", 11: " 4", 12: "."}
    muted = answer_html(0, THINKING, RenderOptions(LIGHT, colouring=False))
    assert f'href="tok:0:2" style="color:{LIGHT.muted}' in muted  # thinking muted where colours are off
    assert f'href="tok:0:10" style="color:{LIGHT.text}' in muted
    links = lambda part: re.findall(r"<a [^>]*>", part)
    assert all("font-style:italic" in link for link in links(thinking))  # the thinking in italics ...
    assert not any("font-style:italic" in link for link in links(html[html.index("</blockquote>"):]))  # ... only


def test_thinking_renders_the_same_in_streamed_parts():
    from app.ui.token_html import answer_part_html

    text, owners = "".join(t.text for t in THINKING), token_owners(THINKING)
    whole = answer_part_html(0, text, owners, THINKING, RenderOptions(LIGHT))
    cut = text.index("Two")  # streaming cuts after a blank line: here inside the thinking
    parts = (answer_part_html(0, text, owners, THINKING, RenderOptions(LIGHT), 0, cut)
             + answer_part_html(0, text, owners, THINKING, RenderOptions(LIGHT), cut))
    assert linked_text(parts) == linked_text(whole) and parts.count("Thinking") == 1
    assert parts.count("<blockquote>") == 2  # each part's thinking in its own block


def test_thinking_opened_by_the_prompt_and_think_tags_in_prose():
    r1_tokens = [tok("Let"), tok(" me"), tok(" add."), tok("\n"), tok("</think>"), tok("\n\nThe"), tok(" answer.")]
    r1 = answer_html(0, r1_tokens, RenderOptions(LIGHT))  # the template opened it: only a </think> on its own line
    assert "Thinking" in r1 and linked_text(r1[r1.index("<blockquote>"):r1.index("</blockquote>")]) == {
        0: "Let", 1: " me", 2: " add."}
    assert linked_text(r1[r1.index("</blockquote>"):]) == {5: "The", 6: " answer."}
    prose = answer_html(0, [tok("Use"), tok(" <think>"), tok(" and"), tok(" </think>"), tok(" tags")], RenderOptions(LIGHT))
    assert "Thinking" not in prose and "&lt;think&gt;" in prose and "&lt;/think&gt;" in prose

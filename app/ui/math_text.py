"""LaTeX math -> readable Unicode text, for answers that write math as \\( ... \\) or \\[ ... \\].

The chat view is Qt rich text, which cannot typeset TeX, and the default models write their
arithmetic in LaTeX: shown raw it reads "\\[ \\text{Eggs} = 16 - 3 \\]". pylatexenc parses the TeX
and writes it as text (× for \\times, a/b for \\frac). On top of that this module adds what chat
math needs: the fraction macros models use, parentheses where a fraction's parts are not single
terms, roots, superscript and subscript digits, and one space around relations and operators
(pylatexenc drops the space after a symbol's macro: "5 ×3").
"""
from __future__ import annotations

import re

from pylatexenc import latexwalker, macrospec
from pylatexenc.latex2text import LatexNodes2Text, MacroTextSpec, get_default_latex_context_db

SUPERSCRIPTS = str.maketrans("0123456789+-=()ni", "⁰¹²³⁴⁵⁶⁷⁸⁹⁺⁻⁼⁽⁾ⁿⁱ")
SUBSCRIPTS = str.maketrans("0123456789+-=()aehijklmnoprstuvx", "₀₁₂₃₄₅₆₇₈₉₊₋₌₍₎ₐₑₕᵢⱼₖₗₘₙₒₚᵣₛₜᵤᵥₓ")
SCRIPT = re.compile(r"(?<!\\)([\^_])\s*(?:\{([^{}]*)\}|([0-9A-Za-z]))")  # x^2, x^{10}, a_{ij}; not \_
DEGREES = re.compile(r"\^\s*(?:\{\s*\\circ\s*\}|\\circ)")
OPERATOR = re.compile(r"\s*([=<>≤≥≈≠≡±∓×÷·→⇒⇔])\s*")
ATOM = re.compile(r"[\w.,%°√∛∜⁰¹²³⁴⁵⁶⁷⁸⁹₀₁₂₃₄₅₆₇₈₉]+|\([^()]*\)")  # needs no parentheses in a/b
FRACTIONS = ("frac", "dfrac", "tfrac", "cfrac")
ROOTS = {"": "√", "2": "√", "3": "∛", "4": "∜"}


def _argument(node, index: int, l2tobj) -> str:
    argument = node.nodeargd.argnlist[index] if node.nodeargd else None
    return l2tobj.nodelist_to_text([argument]).strip() if argument is not None else ""


def _bracketed(part: str) -> str:
    return part if not part or ATOM.fullmatch(part) else f"({part})"


def _fraction(node, l2tobj) -> str:
    return f"{_bracketed(_argument(node, 0, l2tobj))}/{_bracketed(_argument(node, 1, l2tobj))}"


def _root(node, l2tobj) -> str:
    degree = _argument(node, 0, l2tobj)
    return ROOTS.get(degree, degree.translate(SUPERSCRIPTS) + "√") + _bracketed(_argument(node, 1, l2tobj))


def _contexts():
    walker = latexwalker.get_default_latex_context_db()
    walker.add_context_category("chat-math", prepend=True, macros=[
        *(macrospec.MacroSpec(name, "{{") for name in (*FRACTIONS, "binom")), macrospec.MacroSpec("boxed", "{")])
    text = get_default_latex_context_db()
    text.add_context_category("chat-math", prepend=True, macros=[
        *(MacroTextSpec(name, simplify_repl=_fraction) for name in FRACTIONS),
        MacroTextSpec("sqrt", simplify_repl=_root),
        MacroTextSpec("binom", simplify_repl="C(%s, %s)"),
        MacroTextSpec("boxed", discard=False),
    ])
    return walker, text


WALKER_CONTEXT, TEXT_CONTEXT = _contexts()
CONVERTER = LatexNodes2Text(latex_context=TEXT_CONTEXT, math_mode="text")


def _script(match: re.Match) -> str:
    marker, body = match.group(1), match.group(2) if match.group(2) is not None else match.group(3)
    table = SUPERSCRIPTS if marker == "^" else SUBSCRIPTS
    body = body.strip()
    if body and all(char in " " or ord(char) in table for char in body):
        return body.replace(" ", "").translate(table)
    return match.group(0)  # letters Unicode has no script form of: keep the TeX


def _tidy(line: str) -> str:
    line = OPERATOR.sub(r" \1 ", line)
    line = re.sub(r"\(\s+", "(", re.sub(r"\s+\)", ")", line))
    return re.sub(r" {2,}", " ", line).strip()


def math_text(tex: str) -> str:
    """`tex` (the inside of a math span) as Unicode text, a line per row of TeX (rows end at
    \\\\); the TeX itself when it cannot be parsed."""
    scripted = SCRIPT.sub(_script, DEGREES.sub("°", tex.replace("\n", " ")))
    try:
        walker = latexwalker.LatexWalker(scripted, latex_context=WALKER_CONTEXT, tolerant_parsing=True)
        text = CONVERTER.nodelist_to_text(walker.get_latex_nodes()[0])
    except (latexwalker.LatexWalkerError, IndexError, ValueError, TypeError):
        return tex.strip()
    return "\n".join(line for line in map(_tidy, text.split("\n")) if line)

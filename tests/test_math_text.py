"""TeX math -> Unicode text for the chat view."""
import pytest

from app.ui.math_text import math_text


@pytest.mark.parametrize("tex, text", [
    (r" \text{Total eggs} = 16 - 3 - 4 = 9 ", "Total eggs = 16 - 3 - 4 = 9"),
    (r"5 \times 3=15", "5 × 3 = 15"),
    (r"\frac{48}{2} \cdot 3", "48/2 · 3"),
    (r"\dfrac{a+b}{2} \approx \tfrac{1}{3}", "(a+b)/2 ≈ 1/3"),
    (r"\frac{\frac{1}{2}}{3}", "(1/2)/3"),
    (r"\sqrt{16} + \sqrt[3]{27} + \sqrt{a+b}", "√16 + ∛27 + √(a+b)"),
    (r"x^2 + x^{10} - a_1 + a_{ij}", "x² + x¹⁰ - a₁ + aᵢⱼ"),
    (r"e^{\pi} \le 90^\circ", "e^π ≤ 90°"),
    (r"\boxed{18} \quad \$18 \quad 50\%", "18 $18 50%"),
    (r"\left( \frac{3}{4} \right)", "(3/4)"),
    (r"\begin{aligned} a &= 1 \\ b &= 2 \end{aligned}", "a = 1\nb = 2"),
    (r"\binom{5}{2}", "C(5, 2)"),
])
def test_math_reads_as_text(tex, text):
    assert math_text(tex) == text


def test_broken_tex_still_gives_its_text():
    assert math_text(r"\frac{1}{") == "1/"
    assert math_text(r"}{ x") == "x"

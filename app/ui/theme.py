"""Light and dark themes, and the provenance colours (Okabe-Ito: apart for colour-blind eyes)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..engine.api import Source

RESOURCES = Path(__file__).resolve().parents[2] / "resources"


@dataclass(frozen=True)
class Theme:
    name: str
    text: str
    muted: str
    background: str
    user_bubble: str
    code_background: str
    accepted: str
    corrected: str
    bonus: str
    link: str  # action links (copy, edit, regenerate, versions)
    code_style: str = "default"  # the Pygments style of code blocks when provenance colours are off

    def colour(self, source: Source | str) -> str:
        return {Source.ACCEPTED: self.accepted, Source.CORRECTED: self.corrected, Source.BONUS: self.bonus}.get(
            Source(source), self.text)

    def stylesheet(self) -> str:
        path = RESOURCES / "themes" / f"{self.name}.qss"
        # Qt resolves url() against the working directory: images are named from the themes folder.
        return path.read_text().replace("{themes}", path.parent.as_posix()) if path.is_file() else ""


LIGHT = Theme("light", text="#1d1d1f", muted="#8a8a8e", background="#ffffff", user_bubble="#eef1f6",
              code_background="#f5f6f8", accepted="#0072B2", corrected="#D55E00", bonus="#AA3377",
              link="#5a5a60")
DARK = Theme("dark", text="#e8e8ea", muted="#8e8e93", background="#1e1f22", user_bubble="#2b2d31",
             code_background="#26282c", accepted="#56B4E9", corrected="#F0883E", bonus="#E58FC4",
             link="#b8b8be", code_style="one-dark")
THEMES = {"light": LIGHT, "dark": DARK}

# Words for the legend and tooltips; the engine's vocabulary.
SOURCE_HELP = {
    "accepted": "draft token the target accepted",
    "corrected": "target's token in place of a rejected draft token",
    "bonus": "target's extra token after a fully accepted draft",
    "plain": "target token without speculation",
}

"""Presets: a name for a system prompt and the settings an answer is made with (sampling,
speculation, the answer's length and the context it may fill), picked per chat, saved, shared as
JSON files. A few are built in and cannot be deleted or changed."""
from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..engine.api import ProposerKind

FORMAT = "specchat-presets"  # a presets file's kind


class PresetError(ValueError):
    """A presets file that cannot be read or written, or a preset that cannot be changed: in one line."""


class Preset(BaseModel):
    """What a preset sets; the ranges are the window's."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, max_length=80)
    system_prompt: str = ""
    temperature: float = Field(0.0, ge=0.0, le=2.0)
    top_k: int = Field(0, ge=0, le=1000)
    top_p: float = Field(1.0, ge=0.05, le=1.0)
    min_p: float = Field(0.0, ge=0.0, le=0.99)
    repeat_penalty: float = Field(1.1, ge=1.0, le=2.0)
    max_new_tokens: int = Field(512, ge=1, le=8192)
    speculative: bool = True
    proposer: ProposerKind = ProposerKind.DRAFT_MODEL
    k: int = Field(8, ge=1, le=16)
    adaptive: bool = True
    lookup: bool = True
    context_length: int = Field(0, ge=0)  # tokens the chat may fill; 0: the model's maximum


BUILT_IN = (
    Preset(name="Precise", temperature=0.0),
    Preset(name="Creative", temperature=0.9, top_p=0.95, min_p=0.05, max_new_tokens=1024),
    Preset(name="Code", temperature=0.0, max_new_tokens=2048,
           system_prompt="You are an expert programmer. Answer with correct, complete code and short explanations."),
)
BUILT_IN_NAMES = frozenset(preset.name for preset in BUILT_IN)


class PresetBook:
    """The built-in presets and the user's, kept in one JSON file (written whole on each change;
    the window keeps it beside the chats)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.problem = ""  # why the user's presets could not be read at open (the file is then left as it is)
        self.saved: dict[str, Preset] = {}
        if self.path.exists():
            try:
                self.saved = {preset.name: preset for preset in read_presets(self.path)}
            except PresetError as error:
                self.problem = str(error)

    def names(self) -> list[str]:
        return [preset.name for preset in BUILT_IN] + sorted(self.saved, key=str.lower)

    def get(self, name: str) -> Preset | None:
        return next((preset for preset in BUILT_IN if preset.name == name), None) or self.saved.get(name)

    def save(self, preset: Preset) -> None:
        """Adds or replaces a user's preset; a built-in one's name is refused."""
        if preset.name in BUILT_IN_NAMES:
            raise PresetError(f"'{preset.name}' is a built-in preset; save yours under another name.")
        self._write({**self.saved, preset.name: preset})

    def delete(self, name: str) -> None:
        if name in BUILT_IN_NAMES:
            raise PresetError(f"'{name}' is a built-in preset and cannot be deleted.")
        self._write({key: value for key, value in self.saved.items() if key != name})

    def import_file(self, path: Path) -> list[str]:
        """Adds the presets of a file (replacing the user's of the same names; a built-in one's name
        gets ' (imported)'); returns their names."""
        imported = {}
        for preset in read_presets(path):
            name = preset.name + " (imported)" if preset.name in BUILT_IN_NAMES else preset.name
            imported[name] = preset.model_copy(update={"name": name})
        self._write({**self.saved, **imported})
        return list(imported)

    def export_file(self, names: list[str], path: Path) -> None:
        write_presets([self.get(name) for name in names if self.get(name) is not None], path)

    def _write(self, presets: dict[str, Preset]) -> None:
        write_presets(list(presets.values()), self.path)
        self.saved = presets


def read_presets(path: Path) -> list[Preset]:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as error:
        raise PresetError(f"{Path(path).name} cannot be read: {error.strerror or error}") from error
    except ValueError as error:
        raise PresetError(f"{Path(path).name} is not a JSON file: {error}") from error
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("presets"), list):
        raise PresetError(f"{Path(path).name} is not a presets file exported by SpecChat.")
    try:
        return [Preset.model_validate(item) for item in data["presets"]]
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise PresetError(f"{Path(path).name} holds a preset SpecChat cannot use: {where}: {first['msg']}") from error


def write_presets(presets: list[Preset], path: Path) -> None:
    """Writes beside the file and then replaces it, so a full disk leaves the old file whole."""
    text = json.dumps({"format": FORMAT, "version": 1, "presets": [p.model_dump(mode="json") for p in presets]},
                      ensure_ascii=False, indent=1)
    path = Path(path)
    partial = path.with_name(path.name + ".partial")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial.write_text(text, encoding="utf-8")
        partial.replace(path)
    except OSError as error:
        partial.unlink(missing_ok=True)
        raise PresetError(f"The presets could not be saved to {path}: {error.strerror or error}") from error

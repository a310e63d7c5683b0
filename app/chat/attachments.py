"""A text file put into a message: its content as a Markdown code block named after the file, as
a user would paste it. Refused with a clear message when it is not a readable text file."""
from __future__ import annotations

import re
from pathlib import Path

MAX_BYTES = 1 << 20  # about 250,000 tokens: far beyond any default context, and Qt stays responsive

LANGUAGES = {".py": "python", ".js": "javascript", ".ts": "typescript", ".c": "c", ".h": "c", ".cpp": "cpp",
             ".hpp": "cpp", ".cc": "cpp", ".rs": "rust", ".go": "go", ".java": "java", ".kt": "kotlin",
             ".rb": "ruby", ".php": "php", ".cs": "csharp", ".swift": "swift", ".sh": "bash", ".sql": "sql",
             ".html": "html", ".css": "css", ".json": "json", ".yaml": "yaml", ".yml": "yaml", ".toml": "toml",
             ".xml": "xml", ".md": "markdown", ".tex": "latex", ".r": "r", ".lua": "lua"}


class AttachmentError(ValueError):
    pass


def file_block(path: Path) -> str:
    """`name`, then the file's text in a fence longer than any run of backticks inside it."""
    try:
        size = path.stat().st_size
        if path.is_dir():
            raise AttachmentError(f"{path.name} is a folder, not a file")
        if size > MAX_BYTES:
            raise AttachmentError(f"{path.name} is {size / 2**20:.1f} MiB; files up to {MAX_BYTES // 2**20} MiB go into a message")
        data = path.read_bytes()
    except OSError as error:
        raise AttachmentError(f"{path.name} cannot be read: {error.strerror or error}") from error
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        text = None
    if text is None or "\x00" in text:
        raise AttachmentError(f"{path.name} is not a text file (UTF-8)")
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    body = text if text.endswith("\n") or not text else text + "\n"
    return f"`{path.name}`:\n{fence}{LANGUAGES.get(path.suffix.lower(), '')}\n{body}{fence}\n"

"""A file put into a message: its text as a Markdown code block named after the file, as a user
would paste it. Documents (PDF, Word's DOCX, HTML) go in as their text, read by pypdf,
python-docx and Beautiful Soup. Refused with a clear message when there is no text to read."""
from __future__ import annotations

import re
import zipfile
from pathlib import Path

MAX_BYTES = 1 << 20  # about 250,000 tokens: far beyond any default context, and Qt stays responsive
MAX_DOCUMENT_BYTES = 64 << 20  # a document's file (its text is far less: pictures, fonts, layout)
DOCUMENTS = (".pdf", ".docx", ".html", ".htm")

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


HEADER = re.compile(r"^`([^`]+)`( \([^)]*\))?:$")  # the line that names an attached file above its block


def message_title(text: str) -> str:
    """A chat's title from its first message: its first line of the user's own words, outside the
    attached files' blocks ("minutes.pdf" where the message is files alone)."""
    fence, files = None, []
    for line in text.splitlines():
        stripped = line.strip()
        if fence is not None:
            fence = None if stripped == fence else fence
        elif stripped.startswith("```"):
            fence = re.match(r"`+", stripped).group(0)
        elif HEADER.match(stripped):
            files.append(HEADER.match(stripped).group(1))
        elif stripped:
            return stripped[:60]
    return ", ".join(files)[:60] or text.strip()[:60]


def document_block(path: Path) -> tuple[str, str]:
    """(the block to put into the message, what it holds in a few words: "3 pages", "12 KB") for
    a text file or a document. Raises AttachmentError with the reason in one line."""
    suffix = path.suffix.lower()
    if suffix not in DOCUMENTS:
        block = file_block(path)
        return block, _size(path.stat().st_size)
    try:
        if path.is_dir():
            raise AttachmentError(f"{path.name} is a folder, not a file")
        size = path.stat().st_size
        if size > MAX_DOCUMENT_BYTES:
            raise AttachmentError(f"{path.name} is {size / 2**20:.0f} MiB; documents up to "
                                  f"{MAX_DOCUMENT_BYTES // 2**20} MiB go into a message")
        text, holds = (_pdf_text(path) if suffix == ".pdf" else
                       (_docx_text(path), _size(size)) if suffix == ".docx" else (_html_text(path), _size(size)))
    except OSError as error:
        raise AttachmentError(f"{path.name} cannot be read: {error.strerror or error}") from error
    if not text.strip():
        raise AttachmentError(f"{path.name} holds no text")
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"`{path.name}` ({holds}):\n{fence}\n{text.strip()}\n{fence}\n", holds


def _pdf_text(path: Path) -> tuple[str, str]:
    from pypdf import PdfReader
    from pypdf.errors import PdfReadError

    try:
        reader = PdfReader(path)
        if reader.is_encrypted and not reader.decrypt(""):
            raise AttachmentError(f"{path.name} is protected by a password; save a copy without one to attach it")
        pages = [page.extract_text() or "" for page in reader.pages]
    except (PdfReadError, ValueError, KeyError, TypeError) as error:  # pypdf's words for a damaged file vary
        raise AttachmentError(f"{path.name} is not a PDF that can be read ({error})") from error
    holds = f"{len(pages)} page{'s' if len(pages) != 1 else ''}"
    if not any(page.strip() for page in pages):
        raise AttachmentError(f"{path.name} ({holds}) has no text layer: a scanned document's pages are pictures. "
                              "Run text recognition (OCR) on it first, then attach the result")
    return "\n\n".join(page.strip() for page in pages if page.strip()), holds


def _docx_text(path: Path) -> str:
    import docx
    from docx.opc.exceptions import PackageNotFoundError

    try:
        document = docx.Document(str(path))
    except (PackageNotFoundError, zipfile.BadZipFile, KeyError, ValueError) as error:
        raise AttachmentError(f"{path.name} is not a Word document (DOCX) that can be read") from error
    paragraphs = [paragraph.text for paragraph in document.paragraphs]
    for table in document.tables:  # a table's rows, a cell after another
        paragraphs += [" | ".join(cell.text.strip() for cell in row.cells) for row in table.rows]
    return "\n".join(paragraphs)


def _html_text(path: Path) -> str:
    from bs4 import BeautifulSoup

    page = BeautifulSoup(path.read_bytes(), "html.parser")
    for hidden in page(["script", "style", "noscript", "template"]):
        hidden.decompose()
    lines = (line.strip() for line in page.get_text("\n").splitlines())
    return "\n".join(line for line in lines if line)


def _size(size: int) -> str:
    return f"{size:,} bytes" if size < 1024 else f"{size / 1024:.0f} KB" if size < 2**20 else f"{size / 2**20:.1f} MB"

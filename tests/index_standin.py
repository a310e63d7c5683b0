"""A small stand-in for a package index on loopback, as pip and the app's downloader see PyPI:
the simple API's project pages as JSON (PEP 691: each file's address, size and SHA-256) and the
wheels themselves (ranged GET). It can serve a wheel with one byte changed (its published hash
then wrong for what arrives), slow the transfer (to cancel part way) and note the Range headers."""
from __future__ import annotations

import hashlib
import json
import re
import threading
import zipfile
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from urllib.parse import unquote, urlparse

from tests.hub_standin import serve_on_loopback

SIMPLE_JSON = "application/vnd.pypi.simple.v1+json"


@dataclass
class Index:
    wheels: dict[str, Path] = field(default_factory=dict)  # project name -> its wheel
    damaged: set[str] = field(default_factory=set)  # project names whose wheel is served with a byte changed
    throttle: float = 0.0  # seconds between 64 kB pieces of a wheel
    ranges: list[str] = field(default_factory=list)
    _hashes: dict[Path, str] = field(default_factory=dict)

    def start(self) -> str:
        """Serves until stop(); returns the simple index's address (as SPECCHAT_MODELS_INDEX)."""
        self.server = serve_on_loopback(self.answer)
        return f"http://127.0.0.1:{self.server.server_address[1]}/simple"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def answer(self, request: BaseHTTPRequestHandler) -> None:
        path = unquote(urlparse(request.path).path)
        match = re.fullmatch(r"/simple/([^/]+)/", path)
        if match and match.group(1) in self.wheels:
            wheel = self.wheels[match.group(1)]
            page = {"meta": {"api-version": "1.1"}, "name": match.group(1), "files": [{
                "filename": wheel.name, "url": f"../../files/{wheel.name}", "size": wheel.stat().st_size,
                "hashes": {"sha256": self._sha256(wheel)}}]}
            payload = json.dumps(page).encode()
            request.send_response(200)
            request.send_header("Content-Type", SIMPLE_JSON)
            request.send_header("Content-Length", str(len(payload)))
            request.end_headers()
            request.wfile.write(payload)
            return
        match = re.fullmatch(r"/files/([^/]+)", path)
        project = next((name for name, wheel in self.wheels.items() if match and wheel.name == match.group(1)), None)
        if project is None:
            request.send_response(404)
            request.send_header("Content-Length", "0")
            request.end_headers()
            return
        self._file(request, self.wheels[project], project in self.damaged)

    def _file(self, request: BaseHTTPRequestHandler, wheel: Path, damaged: bool) -> None:
        size = wheel.stat().st_size
        start = 0
        wanted = request.headers.get("Range")
        if wanted:
            self.ranges.append(wanted)
            start = int(re.fullmatch(r"bytes=(\d+)-", wanted).group(1))
        request.send_response(206 if start else 200)
        request.send_header("Content-Length", str(size - start))
        if start:
            request.send_header("Content-Range", f"bytes {start}-{size - 1}/{size}")
        request.end_headers()
        try:
            with wheel.open("rb") as file:
                file.seek(start)
                first = True
                while piece := file.read(1 << 16):
                    if damaged and first and start == 0:
                        piece = bytes([piece[0] ^ 0xFF]) + piece[1:]
                    first = False
                    request.wfile.write(piece)
                    if self.throttle:
                        threading.Event().wait(self.throttle)
        except (BrokenPipeError, ConnectionResetError):  # the client cancelled
            return

    def _sha256(self, wheel: Path) -> str:
        if wheel not in self._hashes:
            digest = hashlib.sha256()
            with wheel.open("rb") as file:
                while chunk := file.read(1 << 20):
                    digest.update(chunk)
            self._hashes[wheel] = digest.hexdigest()
        return self._hashes[wheel]


def part_wheels(packaged, parts: list[Path], folder: Path) -> dict[str, Path]:
    """Wheels as the `models` extra's parts are published: one per part, the part at
    `<module>/data/partNN.bin` (stored: a GGUF does not compress)."""
    wheels = {}
    for index, part in enumerate(parts, 1):
        module = f"{packaged.package_prefix}{index}"
        wheel = folder / f"{module}-{packaged.version}-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w", zipfile.ZIP_STORED) as archive:
            archive.writestr(f"{module}/__init__.py", "")
            archive.write(part, f"{module}/data/part{index:02d}.bin")
            archive.writestr(f"{module}-{packaged.version}.dist-info/METADATA",
                             f"Metadata-Version: 2.1\nName: {packaged.pip_name}{index}\nVersion: {packaged.version}\n")
        wheels[f"{packaged.pip_name}{index}"] = wheel
    return wheels


def split(path: Path, count: int, folder: Path) -> list[Path]:
    """The file cut into `count` parts, as the default models are published."""
    data = path.read_bytes()
    size = -(-len(data) // count)
    parts = []
    for index in range(count):
        part = folder / f"part{index + 1:02d}.bin"
        part.write_bytes(data[index * size:(index + 1) * size])
        parts.append(part)
    return parts

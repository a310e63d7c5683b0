"""A small stand-in for the Hugging Face hub on loopback, in the hub's URL layout, for the real
`huggingface_hub` client (HF_ENDPOINT points at it): search (`/api/models`), a repository's files
with sizes and hashes (`/api/models/<id>?blobs=True`), and files (`/<id>/resolve/<revision>/<name>`,
HEAD and ranged GET). It can drop a connection part way through a file, serve bytes that do not
match the hash it announced, refuse a gated repository (401) and say 404 as the hub does."""
from __future__ import annotations

import hashlib
import json
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlparse

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@dataclass
class Repo:
    files: dict[str, bytes]
    model_type: str = "qwen2"
    gated: bool = False
    downloads: int = 1000


@dataclass
class Hub:
    repos: dict[str, Repo] = field(default_factory=dict)
    drop_after: dict[str, int] = field(default_factory=dict)  # file name -> bytes sent before the connection drops (once)
    damaged: set[str] = field(default_factory=set)  # file names served with one byte changed
    throttle: float = 0.0  # seconds between 64 kB pieces of a file (to cancel a download part way)
    ranges: list[str] = field(default_factory=list)  # the Range headers file requests carried

    def start(self) -> str:
        self.server = serve_on_loopback(lambda request: self.answer(request, body=True),
                                        lambda request: self.answer(request, body=False))
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    # --- the hub's answers

    def answer(self, request: BaseHTTPRequestHandler, body: bool) -> None:
        url = urlparse(request.path)
        path, query = unquote(url.path), parse_qs(url.query)
        if path == "/api/models":
            words = query.get("search", [""])[0].lower()
            found = [self._listing(repo_id, repo) for repo_id, repo in self.repos.items() if words in repo_id.lower()]
            return self._json(request, found[: int(query.get("limit", ["1000"])[0])], body)
        match = re.fullmatch(r"/api/models/([^/]+/[^/]+)(?:/revision/[^/]+)?", path)
        if match:
            repo = self.repos.get(match.group(1))
            if repo is None:
                return self._error(request, 404, "RepoNotFound", body)
            return self._json(request, self._info(match.group(1), repo), body)
        match = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
        if match:
            return self._file(request, match.group(1), match.group(3), body)
        self._error(request, 404, None, body)

    def _listing(self, repo_id: str, repo: Repo) -> dict:
        return {"id": repo_id, "modelId": repo_id, "gated": repo.gated, "downloads": repo.downloads,
                "config": {"model_type": repo.model_type}, "siblings": [{"rfilename": name} for name in repo.files]}

    def _info(self, repo_id: str, repo: Repo) -> dict:
        siblings = [{"rfilename": name, "size": len(data), "blobId": _git_hash(data),
                     "lfs": {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}}
                    for name, data in repo.files.items()]
        return {**self._listing(repo_id, repo), "sha": COMMIT, "siblings": siblings}

    def _file(self, request: BaseHTTPRequestHandler, repo_id: str, name: str, body: bool) -> None:
        repo = self.repos.get(repo_id)
        if repo is None:
            return self._error(request, 404, "RepoNotFound", body)
        if repo.gated:
            return self._error(request, 401, "GatedRepo", body)
        data = repo.files.get(name)
        if data is None:
            return self._error(request, 404, "EntryNotFound", body)
        etag = hashlib.sha256(data).hexdigest()
        if name in self.damaged:
            data = bytes([data[0] ^ 0xFF]) + data[1:]
        start = 0
        wanted = request.headers.get("Range")
        if body and wanted:
            self.ranges.append(wanted)
            start = int(re.fullmatch(r"bytes=(\d+)-", wanted).group(1))
        request.send_response(206 if start else 200)
        request.send_header("ETag", f'"{etag}"')
        request.send_header("X-Repo-Commit", COMMIT)
        request.send_header("Content-Length", str(len(data) - start))
        if start:
            request.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        request.send_header("Accept-Ranges", "bytes")
        request.end_headers()
        if not body:
            return
        cut = self.drop_after.pop(name, None)
        end = len(data) if cut is None else max(start, cut)
        try:
            for piece in range(start, end, 1 << 16):
                request.wfile.write(data[piece : min(piece + (1 << 16), end)])
                request.wfile.flush()
                if self.throttle:
                    threading.Event().wait(self.throttle)
        except (BrokenPipeError, ConnectionResetError):  # the client cancelled
            return
        if cut is not None:  # the connection drops part way through the file
            request.close_connection = True
            request.connection.shutdown(2)

    def _json(self, request: BaseHTTPRequestHandler, value, body: bool) -> None:
        payload = json.dumps(value).encode()
        request.send_response(200)
        request.send_header("Content-Type", "application/json")
        request.send_header("Content-Length", str(len(payload)))
        request.end_headers()
        if body:
            request.wfile.write(payload)

    def _error(self, request: BaseHTTPRequestHandler, status: int, code: str | None, body: bool) -> None:
        payload = json.dumps({"error": code or "Not Found"}).encode()
        request.send_response(status)
        if code:
            request.send_header("X-Error-Code", code)
        request.send_header("Content-Type", "application/json")
        request.send_header("Content-Length", str(len(payload)))
        request.end_headers()
        if body:
            request.wfile.write(payload)


def serve_on_loopback(get: Callable[[BaseHTTPRequestHandler], None],
                      head: Callable[[BaseHTTPRequestHandler], None] | None = None) -> ThreadingHTTPServer:
    """An HTTP/1.1 server on a free loopback port, each request on a thread of its own, answered by
    `get` (and `head`); serving until its shutdown()."""
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:
            pass

        def do_GET(self) -> None:
            get(self)

        if head is not None:
            def do_HEAD(self) -> None:
                head(self)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def chat_gguf(path, seed: int, layers: int = 2, width: int = 256, inner: int = 1024, architecture: str = "qwen2"):
    """A tiny Q8_0 GGUF (Qwen2, or another family the loader reads) that chats: random weights and a
    real byte-level BPE tokenizer in the file (trained here on a few sentences), as a hub's GGUF
    repository holds one. Models written with the same tokenizer can pair as target and draft."""
    import numpy as np
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast

    from app.engine.lowbit import gguf_writing

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(["hello there, how are you today?", "the quick brown fox jumps over the lazy dog",
                             "def add(a, b): return a + b"], vocab_size=300, special_tokens=["<|endoftext|>"],
                            show_progress=False)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, eos_token="<|endoftext|>")
    words = path.with_name(path.name + ".words")
    gguf_writing.write_tokenizer(words, tokenizer)
    rng = np.random.default_rng(seed)
    weight = lambda name, shape: (quantize((rng.standard_normal(shape) * 0.2).astype(np.float32),
                                           GGMLQuantizationType.Q8_0), GGMLQuantizationType.Q8_0)
    norm = lambda n: (1 + 0.3 * rng.standard_normal(n)).astype(np.float32)
    vocabulary = -(-len(tokenizer) // 32) * 32  # padded, as converters pad the embedding rows
    shape = gguf_writing.Shape(layers, width, inner, 4, 2, width // 4, vocabulary, rope_base=10000.0, context=512)
    gguf_writing.write(path, architecture, shape, weight, norm, tied=False, tokenizer_from=words)
    words.unlink()
    return path


def _git_hash(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()

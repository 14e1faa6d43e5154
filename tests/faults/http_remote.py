"""A real HTTP DVC remote on 127.0.0.1 that can stop answering: HEAD and GET serve the objects under a folder,
POST stores one (chunked or sized bodies, as DVC's aiohttp client sends them). While ``hanging`` is set it reads
each request and never answers, as a server whose disk or backend is stuck does; the connection stays open."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: HTTPRemote

    def log_message(self, *args) -> None:  # quiet
        pass

    def _file(self) -> Path | None:
        rel = self.path.split("?", 1)[0].lstrip("/")
        target = (self.server.root / rel).resolve()
        return target if self.server.root.resolve() in target.parents else None

    def _stalled(self) -> bool:
        """Hold the request while the server hangs; True when it should go unanswered."""
        self.server.requests += 1
        if not self.server.hanging.is_set():
            return False
        self.server.held += 1
        while self.server.hanging.is_set() and not self.server.closing.wait(0.2):
            pass  # the client gives up or is killed first, or the server comes back: the request goes unanswered
        self.close_connection = True
        return True

    def _answer(self, code: int, body: bytes = b"", length: int | None = None) -> None:
        self.send_response(code)
        self.send_header("Content-Length", str(len(body) if length is None else length))
        self.end_headers()
        if body:
            self.wfile.write(body)

    def _read(self, with_body: bool) -> None:
        """HEAD (size only) and GET (the object) of one stored object."""
        if self._stalled():
            return
        f = self._file()
        if f is None or not f.is_file():
            self._answer(404)
        elif with_body:
            self._answer(200, f.read_bytes())
        else:
            self._answer(200, length=f.stat().st_size)

    def do_HEAD(self) -> None:
        self._read(with_body=False)

    def do_GET(self) -> None:
        self._read(with_body=True)

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            parts = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):  # trailers
                        pass
                    return b"".join(parts)
                parts.append(self.rfile.read(size))
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length", "0")))

    def do_POST(self) -> None:
        body = self._body()
        if self._stalled():
            return
        f = self._file()
        if f is None:
            self._answer(403)
            return
        f.parent.mkdir(parents=True, exist_ok=True)
        tmp = f.with_name(f".{f.name}.{threading.get_ident()}.tmp")
        tmp.write_bytes(body)
        os.replace(tmp, f)
        self._answer(200)

    do_PUT = do_POST


class HTTPRemote(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, root: Path) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.root = root
        self.hanging = threading.Event()
        self.closing = threading.Event()
        self.requests = 0  # every request seen
        self.held = 0  # requests left unanswered while hanging

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


@contextmanager
def http_remote(root: Path) -> Iterator[HTTPRemote]:
    root.mkdir(parents=True, exist_ok=True)
    server = HTTPRemote(root)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.closing.set()
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)

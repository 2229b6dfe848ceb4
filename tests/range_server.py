"""A small threaded HTTP server with Range support, on 127.0.0.1, for the remote tests and the benchmark.

It serves the files of one folder (``/PATH``), answers single byte ranges (``bytes=A-B``, ``bytes=A-``,
``bytes=-N``) with 206 and ``Content-Range``, sends a strong ETag, honours ``If-Match`` (412), and
counts requests and bytes sent. It can also play a Hugging Face Hub for ``huggingface_hub`` reached
through ``HF_ENDPOINT`` (``hub``): ``HEAD/GET /ORG/REPO/resolve/REV/PATH``, ``/api/models/ORG/REPO/tree/REV``
and ``/api/models/ORG/REPO/revision/REV``, where ``REPO``'s files are the folder ``ORG/REPO`` and the
commit is fixed. Options: no ranges (the whole file, 200), latency per request, a bandwidth cap, an
answer of 429 first (backoff), a token every request must carry, folder listings (``listings``: a folder's
URL answers with an HTML index as nginx's ``autoindex`` does, and without its ``/`` with a 301 to it), and a
CDN (``cdn``: another server's URL) that the Hub's resolve redirects its files to, as huggingface.co does for
LFS files: a 302 naming the file's sha256 (``X-Linked-Etag``), size (``X-Linked-Size``) and commit, where the
CDN answers with its own ETag.
"""

from __future__ import annotations

import hashlib
import html
import json
import os
import re
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

COMMIT = "0123456789abcdef0123456789abcdef01234567"
_RANGE = re.compile(r"bytes=(\d*)-(\d*)$")


@dataclass
class Served:
    """What the server was asked: each request's method, path and byte range, and bytes sent."""

    requests: list[tuple[str, str, str]] = field(default_factory=list)
    bytes_sent: int = 0
    active: int = 0
    most_active: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def reset(self) -> None:
        with self.lock:
            self.requests.clear()
            self.bytes_sent = 0
            self.most_active = 0

    def ranged(self) -> list[tuple[str, str, str]]:
        """The GETs of file bytes (not the Hub's API calls)."""
        return [r for r in self.requests if r[0] == "GET" and "/api/" not in r[1]]


class RangeServer:
    """Serve ``root`` on 127.0.0.1 (a free port) until :meth:`stop`."""

    def __init__(
        self,
        root: str,
        *,
        ranges: bool = True,
        latency: float = 0.0,
        bandwidth: float = 0.0,
        throttle_first: int = 0,
        token: str | None = None,
        cdn: str | None = None,
        signed_uses: int | None = None,
        listings: bool = False,
    ) -> None:
        self.root = root
        self.listings = listings
        self.cdn = cdn
        self.signed_uses = signed_uses
        """As a CDN: the requests one signed link (``?signature=N``) answers before it is refused (403: expired)."""
        # (links issued by the Hub's server are counted there; answers given by the CDN's, here)
        self.signatures: dict[str, int] = {}
        self.ranges = ranges
        self.latency = latency
        self.bandwidth = bandwidth
        self.throttle_left = throttle_first
        self.token = token
        self.served = Served()
        self.etags: dict[str, str] = {}
        self.commits: dict[str, str] = {}
        """The repo folder of each commit served (a commit is a hash of its folder's name)."""
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_HEAD(self) -> None:
                server._answer(self, head=True)

            def do_GET(self) -> None:
                server._answer(self, head=False)

        class Quiet(ThreadingHTTPServer):
            def handle_error(self, request: Any, client_address: Any) -> None:
                pass  # (a client hanging up on a kept-alive connection: no traceback on the test's stderr)

        self._httpd = Quiet(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        """The server's base URL."""
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def stop(self) -> None:
        """Stop serving and close the socket."""
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join()

    def __enter__(self) -> RangeServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def etag(self, path: str) -> str:
        """A strong ETag from the file's size and mtime."""
        info = os.stat(path)
        return '"' + hashlib.sha1(f"{path}:{info.st_size}:{info.st_mtime_ns}".encode()).hexdigest()[:20] + '"'

    def _answer(self, handler: BaseHTTPRequestHandler, head: bool) -> None:
        served = self.served
        with served.lock:
            served.active += 1
            served.most_active = max(served.most_active, served.active)
        try:
            if self.latency:
                time.sleep(self.latency)
            self._route(handler, head)
        finally:
            with served.lock:
                served.active -= 1

    def _route(self, handler: BaseHTTPRequestHandler, head: bool) -> None:
        parsed = urllib.parse.urlsplit(handler.path)
        path = urllib.parse.unquote(parsed.path)
        with self.served.lock:
            if self.throttle_left > 0:
                self.throttle_left -= 1
                throttled = True
            else:
                throttled = False
            self.served.requests.append((handler.command, path, handler.headers.get("Range", "")))
        if throttled:
            return self._send(handler, 429, {"Retry-After": "0"}, b"slow down")
        if self.signed_uses is not None:
            with self.served.lock:
                used = self.signatures.get(parsed.query, 0)
                if used < self.signed_uses:
                    self.signatures[parsed.query] = used + 1
            if used >= self.signed_uses:
                return self._send(handler, 403, {}, b"AccessDenied: Request has expired")
        if self.token is not None and handler.headers.get("Authorization") != f"Bearer {self.token}":
            return self._send(handler, 401, {}, b"unauthorized")
        hub = re.match(r"^/api/models/([^/]+/[^/]+)/(tree|revision)/([^/]+)(/.*)?$", path)
        if hub:
            return self._hub_api(handler, self._repo(hub.group(1), hub.group(3)), hub.group(2))
        resolve = re.match(r"^/([^/]+/[^/]+)/resolve/([^/]+)/(.+)$", path)
        if resolve:
            folder = self._repo(resolve.group(1), resolve.group(2))
            file = os.path.join(self.root, folder, resolve.group(3))
            if self.cdn is not None and os.path.isfile(file):
                return self._to_cdn(handler, folder, resolve.group(3), file)
            return self._file(handler, file, head, {"X-Repo-Commit": self._commit(folder)})
        local = os.path.join(self.root, path.lstrip("/"))
        if self.listings and os.path.isdir(local):
            return self._listing(handler, path, local)
        return self._file(handler, local, head, {})

    def _listing(self, handler: BaseHTTPRequestHandler, path: str, folder: str) -> None:
        """nginx's autoindex: a folder's URL without its ``/`` moves to it; with it, an HTML index of the entries
        (``../`` first, folders with a trailing ``/``), names percent-encoded in links and escaped in text."""
        if not path.endswith("/"):
            return self._send(handler, 301, {"Location": urllib.parse.quote(path) + "/"}, b"")
        rows = ['<a href="../">../</a>']
        for name in sorted(os.listdir(folder)):
            shown = name + "/" if os.path.isdir(os.path.join(folder, name)) else name
            rows.append(f'<a href="{urllib.parse.quote(shown)}">{html.escape(shown)}</a>  {os.path.getsize(folder)}')
        title = f"Index of {html.escape(path)}"
        body = f"<html><head><title>{title}</title></head><body><h1>{title}</h1><hr><pre>{chr(10).join(rows)}</pre>"
        return self._send(handler, 200, {"Content-Type": "text/html"}, (body + "<hr></body></html>").encode())

    def _signed(self) -> int:
        """A new signature for a link to the CDN."""
        with self.served.lock:
            self.signatures["issued"] = self.signatures.get("issued", 0) + 1
            return self.signatures["issued"]

    def _to_cdn(self, handler: BaseHTTPRequestHandler, folder: str, name: str, file: str) -> None:
        """The Hub's answer for an LFS file: a redirect to the CDN, the file's sha256 as its linked ETag."""
        with open(file, "rb") as data:
            digest = hashlib.sha256(data.read()).hexdigest()
        link = f"{self.cdn}/{urllib.parse.quote(folder)}/{urllib.parse.quote(name)}"
        headers = {
            "Location": f"{link}?signature={self._signed()}",
            "X-Repo-Commit": self._commit(folder),
            "X-Linked-Etag": f'"{digest}"',
            "X-Linked-Size": str(os.path.getsize(file)),
            "ETag": f'"{digest}"',
        }
        return self._send(handler, 302, headers, b"")

    def _repo(self, repo: str, revision: str) -> str:
        """The folder of a repo at a revision (or at a commit served before): ``ORG/REPO@REV`` when there
        is one, else ``ORG/REPO``."""
        revision = urllib.parse.unquote(revision)
        if revision in self.commits:
            return self.commits[revision]
        pinned = f"{repo}@{revision}"
        return pinned if os.path.isdir(os.path.join(self.root, pinned)) else repo

    def served_commit(self, folder: str) -> str:
        """The commit a repo folder is served at."""
        return hashlib.sha1(folder.encode()).hexdigest()

    def _commit(self, folder: str) -> str:
        commit = hashlib.sha1(folder.encode()).hexdigest()
        self.commits[commit] = folder
        return commit

    def _hub_api(self, handler: BaseHTTPRequestHandler, repo: str, what: str) -> None:
        folder = os.path.join(self.root, repo)
        if not os.path.isdir(folder):
            return self._send(handler, 404, {"X-Error-Code": "RepoNotFound"}, b'{"error":"Repository not found"}')
        if what == "revision":
            body = json.dumps({"id": repo, "sha": COMMIT, "siblings": []}).encode()
            return self._send(handler, 200, {"Content-Type": "application/json"}, body)
        entries = []
        for base, _, names in os.walk(folder):
            for name in sorted(names):
                full = os.path.join(base, name)
                relative = os.path.relpath(full, folder).replace(os.sep, "/")
                entries.append({"type": "file", "path": relative, "size": os.path.getsize(full), "oid": "0" * 40})
        body = json.dumps(entries).encode()
        return self._send(handler, 200, {"Content-Type": "application/json"}, body)

    def _file(self, handler: BaseHTTPRequestHandler, file: str, head: bool, extra: dict[str, str]) -> None:
        if not os.path.isfile(file):
            return self._send(handler, 404, {"X-Error-Code": "EntryNotFound"}, b"not found")
        size = os.path.getsize(file)
        etag = self.etag(file)
        headers = {"ETag": etag, "Accept-Ranges": "bytes" if self.ranges else "none", **extra}
        match = handler.headers.get("If-Match")
        if match is not None and match != etag:
            return self._send(handler, 412, headers, b"precondition failed")
        wanted = _RANGE.match(handler.headers.get("Range", "")) if self.ranges else None
        if head:
            headers["Content-Length"] = str(size)
            return self._send(handler, 200, headers, b"", length=size)
        if wanted is None:
            return self._send_file(handler, 200, headers, file, 0, size)
        first, last = wanted.groups()
        if first == "":
            start, stop = max(0, size - int(last or 0)), size
        else:
            start, stop = int(first), min(size, int(last) + 1 if last else size)
        if start >= size or stop <= start:
            return self._send(handler, 416, {**headers, "Content-Range": f"bytes */{size}"}, b"")
        headers["Content-Range"] = f"bytes {start}-{stop - 1}/{size}"
        return self._send_file(handler, 206, headers, file, start, stop - start)

    def _send_file(
        self, handler: BaseHTTPRequestHandler, status: int, headers: dict[str, str], file: str, start: int, count: int
    ) -> None:
        handler.send_response(status)
        for name, value in {**headers, "Content-Length": str(count)}.items():
            handler.send_header(name, value)
        handler.end_headers()
        began = time.monotonic()
        sent = 0
        with open(file, "rb") as source:
            source.seek(start)
            while sent < count:
                data = source.read(min(1 << 20, count - sent))
                if not data:
                    break
                try:
                    handler.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    break
                sent += len(data)
                with self.served.lock:
                    self.served.bytes_sent += len(data)
                if self.bandwidth:
                    ahead = sent / self.bandwidth - (time.monotonic() - began)
                    if ahead > 0:
                        time.sleep(ahead)

    def _send(
        self, handler: BaseHTTPRequestHandler, status: int, headers: dict[str, str], body: bytes, length: int = -1
    ) -> None:
        handler.send_response(status)
        for name, value in headers.items():
            handler.send_header(name, value)
        if "Content-Length" not in headers:
            handler.send_header("Content-Length", str(len(body) if length < 0 else length))
        handler.end_headers()
        if body:
            handler.wfile.write(body)
        with self.served.lock:
            self.served.bytes_sent += len(body)

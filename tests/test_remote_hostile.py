"""A hostile web server on 127.0.0.1: every way it can lie about a ranged read is one clear line (exit 2),
never a hang, a traceback, memory the server chooses, or bytes mixed from two versions of a file."""

from __future__ import annotations

import contextlib
import io
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import torch

from ckpt_tui.cli import main
from ckpt_tui.core.model import byte_source, remote, remote_stores

LAST_MODIFIED = "Tue, 01 Sep 2026 10:00:00 GMT"


def saved(value: Any) -> bytes:
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


# two versions of one file, of one size: uint8 0..199, then int8 -3..3 (over 64 kB: read in several ranges)
VERSION_A = saved({"w": (torch.arange(100_000) % 200).to(torch.uint8)})
VERSION_B = saved({"w": (torch.arange(100_000) % 7 - 3).to(torch.int8)})
assert len(VERSION_A) == len(VERSION_B) > remote.TAIL


class QuietServer(ThreadingHTTPServer):
    """A client hanging up on a lie is what the tests want: no traceback for it on stderr."""

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass


class Hostile:
    """A server whose answers ``answer(handler, start, end, count)`` writes (``count``: requests so far)."""

    def __init__(self, answer: Callable[[BaseHTTPRequestHandler, int, int, int], None]) -> None:
        self.count = 0
        hostile = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                hostile.count += 1
                start, end = asked(self.headers.get("Range", ""), len(VERSION_A))
                # the client hanging up on a trickle is what it should do
                with contextlib.suppress(OSError):
                    answer(self, start, end, hostile.count)

        self._httpd = QuietServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._thread.start()
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}/ckpt.pth"

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join()


def asked(header: str, size: int) -> tuple[int, int]:
    """The first and last byte a Range header asks for (a suffix range counted from the end)."""
    suffix = re.fullmatch(r"bytes=-(\d+)", header)
    if suffix:
        return max(0, size - int(suffix.group(1))), size - 1
    found = re.fullmatch(r"bytes=(\d+)-(\d+)", header)
    assert found, header
    return int(found.group(1)), min(int(found.group(2)), size - 1)


def partial(
    handler: BaseHTTPRequestHandler,
    data: bytes,
    start: int,
    end: int,
    *,
    headers: dict[str, str] | None = None,
    length: int | None = None,
    body: bytes | None = None,
) -> None:
    """A 206 for ``data[start:end+1]``, its headers overridable, its body replaceable."""
    sent = data[start : end + 1] if body is None else body
    handler.send_response(206)
    fields = {"Content-Range": f"bytes {start}-{end}/{len(data)}", "Content-Length": str(len(sent))}
    fields |= {"ETag": '"v1"'} | (headers or {})
    if length is not None:
        fields["Content-Length"] = str(length)
    for name, value in fields.items():
        if value:
            handler.send_header(name, value)
    handler.end_headers()
    handler.wfile.write(sent)


def honest_headers(handler: BaseHTTPRequestHandler, start: int, end: int) -> None:
    """The headers of a true 206 for ``VERSION_A[start:end+1]`` (the body is the test's to send)."""
    handler.send_response(206)
    handler.send_header("Content-Range", f"bytes {start}-{end}/{len(VERSION_A)}")
    handler.send_header("Content-Length", str(end - start + 1))
    handler.send_header("ETag", '"v1"')
    handler.end_headers()


@pytest.fixture(autouse=True)
def fresh_remote(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No remote file known, an empty header cache, and a 1 s grace so a trickle is caught quickly."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(remote, "TRANSFER", remote.Transfer())
    monkeypatch.setattr(remote_stores, "TIMEOUT", 1.0)
    monkeypatch.setattr(remote_stores, "MIN_RATE", 1 << 20)
    byte_source._opened_stores.clear()
    yield
    byte_source._opened_stores.clear()


def refused(answer: Callable[[BaseHTTPRequestHandler, int, int, int], None], capsys: pytest.CaptureFixture[str]) -> str:
    """``check URL`` against the server: exit 2, one line on stderr (returned), within a bounded time."""
    server = Hostile(answer)
    try:
        started = time.monotonic()
        assert main(["check", server.url]) == 2
        # a hang guard, not a timing: the server alone would hold the read for minutes
        assert time.monotonic() - started < 60
    finally:
        server.stop()
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


def test_a_server_that_trickles_its_body_is_refused_once_too_slow(capsys: pytest.CaptureFixture[str]) -> None:
    def answer(handler: BaseHTTPRequestHandler, start: int, end: int, count: int) -> None:
        honest_headers(handler, start, end)
        for byte in VERSION_A[start : end + 1]:
            handler.wfile.write(bytes([byte]))
            handler.wfile.flush()
            time.sleep(0.2)  # every read answers well within the socket timeout

    assert "too slowly" in refused(answer, capsys)


def test_a_server_that_trickles_its_headers_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    def answer(handler: BaseHTTPRequestHandler, start: int, end: int, count: int) -> None:
        handler.wfile.write(b"HTTP/1.1 206 Partial Content\r\n")
        for index in range(1000):
            handler.wfile.write(f"X-Pad-{index}: 1\r\n".encode())
            handler.wfile.flush()
            time.sleep(0.2)

    assert "did not answer within" in refused(answer, capsys)


@pytest.mark.parametrize("length", [10**15, 1407 + (300 << 20)])
def test_a_content_length_the_range_does_not_name_is_refused(length: int, capsys: pytest.CaptureFixture[str]) -> None:
    def answer(handler: BaseHTTPRequestHandler, start: int, end: int, count: int) -> None:
        partial(handler, VERSION_A, start, end, length=length)

    assert "Content-Length" in refused(answer, capsys)


def test_a_body_longer_than_its_range_is_never_read_past_it(capsys: pytest.CaptureFixture[str]) -> None:
    # no Content-Length: the body runs on to the connection's close; the range's bytes alone are taken
    def answer(handler: BaseHTTPRequestHandler, start: int, end: int, count: int) -> None:
        handler.close_connection = True
        handler.send_response(206)
        handler.send_header("Content-Range", f"bytes {start}-{end}/{len(VERSION_A)}")
        handler.send_header("ETag", '"v1"')
        handler.end_headers()
        handler.wfile.write(VERSION_A[start : end + 1] + b"\0" * (1 << 20))

    server = Hostile(answer)
    try:
        assert main(["check", server.url]) == 0
    finally:
        server.stop()
    assert "1 tensor read: OK" in capsys.readouterr().out


def test_a_compressed_answer_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    def answer(handler: BaseHTTPRequestHandler, start: int, end: int, count: int) -> None:
        partial(handler, VERSION_A, start, end, headers={"Content-Encoding": "gzip"})

    assert "Content-Encoding: gzip" in refused(answer, capsys)


@pytest.mark.parametrize("etag", ["", 'W/"stable"'])
def test_a_file_with_no_version_to_check_ranges_against_is_refused(
    etag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # version A first, B after: without a strong ETag or Last-Modified nothing can tell them apart
    def answer(handler: BaseHTTPRequestHandler, start: int, end: int, count: int) -> None:
        partial(handler, VERSION_A if count == 1 else VERSION_B, start, end, headers={"ETag": etag})

    assert "names no version of the file" in refused(answer, capsys)


@pytest.mark.parametrize("etag", ["", 'W/"stable"'])
def test_a_small_file_read_in_one_answer_needs_no_version(etag: str, capsys: pytest.CaptureFixture[str]) -> None:
    small = saved({"w": torch.arange(10)})

    def answer(handler: BaseHTTPRequestHandler, start: int, end: int, count: int) -> None:
        start = max(0, len(small) - (end - start + 1)) if count == 1 else start
        partial(handler, small, start, min(end, len(small) - 1), headers={"ETag": etag})

    server = Hostile(answer)
    try:
        assert main(["check", server.url]) == 0
    finally:
        server.stop()
    assert server.count == 1


def test_a_file_whose_last_modified_changes_between_ranges_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    def answer(handler: BaseHTTPRequestHandler, start: int, end: int, count: int) -> None:
        data, stamp = (VERSION_A, LAST_MODIFIED) if count == 1 else (VERSION_B, "Wed, 02 Sep 2026 10:00:00 GMT")
        partial(handler, data, start, end, headers={"ETag": "", "Last-Modified": stamp})

    assert "changed while being read" in refused(answer, capsys)


def test_a_file_whose_size_changes_between_ranges_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    longer = VERSION_B + b"\0" * 100

    def answer(handler: BaseHTTPRequestHandler, start: int, end: int, count: int) -> None:
        data = VERSION_A if count == 1 else longer
        partial(handler, data, start, end, headers={"ETag": "", "Last-Modified": LAST_MODIFIED})

    assert "changed while being read" in refused(answer, capsys)


def test_a_server_that_hangs_up_mid_body_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    def answer(handler: BaseHTTPRequestHandler, start: int, end: int, count: int) -> None:
        honest_headers(handler, start, end)
        handler.wfile.write(VERSION_A[start : start + 10])
        handler.wfile.flush()
        handler.connection.shutdown(socket.SHUT_RDWR)

    line = refused(answer, capsys)
    assert "connection failed" in line or "ended after" in line


# ---- a 416, and a whole file sent for a range ----------------------------------------------------------------


def unsatisfiable(handler: BaseHTTPRequestHandler, length: int | None) -> None:
    """A 416, naming the file's length as RFC 9110 asks (``bytes */LENGTH``) or not at all."""
    handler.send_response(416)
    if length is not None:
        handler.send_header("Content-Range", f"bytes */{length}")
    handler.send_header("Content-Length", "0")
    handler.end_headers()


def test_a_416_that_names_no_length_is_one_line_that_does_not_blame_the_file(
    capsys: pytest.CaptureFixture[str],
) -> None:
    line = refused(lambda handler, start, end, count: unsatisfiable(handler, None), capsys)
    assert "refused the range bytes=-65536 (HTTP 416)" in line and "changed" not in line and "empty" not in line


def test_a_416_to_a_range_inside_the_file_is_a_refusal_not_a_change(capsys: pytest.CaptureFixture[str]) -> None:
    def answer(handler: BaseHTTPRequestHandler, start: int, end: int, count: int) -> None:
        if count == 1:
            partial(handler, VERSION_A, start, end)
        else:
            unsatisfiable(handler, len(VERSION_A))

    line = refused(answer, capsys)
    assert f"of its {len(VERSION_A)}-byte file (HTTP 416)" in line and "changed" not in line


@pytest.mark.parametrize("step", ["after the first range", "in the range asked again"])
def test_a_416_naming_another_length_is_a_file_that_changed(step: str, capsys: pytest.CaptureFixture[str]) -> None:
    def answer(handler: BaseHTTPRequestHandler, start: int, end: int, count: int) -> None:
        if step == "after the first range":
            partial(handler, VERSION_A, start, end) if count == 1 else unsatisfiable(handler, len(VERSION_A) - 1)
        elif count == 1:
            unsatisfiable(handler, 1000)  # as Werkzeug answers a suffix longer than the file
        else:
            partial(handler, VERSION_A, 0, 999)  # ... but the file is another length now

    assert "changed while being read" in refused(answer, capsys)


def whole(handler: BaseHTTPRequestHandler, body: bytes, headers: dict[str, str]) -> None:
    """A 200 to a ranged GET: the server ignores ranges."""
    handler.send_response(200)
    for name, value in headers.items():
        handler.send_header(name, value)
    handler.end_headers()
    handler.wfile.write(body)


def test_a_whole_file_whose_length_is_past_the_budget_is_refused_before_its_body(
    capsys: pytest.CaptureFixture[str],
) -> None:
    def answer(handler: BaseHTTPRequestHandler, start: int, end: int, count: int) -> None:
        handler.send_response(200)
        handler.send_header("Content-Length", str(10**15))
        handler.end_headers()
        time.sleep(3)  # no body: one read of it would wait here

    started = time.monotonic()
    line = refused(answer, capsys)
    assert "(1000.0 TB) is past --max-download 1.0 GB" in line
    assert time.monotonic() - started < 3


def test_a_whole_file_with_no_length_is_refused_once_past_the_budget(capsys: pytest.CaptureFixture[str]) -> None:
    def answer(handler: BaseHTTPRequestHandler, start: int, end: int, count: int) -> None:
        whole(handler, VERSION_A * 4, {"Connection": "close"})

    server = Hostile(answer)
    try:
        assert main(["check", "--max-download", "50k", server.url]) == 2
    finally:
        server.stop()
    line = capsys.readouterr().err.strip()
    assert "the whole file is past --max-download 50.0 kB" in line and "\n" not in line


def test_a_whole_file_compressed_or_trickled_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    def gzipped(handler: BaseHTTPRequestHandler, start: int, end: int, count: int) -> None:
        whole(handler, VERSION_A, {"Content-Length": str(len(VERSION_A)), "Content-Encoding": "gzip"})

    assert "Content-Encoding: gzip" in refused(gzipped, capsys)

    def trickled(handler: BaseHTTPRequestHandler, start: int, end: int, count: int) -> None:
        whole(handler, VERSION_A[:10], {"Content-Length": str(len(VERSION_A))})
        for byte in VERSION_A[10:40]:
            handler.wfile.write(bytes([byte]))
            handler.wfile.flush()
            time.sleep(0.2)

    assert "too slowly" in refused(trickled, capsys)


@pytest.mark.parametrize("scheme", ["ftp", "gopher", "file"])
def test_a_redirect_to_another_scheme_is_refused_and_nothing_is_sent_there(
    scheme: str, capsys: pytest.CaptureFixture[str]
) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.settimeout(0.5)
    port = listener.getsockname()[1]

    def answer(handler: BaseHTTPRequestHandler, start: int, end: int, count: int) -> None:
        handler.send_response(302)
        handler.send_header("Location", f"{scheme}://127.0.0.1:{port}/m.pth")
        handler.send_header("Content-Length", "0")
        handler.end_headers()

    try:
        line = refused(answer, capsys)
        assert "only http:// and https:// are followed" in line
        # nothing connected to the other scheme's port
        with pytest.raises(TimeoutError):
            listener.accept()
    finally:
        listener.close()


def test_a_whole_file_that_ends_as_its_connection_closes_is_read(capsys: pytest.CaptureFixture[str]) -> None:
    """No Content-Length, Connection: close: the body is what comes until the server hangs up (as curl reads it)."""

    def answer(handler: BaseHTTPRequestHandler, start: int, end: int, count: int) -> None:
        handler.close_connection = True
        whole(handler, VERSION_A, {"Connection": "close"})

    server = Hostile(answer)
    try:
        assert main(["info", "--json", server.url]) == 0
    finally:
        server.stop()
    out, err = capsys.readouterr()
    assert "Traceback" not in err and '"uint8"' in out


LARGE = saved({"w": torch.arange(500_000, dtype=torch.float32)})
"""2 MB: its values are fetched after the open."""


def expiring(after: int) -> Callable[[BaseHTTPRequestHandler, int, int, int], None]:
    """A store of :data:`LARGE` whose answers are refused after ``after`` of them, as a pre-signed URL that expired
    (403)."""

    def answer(handler: BaseHTTPRequestHandler, _start: int, _end: int, count: int) -> None:
        if count <= after:
            start, end = asked(handler.headers.get("Range", ""), len(LARGE))
            return partial(handler, LARGE, start, end)
        handler.send_response(403)
        handler.send_header("Content-Length", "0")
        handler.end_headers()

    return answer


@pytest.mark.parametrize("command", ["check", "stats", "diff"])
def test_a_store_that_fails_mid_command_is_one_line_exit_2_not_a_finding(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "same.pth").write_bytes(LARGE)
    # how many answers the open takes: the store expires right after them
    counting = Hostile(expiring(10**6))
    try:
        assert main(["info", counting.url]) == 0
        opened = counting.count
    finally:
        counting.stop()
    capsys.readouterr()
    byte_source._opened_stores.clear()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cold"))
    server = Hostile(expiring(opened))
    try:
        tail = [str(tmp_path / "same.pth")] if command == "diff" else []
        assert main([command, server.url, *tail]) == 2  # the file was not read: no verdict on its values
    finally:
        server.stop()
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "no access (HTTP 403)" in lines[0], err
    assert "DIFFERENT" not in out and "unreadable" not in out + err


def test_a_redirect_loop_is_said_to_be_one(capsys: pytest.CaptureFixture[str]) -> None:
    def loop(handler: BaseHTTPRequestHandler, start: int, end: int, count: int) -> None:
        handler.send_response(302)
        handler.send_header("Location", "/ckpt.pth")
        handler.send_header("Content-Length", "0")
        handler.end_headers()

    line = refused(loop, capsys)
    assert "too many redirects" in line and "HTTP 302" not in line

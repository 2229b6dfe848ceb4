"""The remote stores: ``https://`` (plain ``http.client``), ``hf://`` (the Hub, through ``huggingface_hub``),
``s3://``, ``gs://``, ``az://`` (fsspec's ``s3fs``, ``gcsfs``, ``adlfs``).

Each store gives :class:`~.remote.RemoteFile` sources, one per URL, shared for the process (so values
read later reuse the size, identity and ranges of the open). Credentials and endpoints come from each
ecosystem's own settings: ``HF_TOKEN`` and ``HF_ENDPOINT``; ``AWS_*`` (``AWS_ENDPOINT_URL`` included)
and the AWS config files; Google's and Azure's own. Importing this module imports none of those
libraries: each is imported when its first URL is opened. :func:`register` installs the stores.
"""

from __future__ import annotations

import contextlib
import html
import http.client
import logging
import os
import posixpath
import re
import socket
import ssl
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import IO, Any

from ckpt_tui.core.errors import ReadError
from ckpt_tui.core.model import byte_source, remote
from ckpt_tui.core.model.byte_source import human
from ckpt_tui.core.model.contained import DCP_METADATA, FOLDER_ENTRIES
from ckpt_tui.core.model.header_cache import HeaderCache
from ckpt_tui.core.model.remote import TAIL, CameWhole, NoRanges, NotFound, RemoteFile, Stat, Transport
from ckpt_tui.core.runtime.shell import join_command, quote_arg

TIMEOUT = float(os.environ.get("CKPT_TUI_TIMEOUT", "30"))
RETRIES = 5
REDIRECTS = 5
MIN_RATE = 16 << 10
"""Bytes per second an answer's body must average once TIMEOUT's grace is spent: a server that trickles
bytes cannot hold a read (a per-read socket timeout alone lets one byte every few seconds go on forever)."""
CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+)")
UNSATISFIED = re.compile(r"bytes \*/(\d+)")
"""A 416's Content-Range: the file's length (RFC 9110 14.4)."""
LISTING_MOST = 4 << 20
"""A folder's listing page is read up to this size (a larger one is taken for no listing)."""
TRUST_CA = "SSL_CERT_FILE=/path/to/ca.pem trusts a private CA (or a self-signed certificate)"
"""How a server's certificate signed by a CA the system does not trust is trusted: OpenSSL's own variable, which
``ssl.create_default_context`` reads."""
IN_MEMORY = 16 << 20
"""A whole file a server sent (it ignores ranges) is kept in memory up to this size, in a private temporary file
past it."""


def _timeout_error(name: str) -> ReadError:
    return ReadError(f"{name}: the server did not answer within {TIMEOUT:g} s (timed out; CKPT_TUI_TIMEOUT sets it)")


def download_first(urls: list[str]) -> str:
    """The command that downloads ``urls`` into the current folder, each under its own name."""
    if len(urls) == 1:
        return f"curl -LO {quote_arg(urls[0])}"
    return "curl -L --remote-name-all " + " ".join(map(quote_arg, urls))


SIMPLE_NAME = re.compile(r"[A-Za-z0-9._-]+")


def hub_download(repo: str, paths: list[str], revision: str | None) -> str:
    """The command that downloads Hub files into the current folder: ``hf download`` (huggingface_hub's CLI, which
    sends HF_TOKEN), never a URL the Hub redirected to (a signed CDN link: it expires, and grants access alone)."""
    pinned = ["--revision", revision] if revision else []
    return join_command(["hf", "download", repo, *paths, *pinned, "--local-dir", "."])


def download_set(folder: str, names: list[str]) -> str | None:
    """The command that downloads the files ``names`` of the web folder ``folder`` into the current folder, each
    under its own name (``curl -O`` names a file by its URL's last segment, still percent-encoded: other
    names are given with ``-o``; a Hub folder's, ``hf download``); None when a name (from the file: hostile) would
    lead out of it."""
    if byte_source.scheme_of(folder) == "hf":
        repo, revision, inside = HubStore.parse(folder)
        return hub_download(repo, [posixpath.join(inside, name) if inside else name for name in names], revision)
    for name in names:
        for seen in (name, urllib.parse.unquote(name)):
            if not seen or seen.startswith(("/", "\\")) or ".." in re.split(r"[/\\]", seen) or "\x00" in seen:
                return None
    urls = [byte_source.join(folder, urllib.parse.quote(name, safe="/")) for name in names]
    if all(SIMPLE_NAME.fullmatch(name) for name in names):
        return download_first(urls)
    pairs = (f"-o {quote_arg(name)} {quote_arg(url)}" for name, url in zip(names, urls, strict=True))
    return "curl -L --create-dirs " + " ".join(pairs)


def set_refused(where: str, refused: NoRanges, files: str, folder: str, names: list[str], then: str) -> ReadError:
    """A file of a set (an index's shards, a DCP folder's files) too large to take whole from a server without
    ranges: one file alone opens nothing, so the command names every file of the set (``names`` in ``folder``);
    ``files`` says them in words, ``then`` what to open after."""
    name = refused.url.rsplit("/", 1)[-1]
    whole = f"{name} ({human(refused.length)})" if refused.length is not None else name
    command = download_set(folder, names)
    if command is None:
        return refused  # (a name that leads out: its reader refuses it once asked; no command offers to write it)
    return ReadError(
        f"{where}: the server does not support ranged reads, and {remote.past_budget(whole)}; download {files} "
        f"first ({command}) and {then}, or raise --max-download"
    )


class NoAccess(ReadError):
    """The server refused access (HTTP 401 or 403)."""


class HtmlPage(ReadError):
    """The URL answered with an HTML page (a folder's listing, a site's page): not a file to read."""


@dataclass(frozen=True)
class Answer:
    """A ranged answer: its status and headers (lower-case names), and for a 206 the range it names and
    its body, read in full."""

    status: int
    headers: dict[str, str]
    span: tuple[int, int, int] | None = None
    """first byte, last byte and the file's size, from Content-Range"""
    body: bytes = b""
    whole: IO[bytes] | None = None
    """a 200's body, the whole file, when the request took one (:meth:`HttpTransport.stat`)"""


class _Cutoff:
    """Shuts a connection's socket once its time is up, waking a read that a trickling server holds."""

    def __init__(self, sock: socket.socket, seconds: float) -> None:
        self.fired = False
        self._sock = sock
        self._timer = threading.Timer(seconds, self._fire)
        self._timer.daemon = True
        self._timer.start()

    def _fire(self) -> None:
        self.fired = True
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)

    def cancel(self) -> None:
        self._timer.cancel()


def _check_scheme(name: str, url: str) -> None:
    """Only http and https are spoken: a redirect to ``ftp://`` or ``gopher://`` would otherwise get a plain
    HTTP request sent to that host and port."""
    scheme = urllib.parse.urlsplit(url).scheme.lower()
    if scheme not in ("http", "https"):
        shown = url if len(url) <= 120 else url[:117] + "..."
        raise ReadError(f"{name}: the server redirects to {shown!r}: only http:// and https:// are followed")


class HttpTransport:
    """Ranged GETs over ``http.client``: one kept-alive connection per thread, redirects followed once
    and the final URL reused. Every range is checked against the file's version: ``If-Match`` with a
    strong ETag, else ``If-Unmodified-Since`` with Last-Modified, and the size in every Content-Range."""

    def __init__(self, url: str, name: str, headers: dict[str, str] | None = None, access_hint: str = "") -> None:
        self.url = url
        self.download: str | None = None
        """The command that downloads the file, where it is not ``curl`` of :attr:`url` (a Hub file, whose URL here
        may be a signed CDN link: never printed)."""
        self.name = name
        self.headers = dict(headers or {})
        self.access_hint = access_hint
        self.size: int | None = None
        self.served: str | None = None
        """The version the serving host named first, for :meth:`fetch_served` (None: not asked yet)."""
        self.kept: IO[bytes] | None = None
        """The whole file, when the serving host answered :meth:`fetch_served`'s first range with it."""
        self._lock = threading.Lock()
        self._local = threading.local()

    def _connection(self, parts: urllib.parse.SplitResult) -> http.client.HTTPConnection:
        _check_scheme(self.name, urllib.parse.urlunsplit(parts))
        key = (parts.scheme, parts.netloc)
        cached = getattr(self._local, "connection", None)
        if cached is not None and cached[0] == key:
            return cached[1]
        kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        connection = kind(parts.netloc, timeout=TIMEOUT)
        self._local.connection = (key, connection)
        return connection

    def _drop(self) -> None:
        cached = getattr(self._local, "connection", None)
        if cached is not None:
            cached[1].close()
        self._local.connection = None

    def request(self, headers: dict[str, str], most: int, whole: bool = False, page: bool = False) -> Answer:
        """One GET of the file with ``headers``, for a range of at most ``most`` bytes: a 206's body is read
        in full, checked against its Content-Range and Content-Length; with ``whole``, a 200's body too (the
        whole file, within the budget: :meth:`_whole`); with ``page``, an HTML page's (a folder's listing:
        :meth:`_page_body`); other answers' bodies are not read.
        Retries on 429 and 5xx with backoff (honouring Retry-After), and once on a dropped kept-alive
        connection. A server slower than :data:`MIN_RATE` after :data:`TIMEOUT` is refused."""
        url, moved, wait = self.url, 0, 1.0
        for attempt in range(RETRIES + 1):
            parts = urllib.parse.urlsplit(url)
            target = urllib.parse.urlunsplit(("", "", parts.path or "/", parts.query, ""))
            sent = {**(self.headers if parts.netloc == urllib.parse.urlsplit(self.url).netloc else {}), **headers}
            cutoff: _Cutoff | None = None
            try:
                connection = self._connection(parts)
                if connection.sock is None:
                    connection.connect()
                # kept: http.client lets go of it once an answer says the connection closes after it
                sock = connection.sock
                cutoff = _Cutoff(sock, TIMEOUT)
                connection.request("GET", target, headers=sent)
                response = connection.getresponse()
                cutoff.cancel()
                if cutoff.fired:
                    # cut off mid-headers: what http.client parsed up to the cut is not an answer
                    raise TimeoutError
                answer = self._answer(response, sock, most, whole, page)
            except TimeoutError:
                self._drop()
                raise _timeout_error(self.name) from None
            except (http.client.HTTPException, ConnectionError) as exc:
                self._drop()
                if cutoff is not None and cutoff.fired:
                    raise _timeout_error(self.name) from None
                if attempt < RETRIES:
                    continue
                raise ReadError(f"{self.name}: the connection failed ({exc or type(exc).__name__})") from None
            except ssl.SSLCertVerificationError as exc:
                self._drop()
                raise ReadError(f"{self.name}: cannot connect ({exc}); {TRUST_CA}") from None
            except OSError as exc:
                self._drop()
                raise ReadError(f"{self.name}: cannot connect ({exc.strerror or exc})") from None
            except ReadError:
                self._drop()
                raise
            finally:
                if cutoff is not None:
                    cutoff.cancel()
            status, found = answer.status, answer.headers
            if status in (301, 302, 303, 307, 308) and "location" in found and moved < REDIRECTS:
                url = urllib.parse.urljoin(url, found["location"])
                _check_scheme(self.name, url)
                self.url, moved = url, moved + 1  # the redirect is reused for every later range
                continue
            if (status == 429 or status >= 500) and attempt < RETRIES:
                retry = found.get("retry-after", "")
                time.sleep(float(retry) if retry.replace(".", "", 1).isdigit() else wait)
                wait = min(wait * 2, 30.0)
                continue
            return answer
        raise ReadError(f"{self.name}: the server kept refusing (HTTP {status}) after {RETRIES} retries")

    def _answer(
        self, response: http.client.HTTPResponse, sock: socket.socket, most: int, whole: bool, page: bool = False
    ) -> Answer:
        found = {k.lower(): v for k, v in response.getheaders()}
        if response.status == 200 and whole and not is_page(found):
            return self._whole(response, sock, found)
        if response.status == 200 and page and is_page(found):
            return self._page_body(response, sock, found, most)
        if response.status != 206:
            # its body is never used: the connection goes rather than read what the server chose to send
            self._drop()
            return Answer(response.status, found)
        self._plain(found)
        named = CONTENT_RANGE.fullmatch(found.get("content-range", "").strip())
        if named is None:
            raise ReadError(f"{self.name}: the server's ranged answer names no range ({found.get('content-range')})")
        first, last, size = (int(part) for part in named.groups())
        length = last - first + 1
        if length <= 0 or length > most or last >= size:
            raise ReadError(f"{self.name}: the server sent another range than asked ({found['content-range']})")
        declared = found.get("content-length", "").strip()
        if declared and declared != str(length):
            raise ReadError(
                f"{self.name}: the server's Content-Length ({declared[:20]}) disagrees with its Content-Range "
                f"({found['content-range']})"
            )
        body = self._body(response, sock, length)
        if response.length == 0:
            response.close()  # read to its end: the kept-alive connection is ready for the next range
        else:
            self._drop()  # more follows than the range named (or no length): the connection cannot be reused
        return Answer(206, found, (first, last, size), body)

    def _plain(self, found: dict[str, str]) -> None:
        """Refuse a compressed body: its bytes are not the file's."""
        coding = found.get("content-encoding", "identity").strip().lower()
        if coding not in ("", "identity"):
            raise ReadError(
                f"{self.name}: the server compressed its answer (Content-Encoding: {coding}) though asked not to; "
                f"download it first ({self._download()}) and open the local copy"
            )

    def _whole(self, response: http.client.HTTPResponse, sock: socket.socket, found: dict[str, str]) -> Answer:
        """A 200 to a ranged GET (the server ignores ranges): the whole file, kept when it fits the budget
        (counted as it comes), else refused before a byte of it is read (or, with no length, once past it)."""
        self._plain(found)
        declared = found.get("content-length", "").strip()
        length = int(declared) if declared.isdigit() else None
        if length is not None and not remote.claim(self.name, length):
            self._drop()
            raise self._too_large(length)
        kept = tempfile.SpooledTemporaryFile(max_size=IN_MEMORY)  # noqa: SIM115 - the caller's to keep
        try:
            for chunk in self._chunks(response, sock, length):
                if length is None and not remote.claim(self.name, len(chunk)):
                    raise self._too_large(None)
                self._keep(kept, chunk)
        except BaseException:
            kept.close()
            raise
        # (one answer per file: the connection goes rather than trust what may follow the body)
        self._drop()
        return Answer(200, found, whole=kept)

    def _keep(self, kept: IO[bytes], chunk: bytes) -> None:
        """``chunk`` written to the local temporary file a whole download spills to past :data:`IN_MEMORY`."""
        try:
            kept.write(chunk)
        except OSError as exc:
            # the server answered: what failed is the local file (a full or small /tmp, a file size limit)
            raise ReadError(
                f"{self.name}: cannot write the local temporary file that holds the download, in "
                f"{tempfile.gettempdir()} ({exc.strerror or exc}); TMPDIR sets the folder it goes to"
            ) from None

    def _page_body(
        self, response: http.client.HTTPResponse, sock: socket.socket, found: dict[str, str], most: int
    ) -> Answer:
        """An HTML page's body up to ``most`` bytes, counted against the budget (none past either: an answer
        without a body, taken for no listing)."""
        self._plain(found)
        declared = found.get("content-length", "").strip()
        length = int(declared) if declared.isdigit() else None
        body = bytearray()
        if length is None or (length <= most and remote.claim(self.name, length)):
            for chunk in self._chunks(response, sock, length):
                if length is None and (len(body) + len(chunk) > most or not remote.claim(self.name, len(chunk))):
                    body.clear()
                    break
                body += chunk
        # (one answer per page: the connection goes rather than trust what may follow the body)
        self._drop()
        return Answer(200, found, body=bytes(body))

    def listing_page(self) -> str | None:
        """The HTML page the URL answers with (a folder's listing), or None: another answer, or past the budget
        or :data:`LISTING_MOST`."""
        answer = self.request({"Accept-Encoding": "identity"}, LISTING_MOST, page=True)
        if answer.status != 200 or not is_page(answer.headers) or not answer.body:
            return None
        return answer.body.decode("utf-8", "replace")

    def _too_large(self, length: int | None) -> NoRanges:
        whole = f"the whole file ({human(length)})" if length is not None else "the whole file"
        return NoRanges(
            f"{self.name}: the server does not support ranged reads, and {remote.past_budget(whole)}; download it "
            f"first ({self._download()}) and open the local copy, or raise --max-download",
            self.name,
            length,
        )

    def _body(self, response: http.client.HTTPResponse, sock: socket.socket, length: int) -> bytes:
        """Exactly ``length`` bytes of the body, or a one-line refusal: ended early, or too slow."""
        return b"".join(self._chunks(response, sock, length))

    def _chunks(self, response: http.client.HTTPResponse, sock: socket.socket, length: int | None) -> Iterator[bytes]:
        """The body in chunks: exactly ``length`` bytes (with no length, up to its end), or a one-line refusal:
        ended early, or too slow (past :data:`TIMEOUT`, under :data:`MIN_RATE` on average)."""
        started, got = time.monotonic(), 0
        while length is None or got < length:
            # with no length known, the rate is held to the bytes come so far
            deadline = started + TIMEOUT + (length if length is not None else got) / MIN_RATE
            left = deadline - time.monotonic()
            of = f"{got} of {length}" if length is not None else f"{got}"
            too_slow = ReadError(
                f"{self.name}: the server sent {of} bytes too slowly (under {MIN_RATE >> 10} kB/s "
                f"after {TIMEOUT:g} s; CKPT_TUI_TIMEOUT sets the wait)"
            )
            if left <= 0:
                raise too_slow
            # a body that ends as its connection closes (no length, Connection: close) leaves no socket to set:
            # what is left of it is in the response's buffer
            with contextlib.suppress(OSError):
                sock.settimeout(min(TIMEOUT, left))
            try:
                chunk = response.read1(min(length - got, 1 << 20) if length is not None else 1 << 20)
            except TimeoutError:
                if left < TIMEOUT:
                    raise too_slow from None
                raise
            if not chunk:
                if length is None:
                    break
                raise ReadError(f"{self.name}: the server's answer ended after {got} of {length} bytes")
            got += len(chunk)
            yield chunk
        with contextlib.suppress(OSError):
            sock.settimeout(TIMEOUT)

    def _download(self) -> str:
        return self.download or download_first([self.url])

    def _shown(self) -> str:
        """Where the last request went, as a message may show it: a Hub file's without its query (a signature)."""
        if self.download is None:
            return self.url
        return urllib.parse.urlunsplit(urllib.parse.urlsplit(self.url)._replace(query="", fragment=""))

    def _other_range(self, answer: Answer) -> ReadError:
        return ReadError(f"{self.name}: the server sent another range than asked ({answer.headers['content-range']})")

    def _refuse(self, status: int) -> ReadError:
        if status == 404:
            return NotFound(f"{self.name}: not found (HTTP 404)")
        if status in (401, 403):
            hint = f"; {self.access_hint}" if self.access_hint else ""
            return NoAccess(f"{self.name}: no access (HTTP {status}){hint}")
        if status in (412, 409):
            return ReadError(
                f"{self.name}: the file changed while being read (its version no longer matches); open it again"
            )
        if status in (301, 302, 303, 307, 308):
            # (a redirect is followed: one left is the last of too many)
            last = self._shown()
            return ReadError(f"{self.name}: too many redirects (more than {REDIRECTS}; a loop?), last to {last}")
        return ReadError(f"{self.name}: the server answered HTTP {status}")

    def _no_ranges(self) -> ReadError:
        return ReadError(
            f"{self.name}: the server stopped answering ranged reads (it sent the whole file); "
            f"download it first ({self._download()}) and open the local copy"
        )

    def _unsatisfiable(self, asked: str, answer: Answer) -> ReadError:
        """A 416 to a range that the size known says the file holds: the file shrank, or the server refuses it."""
        named = UNSATISFIED.fullmatch(answer.headers.get("content-range", "").strip())
        if named is not None and self.size is not None and int(named.group(1)) != self.size:
            return self._refuse(412)
        of = f" of its {self.size}-byte file" if self.size is not None else ""
        return ReadError(
            f"{self.name}: the server refused the range {asked}{of} (HTTP 416); "
            f"download it first ({self._download()}) and open the local copy"
        )

    def stat(self) -> Stat:
        """A GET of the file's last :data:`TAIL` bytes: its size, version and tail in one request (or, from a
        server that ignores ranges, the whole file within the budget)."""
        answer = self.request({"Range": f"bytes=-{TAIL}", "Accept-Encoding": "identity"}, TAIL, whole=True)
        if answer.status in (200, 206) and is_page(answer.headers):
            raise self._page()
        asked = 1
        if answer.status == 416:
            answer, asked = self._after_suffix_refused(answer), 2
        if answer.status == 416:
            raise self._unsatisfiable(f"bytes=-{TAIL}", answer)
        if answer.whole is not None:
            self.size = answer.whole.seek(0, os.SEEK_END)
            return Stat(self.size, version(answer.headers), whole=answer.whole, asked=asked)
        if answer.status != 206 or answer.span is None:
            raise self._refuse(answer.status)
        return replace(self._tail_stat(answer), asked=asked)

    def _after_suffix_refused(self, refused: Answer) -> Answer:
        """The answer to one explicit range after a 416 to the suffix range: Werkzeug (Flask's
        ``send_file``) refuses ``bytes=-N`` longer than the file, naming its length (``bytes */LENGTH``), where
        RFC 9110 14.1.3 has the whole file sent; the explicit range is taken from that length."""
        named = UNSATISFIED.fullmatch(refused.headers.get("content-range", "").strip())
        if named is None:
            return refused
        length = int(named.group(1))
        if length == 0:
            # an empty file: nothing to range over (opening it says so)
            return Answer(200, refused.headers, whole=tempfile.SpooledTemporaryFile())
        asked = f"bytes={max(0, length - TAIL)}-{length - 1}"
        answer = self.request({"Range": asked, "Accept-Encoding": "identity"}, TAIL, whole=True)
        if answer.status == 416:
            raise self._unsatisfiable(asked, answer)
        before, now = version(refused.headers), version(answer.headers)
        if (answer.span is not None and answer.span[2] != length) or (before and now and before != now):
            raise self._refuse(412)
        if answer.whole is not None and answer.whole.seek(0, os.SEEK_END) != length:
            raise self._refuse(412)
        return answer

    def _page(self) -> HtmlPage:
        base = self.name.rstrip("/")
        return HtmlPage(
            f"{self.name} is an HTML page, not a checkpoint (nor a folder holding {', '.join(FOLDER_ENTRIES)}): "
            f"for a DCP folder open {base}/{DCP_METADATA}"
        )

    def _tail_stat(self, answer: Answer) -> Stat:
        """Size, version and tail from a 206 to the stat's range."""
        assert answer.span is not None
        first, last, size = answer.span
        if last != size - 1:
            raise self._other_range(answer)
        identity = version(answer.headers)
        if not identity and first > 0:
            # without a version every later range could come from another file: ranges cannot be trusted
            raise ReadError(
                f"{self.name}: the server names no version of the file (no strong ETag, no Last-Modified), so a "
                f"change between its ranged reads could not be seen; download it first "
                f"({self._download()}) and open the local copy"
            )
        self.size = size
        return Stat(size, identity, (first, answer.body))

    def fetch(self, offset: int, length: int, identity: str) -> bytes:
        """One ranged GET, refused if the file's version (``identity``, named by this server's first answer) or
        size changed."""
        answer = self._ranged(offset, length, identity)
        if version(answer.headers) != identity:
            raise self._refuse(412)
        return answer.body

    def fetch_served(self, offset: int, length: int) -> bytes:
        """One ranged GET of a file known by another store's identity (the Hub's ETag and commit), from the host that
        serves it (a CDN, whose ETag is its own): pinned to the version that host named in its first answer, and to
        the size the Hub named (:attr:`size`)."""
        with self._lock:
            pinned, kept = self.served, self.kept
        if kept is not None:
            raise CameWhole(kept, kept.seek(0, os.SEEK_END))
        # the host's first answer: a host that ignores ranges sends the whole file, kept within the budget as https://
        # keeps a first answer (the Hub's HEAD told the size; no GET was made before)
        answer = self._ranged(offset, length, pinned or "", whole=pinned is None)
        if answer.whole is not None:
            size = answer.whole.seek(0, os.SEEK_END)
            if self.size is not None and size != self.size:
                raise self._refuse(412)
            with self._lock:
                self.kept, self.served = answer.whole, version(answer.headers)
            raise CameWhole(answer.whole, size)
        now = version(answer.headers)
        with self._lock:
            if self.served is None:
                self.served = now
            elif now != self.served:
                raise self._refuse(412)
        return answer.body

    def _ranged(self, offset: int, length: int, pinned: str, whole: bool = False) -> Answer:
        """One ranged GET on the condition that the file is still ``pinned`` (a strong ETag: If-Match; a date:
        If-Unmodified-Since; "": none), refused when it is not, or its size is not :attr:`size`; ``whole``: a 200
        with the whole file is taken (within the budget: :meth:`_whole`), as the file's first answer."""
        headers = {"Range": f"bytes={offset}-{offset + length - 1}", "Accept-Encoding": "identity"}
        if pinned.startswith('"'):
            headers["If-Match"] = pinned
        elif pinned:
            headers["If-Unmodified-Since"] = pinned
        answer = self.request(headers, length, whole=whole)
        if answer.whole is not None:
            return answer
        if answer.status == 200:
            raise self._no_ranges()
        if answer.status == 416:
            raise self._unsatisfiable(headers["Range"], answer)
        if answer.status != 206 or answer.span is None:
            raise self._refuse(answer.status)
        if self.size is not None and answer.span[2] != self.size:
            raise self._refuse(412)
        if answer.span[0] != offset:
            raise self._other_range(answer)
        return answer


def is_page(headers: dict[str, str]) -> bool:
    """Whether an answer is an HTML page (no checkpoint is served as one)."""
    return headers.get("content-type", "").split(";")[0].strip().lower() in ("text/html", "application/xhtml+xml")


def version(headers: dict[str, str]) -> str:
    """The file's version as a server names it: a strong ETag, else Last-Modified, else "" (a weak ETag
    says two files are alike, not byte-identical, so it cannot vouch for ranges: RFC 9110 13.1.5)."""
    etag = headers.get("etag", "").strip()
    if etag.startswith('"'):
        return etag
    return headers.get("last-modified", "").strip()


class _Sources:
    """One :class:`RemoteFile` per URL, made once, with the header cache seeding and remembering it."""

    def __init__(self) -> None:
        self._sources: dict[str, RemoteFile] = {}
        self._lock = threading.Lock()
        self.cache = HeaderCache()

    def get(self, url: str, make: Callable[[], Transport]) -> RemoteFile:
        with self._lock:
            source = self._sources.get(url)
            if source is None:
                source = self._sources[url] = RemoteFile(url, make(), lambda stat: self.cache.load(url, stat))
            return source

    def known_file(self, url: str) -> bool:
        """Whether ``url`` was opened and its store answered with a size."""
        source = self._sources.get(url)
        return source is not None and source.stat_known()

    def remember(self) -> None:
        for source in self.opened():
            self.cache.save(source)
            source.opened()

    def opened(self) -> list[RemoteFile]:
        """The files asked for whose store answered (those not found are left out)."""
        with self._lock:
            return [source for source in self._sources.values() if source.stat_known()]


HREF = re.compile(r"""<a\s[^>]*?\bhref\s*=\s*(?:"([^"]*)"|'([^']*)'|([^\s>]+))""", re.IGNORECASE)


LISTING_TITLE = re.compile(r"<(?:title|h1)[^>]*>\s*(?:index of|directory listing)", re.IGNORECASE)
"""How the servers title a folder's listing: ``Index of /run/`` (nginx, Apache, lighttpd), ``Directory listing for
/run/`` (``python -m http.server``)."""


def listed_entries(page: str, folder: str) -> dict[str, bool] | None:
    """The entries a folder's listing page (``python -m http.server``, nginx's autoindex, Apache's index) links
    to directly inside ``folder`` (a URL ending in ``/``), each with whether it is a folder (its link ends in
    ``/``); None for a page that is no listing (titled as none, and no link to the parent folder: a site's page,
    whose links need not name every file) or that links to no entry. Links elsewhere (the parent, sort orders,
    other hosts) and names that could not be a file's (``/``, ``..``) are left out."""
    base = urllib.parse.urlsplit(folder)
    parent = posixpath.dirname(base.path.rstrip("/")).rstrip("/") + "/"
    found: dict[str, bool] = {}
    titled = LISTING_TITLE.search(page) is not None
    for match in HREF.finditer(page):
        href = html.unescape(next(group for group in match.groups() if group is not None)).strip()
        target = urllib.parse.urlsplit(urllib.parse.urljoin(folder, href))
        if (target.scheme, target.netloc) != (base.scheme, base.netloc) or target.query or target.fragment:
            continue
        titled = titled or (target.path == parent and base.path != "/")
        if not target.path.startswith(base.path) or target.path == base.path:
            continue
        encoded = target.path[len(base.path) :]
        is_folder = encoded.endswith("/")
        name = urllib.parse.unquote(encoded[:-1] if is_folder else encoded)
        if not name or "/" in name or "\\" in name or "\x00" in name or name in (".", ".."):
            continue
        found[name] = is_folder
    return found if found and titled else None


class HttpStore:
    """``https://`` and ``http://`` URLs. A folder's URL is listed from the page the server answers it with,
    when that page is a listing (``python -m http.server``, nginx's autoindex, Apache's index): every layout
    then opens as a local folder does. A server that lists nothing (a page that links to no entry, a 403 or
    404) is asked for the files a loader opens in a folder (:data:`~.contained.FOLDER_ENTRIES`), the first
    found its one entry."""

    def __init__(self) -> None:
        self.sources = _Sources()
        self._pages: dict[str, HtmlPage] = {}
        self._entries: dict[str, list[str]] = {}
        self._listings: dict[str, dict[str, bool] | None] = {}
        self._folders: set[str] = set()
        """Entries a listing named as folders (their URLs, without the trailing slash)."""
        self._lock = threading.Lock()

    def source(self, url: str) -> RemoteFile:
        parts = urllib.parse.urlsplit(url)
        if parts.username is not None or parts.password is not None:
            # never echoed in an error, nor kept in the header cache's file
            shown = urllib.parse.urlunsplit(parts._replace(netloc=f"***@{parts.hostname}"))
            raise ReadError(
                f"{shown}: a URL with a user name or password is not used (it would be echoed and cached); "
                "download the file first (curl -u USER -O URL) and open the local copy"
            )
        return self.sources.get(url, lambda: HttpTransport(url, url))

    def is_file(self, url: str) -> bool:
        if url in self._pages or url.rstrip("/") in self._folders or not self._maybe_listed(url):
            return False
        try:
            return self.source(url).size >= 0
        except NotFound:
            return False
        except HtmlPage as page:
            self._pages[url] = page
            return False

    def is_dir(self, url: str) -> bool:
        """Whether the URL is a folder: one a listing named, one whose page is a listing, or one holding a file a
        loader opens. Asked of the server only for a URL ending in ``/`` or answered with an HTML page (a page
        that is neither is said to be a page, not a checkpoint)."""
        with self._lock:
            listed = self._listings.get(url.rstrip("/") + "/")
        if url.rstrip("/") in self._folders or listed is not None:
            return True  # (named by its parent's listing, or listed itself already)
        page = self._pages.get(url)
        if page is None and not url.endswith("/"):
            return False
        if self._listing(url) is not None:
            return True
        if not self._entries_of(url) and page is not None:
            raise page
        return bool(self._entries_of(url))

    def lists(self, url: str) -> bool:
        """Whether the folder's page lists its entries (then every file of it is known)."""
        return self._listing(url) is not None

    def _listing(self, url: str) -> dict[str, bool] | None:
        """The entries of the folder's listing page (one GET, kept), or None where the server lists none."""
        folder = url.rstrip("/") + "/"
        with self._lock:
            if folder in self._listings:
                return self._listings[folder]
        try:
            page = HttpTransport(folder, folder).listing_page()
        except (NotFound, NoAccess):
            page = None
        found = listed_entries(page, folder) if page is not None else None
        with self._lock:
            self._listings[folder] = found
            for name, is_folder in (found or {}).items():
                if is_folder:
                    self._folders.update(byte_source.join(folder, form) for form in (name, urllib.parse.quote(name)))
        return found

    def _maybe_listed(self, url: str) -> bool:
        """False for a file its folder's listing, read already, does not name (no request made for it)."""
        folder, _, name = url.rpartition("/")
        with self._lock:
            listed = self._listings.get(folder + "/")
        return listed is None or urllib.parse.unquote(name) in listed

    def _entries_of(self, url: str) -> list[str]:
        """The first of :data:`FOLDER_ENTRIES` the folder holds (one ranged GET each until found), as a list."""
        if url not in self._entries:
            found = next((name for name in FOLDER_ENTRIES if self.is_file(byte_source.join(url, name))), None)
            self._entries[url] = [found] if found is not None else []
        return self._entries[url]

    def list_dir(self, url: str) -> list[str]:
        listed = self._listing(url)
        if listed is not None:
            return sorted(listed)
        if self.is_dir(url):
            return list(self._entries_of(url))
        raise ReadError(f"{url}: the server lists no such folder; name a file (an index.json opens its shards)")

    def remember(self) -> None:
        self.sources.remember()

    def opened(self) -> list[RemoteFile]:
        return self.sources.opened()


class HubStore:
    """``hf://ORG/REPO[@REV][/PATH]``: files resolved once through ``huggingface_hub`` (``HF_TOKEN``,
    ``HF_ENDPOINT``, revisions), then read with ranged GETs on the final (redirected) URL."""

    def __init__(self) -> None:
        self.sources = _Sources()
        self._files: dict[tuple[str, str | None], list[str]] = {}
        self._commits: dict[tuple[str, str | None], str] = {}
        self._lock = threading.Lock()

    def pinned(self, repo: str, revision: str | None) -> str | None:
        """The commit a revision resolved to first: every later file of it is read at that commit."""
        with self._lock:
            return self._commits.get((repo, revision))

    def pin(self, repo: str, revision: str | None, commit: str) -> None:
        """Read the rest of ``revision`` at ``commit`` (a branch that moves meanwhile cannot mix two)."""
        with self._lock:
            self._commits.setdefault((repo, revision), commit)

    @staticmethod
    def parse(url: str) -> tuple[str, str | None, str]:
        """Repo id, revision and path inside the repo of an ``hf://`` URL."""
        rest = url.split("://", 1)[1].strip("/")
        parts = rest.split("/")
        if len(parts) < 2 or not parts[0] or not parts[1]:
            raise ReadError(f"{url}: an hf:// URL names ORG/REPO[@REVISION][/PATH]")
        repo, _, revision = parts[1].partition("@")
        return f"{parts[0]}/{repo}", urllib.parse.unquote(revision) or None, "/".join(parts[2:])

    def _transport(self, url: str) -> Transport:
        return _HubFile(self, url, *self.parse(url))

    def source(self, url: str) -> RemoteFile:
        return self.sources.get(url, lambda: self._transport(url))

    def files(self, url: str) -> list[str]:
        """Every file of the repo at the URL's revision (listed once)."""
        repo, revision, _ = self.parse(url)
        with self._lock:
            found = self._files.get((repo, revision))
            at = self._commits.get((repo, revision), revision)
            if found is None:
                found = self._files[(repo, revision)] = _hub_call(
                    url, lambda api: api.list_repo_files(repo, revision=at)
                )
        return found

    def is_file(self, url: str) -> bool:
        """Whether the Hub resolves the URL to a file (one HEAD, kept for the reads that follow)."""
        if not self.parse(url)[2]:
            return False
        try:
            return self.source(url).size >= 0
        except NotFound:
            return False

    def is_dir(self, url: str) -> bool:
        path = self.parse(url)[2]
        if path and self.sources.known_file(url):
            return False  # resolved as a file already: no listing needed
        prefix = path + "/" if path else ""
        return any(name.startswith(prefix) for name in self.files(url))

    def lists(self, url: str) -> bool:
        return True  # (the Hub's listing)

    def list_dir(self, url: str) -> list[str]:
        path = self.parse(url)[2]
        prefix = path + "/" if path else ""
        return sorted({name[len(prefix) :].split("/")[0] for name in self.files(url) if name.startswith(prefix)})

    def remember(self) -> None:
        self.sources.remember()

    def opened(self) -> list[RemoteFile]:
        return self.sources.opened()


def _hub_error(url: str, exc: Exception) -> ReadError:
    from huggingface_hub import errors

    if isinstance(exc, (errors.RepositoryNotFoundError, errors.GatedRepoError)):
        return ReadError(f"{url}: no such repo, or no access to it (set HF_TOKEN for a private or gated repo)")
    if isinstance(exc, errors.RevisionNotFoundError):
        return ReadError(f"{url}: no such revision")
    if isinstance(exc, errors.EntryNotFoundError):
        return NotFound(f"{url}: not found in the repo")
    status = getattr(getattr(exc, "response", None), "status_code", None)
    if status in (401, 403):
        return ReadError(f"{url}: no access (HTTP {status}); set HF_TOKEN")
    if "timed out" in str(exc).lower() or "timeout" in type(exc).__name__.lower():
        return _timeout_error(url)
    if "connect" in type(exc).__name__.lower() or "connection" in str(exc).lower():
        where = os.environ.get("HF_ENDPOINT") or "https://huggingface.co"
        return ReadError(f"{url}: cannot reach the Hub at {where} ({' '.join(str(exc).split())[:120]})")
    return ReadError(f"{url}: the Hub refused ({' '.join(str(exc).split())[:200]})")


def _hub_call(url: str, call: Callable[[Any], Any]) -> Any:
    try:
        from huggingface_hub import HfApi
    except ImportError:
        raise ReadError(f"{url}: hf:// needs huggingface_hub: pip install 'ckpt-tui[remote]'") from None
    # the client logs each failed try on its own; the failure is said once, here
    logging.getLogger("huggingface_hub").setLevel(logging.ERROR)
    try:
        return call(HfApi(endpoint=os.environ.get("HF_ENDPOINT") or None))
    except Exception as exc:  # every failure of the client, said in one line
        raise _hub_error(url, exc) from None


class _HubFile:
    """One Hub file: resolved with a HEAD (size, ETag, commit, final location), then ranged GETs."""

    def __init__(self, store: HubStore, url: str, repo: str, revision: str | None, path: str) -> None:
        self.store, self.url, self.repo, self.revision, self.path = store, url, repo, revision, path
        self._http: HttpTransport | None = None
        self._signed = False
        """Whether the file is read from a signed link the Hub redirected to (a CDN's), not from the Hub."""
        self._first: tuple[str | None, int | None] = (None, None)
        """The ETag and size the Hub named first."""
        self._renewing = threading.Lock()

    def _resolve(self) -> Any:
        """The Hub's metadata of the file (a HEAD at the commit its revision resolved to first), and the URL asked."""

        def resolve(api: Any) -> Any:
            from huggingface_hub import get_hf_file_metadata, hf_hub_url

            at = self.store.pinned(self.repo, self.revision) or self.revision
            where = hf_hub_url(self.repo, self.path, revision=at, endpoint=api.endpoint)
            return get_hf_file_metadata(where, endpoint=api.endpoint, retry_on_errors=True), where

        return _hub_call(self.url, resolve)

    def stat(self) -> Stat:
        if not self.path:
            raise ReadError(f"{self.url}: a repo, not a file")
        meta, where = self._resolve()
        if meta.commit_hash:
            self.store.pin(self.repo, self.revision, meta.commit_hash)
        from huggingface_hub.utils import build_hf_headers

        headers = build_hf_headers()
        headers.pop("user-agent", None)
        home = urllib.parse.urlsplit(where).netloc
        location = meta.location or where
        # The token goes to the Hub only: a redirect to a CDN carries its own signature.
        auth = {k: v for k, v in headers.items() if k.lower() == "authorization"}
        on_hub = urllib.parse.urlsplit(location).netloc == home
        hint = "set HF_TOKEN" if on_hub else "the Hub's signed link to it was refused, even when asked for anew"
        self._http = HttpTransport(location, self.url, auth if on_hub else {}, hint)
        self._http.size = int(meta.size) if meta.size is not None else None
        self._http.download = hub_download(self.repo, [self.path], meta.commit_hash or self.revision)
        self._signed = not on_hub
        self._first = (meta.etag, meta.size)
        identity = f'"{meta.etag}"' if meta.etag and not meta.etag.startswith(('"', "W/")) else (meta.etag or "")
        return Stat(int(meta.size or 0), identity or str(meta.commit_hash or ""))

    def fetch(self, offset: int, length: int, identity: str) -> bytes:
        """A range from where the Hub sent the file: the file is known by the Hub's ETag (an LFS file's sha256, the
        header cache's key) and commit, which a CDN's own ETag never equals; as huggingface_hub reads the redirect's
        location, ranges there are held to the size the Hub named and to the version the CDN names first. A CDN's
        link is signed and expires (in about an hour): refused, it is asked of the Hub anew, once."""
        assert self._http is not None
        link = self._http.url
        try:
            return self._http.fetch_served(offset, length)
        except NoAccess:
            if not self._signed:
                raise
        self._renew(link)
        return self._http.fetch_served(offset, length)

    def _renew(self, refused: str) -> None:
        """A fresh signed link from the Hub in place of ``refused``, for the same file (the same ETag and size at the
        same commit); none when another read renewed it meanwhile."""
        assert self._http is not None
        with self._renewing:
            if self._http.url != refused:
                return
            meta, where = self._resolve()
            if (meta.etag, meta.size) != self._first:
                raise ReadError(
                    f"{self.url}: the file changed while being read (its version no longer matches); open it again"
                )
            self._http.url = meta.location or where


_FSSPEC_PROTOCOLS = {"s3": ("s3fs", "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE", "remote")}
_FSSPEC_PROTOCOLS["gs"] = ("gcsfs", "GOOGLE_APPLICATION_CREDENTIALS", "gcs")
_FSSPEC_PROTOCOLS["az"] = ("adlfs", "AZURE_STORAGE_CONNECTION_STRING, or AZURE_STORAGE_ACCOUNT_NAME and a key", "azure")


class FsspecStore:
    """``s3://``, ``gs://``, ``az://`` through fsspec with caching off: explicit ranged reads
    (``_fetch_range`` of a file opened with ``cache_type="none"``, which checks the ETag on S3)."""

    def __init__(self, protocol: str) -> None:
        self.protocol = protocol
        self.package, self.hint, self.extra = _FSSPEC_PROTOCOLS[protocol]
        self.sources = _Sources()
        self._fs: Any = None
        self._lock = threading.Lock()

    def fs(self, url: str) -> Any:
        """The fsspec filesystem (made once, from the environment's settings)."""
        with self._lock:
            if self._fs is None:
                try:
                    import fsspec

                    self._fs = fsspec.filesystem(self.protocol)
                except ImportError:
                    raise ReadError(
                        f"{url}: {self.protocol}:// needs {self.package}: pip install 'ckpt-tui[{self.extra}]'"
                    ) from None
        return self._fs

    def call(self, url: str, work: Callable[[Any], Any]) -> Any:
        """``work(fs)``, its failures said in one line."""
        fs = self.fs(url)
        try:
            return work(fs)
        except ReadError:
            raise
        except FileNotFoundError:
            raise ReadError(f"{url}: not found") from None
        except PermissionError:
            raise ReadError(f"{url}: no access; set {self.hint}") from None
        except TimeoutError:
            raise _timeout_error(url) from None
        except Exception as exc:  # every failure of the client library, said in one line
            text = " ".join(str(exc).split())[:200]
            if "credential" in text.lower() or "AccessDenied" in text or "Forbidden" in text:
                raise ReadError(f"{url}: no access; set {self.hint} ({text})") from None
            if type(exc).__name__ == "FileExpired":
                raise ReadError(f"{url}: the file changed while being read (its ETag changed); open it again") from None
            raise ReadError(f"{url}: {type(exc).__name__}: {text}") from None

    def source(self, url: str) -> RemoteFile:
        return self.sources.get(url, lambda: _FsspecFile(self, url))

    def is_file(self, url: str) -> bool:
        return bool(self.call(url, lambda fs: fs.isfile(url)))

    def is_dir(self, url: str) -> bool:
        return bool(self.call(url, lambda fs: fs.isdir(url)))

    def lists(self, url: str) -> bool:
        return True  # (the bucket's listing)

    def list_dir(self, url: str) -> list[str]:
        names = self.call(url, lambda fs: fs.ls(url, detail=False))
        return sorted({posixpath.basename(str(name).rstrip("/")) for name in names})

    def remember(self) -> None:
        self.sources.remember()

    def opened(self) -> list[RemoteFile]:
        return self.sources.opened()


class _FsspecFile:
    def __init__(self, store: FsspecStore, url: str) -> None:
        self.store, self.url = store, url
        self._file: Any = None

    def stat(self) -> Stat:
        def info(fs: Any) -> Any:
            self._file = fs.open(self.url, "rb", cache_type="none", block_size=1 << 20)
            return self._file.details

        details = self.store.call(self.url, info)
        if details.get("type") == "directory":
            raise ReadError(f"{self.url}: a folder, not a file")
        identity = str(details.get("ETag") or details.get("etag") or details.get("md5Hash") or details.get("mtime", ""))
        return Stat(int(details["size"]), identity)

    def fetch(self, offset: int, length: int, identity: str) -> bytes:
        return bytes(self.store.call(self.url, lambda fs: self._file._fetch_range(offset, offset + length)))


def register() -> None:
    """Serve hf://, https://, http://, s3://, gs:// and az:// URLs (once)."""
    if byte_source.scheme_known("hf"):
        return
    byte_source.register_scheme("https", HttpStore)
    byte_source.register_scheme("http", HttpStore)
    byte_source.register_scheme("hf", HubStore)
    for protocol in _FSSPEC_PROTOCOLS:
        byte_source.register_scheme(protocol, lambda protocol=protocol: FsspecStore(protocol))  # type: ignore[misc]

"""Remote checkpoints served by the servers people start: ``python -m http.server`` (the standard library's
``SimpleHTTPRequestHandler``: no ranges, a folder answered with its HTML listing) and Werkzeug (Flask's
``send_from_directory``: a 416 to a suffix range longer than the file), each run for real on 127.0.0.1."""

from __future__ import annotations

import functools
import http.server
import json
import shlex
import shutil
import tempfile
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from builders import lightning_checkpoint, tiny_state_dict, write_sharded_safetensors
from safetensors.torch import load_file
from test_remote import corpus, outcome

from ckpt_tui.cli import main
from ckpt_tui.core.model import byte_source, remote, remote_stores
from ckpt_tui.core.readers.open import open_checkpoint
from ckpt_tui.core.values.stats import tensor_stats

DCP_FIXTURES = Path(__file__).parent / "fixtures" / "torch_distributed"


@pytest.fixture(autouse=True)
def fresh_remote(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test starts with no remote file known, an empty header cache and a fresh count."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    forget()
    monkeypatch.setattr(remote, "TRANSFER", remote.Transfer())
    yield
    forget()


def forget() -> None:
    """As a new process: no store made yet."""
    byte_source._opened_stores.clear()


class Server:
    """A real server on 127.0.0.1 (a free port), in a thread; ``log``: each request's method, path, Range and
    status, as the server answered it."""

    def __init__(self, httpd: Any, root: Path) -> None:
        self.root = root
        self.log: list[tuple[str, str, str, int]] = []
        self._httpd = httpd
        self._thread = threading.Thread(target=httpd.serve_forever, daemon=True)
        self._thread.start()
        self.url = f"http://127.0.0.1:{httpd.server_address[1]}"

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join()

    def gets(self, path: str) -> list[tuple[str, int]]:
        """The Range and status of every GET of ``path``."""
        return [(asked, status) for method, got, asked, status in self.log if method == "GET" and got == path]


@pytest.fixture
def stdlib(tmp_path: Path) -> Iterator[Server]:
    """``python -m http.server``: SimpleHTTPRequestHandler serving a folder (ranges ignored: 200 and the file)."""
    root = tmp_path / "served"
    root.mkdir()
    log: list[tuple[str, str, str, int]] = []

    class Recording(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass  # (its 404s are the probes the tests expect: kept off the CLI's stderr)

        def log_request(self, code: Any = "-", size: Any = "-") -> None:
            log.append((self.command, self.path, self.headers.get("Range", ""), int(getattr(code, "value", code))))

    class Quiet(http.server.ThreadingHTTPServer):
        def handle_error(self, request: Any, client_address: Any) -> None:
            pass  # (a client hanging up on a body past its budget is what a test wants: no traceback on stderr)

    httpd = Quiet(("127.0.0.1", 0), functools.partial(Recording, directory=str(root)))
    httpd.daemon_threads = True
    server = Server(httpd, root)
    server.log = log
    yield server
    server.stop()


@pytest.fixture
def werkzeug(tmp_path: Path) -> Iterator[Server]:
    """Werkzeug serving a folder with ``send_from_directory`` (what Flask's ``send_from_directory`` calls)."""
    serving = pytest.importorskip("werkzeug.serving")
    from werkzeug.utils import send_from_directory
    from werkzeug.wrappers import Request, Response

    root = tmp_path / "served"
    root.mkdir()
    log: list[tuple[str, str, str, int]] = []

    @Request.application  # type: ignore[misc]
    def app(request: Request) -> Response:
        return send_from_directory(str(root), request.path.lstrip("/"), request.environ)

    class Recording(serving.WSGIRequestHandler):
        def log(self, type: str, message: str, *args: Any) -> None:
            pass  # (kept off the CLI's stderr)

        def log_request(self, code: Any = "-", size: Any = "-") -> None:
            log.append((self.command, self.path, self.headers.get("Range", ""), int(getattr(code, "value", code))))

    httpd = serving.make_server("127.0.0.1", 0, app, threaded=True, request_handler=Recording)
    server = Server(httpd, root)
    server.log = log
    yield server
    server.stop()


def one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


def copy_dcp(folder: Path) -> Path:
    """The first DCP fixture folder, copied to ``folder`` (returned: the local original)."""
    original = sorted({p.parent for p in DCP_FIXTURES.rglob(".metadata")})[0]
    shutil.copytree(original, folder)
    return original


# ---- python -m http.server: no ranges ------------------------------------------------------------


def test_every_corpus_file_checks_as_the_local_one_from_a_server_without_ranges_in_one_get(stdlib: Server) -> None:
    names = corpus(stdlib.root)
    for name in names:
        local = outcome(str(stdlib.root / name), str(stdlib.root))
        far = outcome(f"{stdlib.url}/{name}", stdlib.url)
        assert far == local, name
        # the whole file came in the one answer to the first request: nothing asked again
        assert stdlib.gets(f"/{name}") == [("bytes=-65536", 200)], name
        forget()


def test_values_from_a_server_without_ranges_come_from_its_one_answer_kept_on_disk_when_large(
    stdlib: Server, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(remote_stores, "IN_MEMORY", 64 << 10)
    torch.save({f"w{i}": torch.randn(10_000) for i in range(5)}, stdlib.root / "m.pth")  # 200 kB
    local = open_checkpoint(str(stdlib.root / "m.pth"))
    far = open_checkpoint(f"{stdlib.url}/m.pth")
    for key in local.root:
        assert tensor_stats(far.root[key], far.byteorder) == tensor_stats(local.root[key], local.byteorder)
    assert stdlib.gets("/m.pth") == [("bytes=-65536", 200)]
    # past IN_MEMORY the body went to a private temporary file, not the process's memory
    kept = byte_source.source_of(f"{stdlib.url}/m.pth")._info().whole  # type: ignore[attr-defined]
    assert kept is not None and kept._rolled
    assert main(["info", f"{stdlib.url}/m.pth"]) == 0
    out = capsys.readouterr().out
    assert "kB on the server" in out and "on disk" not in out


def test_a_file_past_the_budget_from_a_server_without_ranges_is_refused_in_one_line(
    stdlib: Server, capsys: pytest.CaptureFixture[str]
) -> None:
    torch.save({"w": torch.randn(25_000)}, stdlib.root / "m.pth")
    assert main(["info", "--max-download", "10k", f"{stdlib.url}/m.pth"]) == 2
    line = one_error_line(capsys)
    assert "does not support ranged reads" in line and "past --max-download 10.0 kB" in line
    assert f"curl -LO {stdlib.url}/m.pth" in line and "changed" not in line


def test_a_spill_file_that_cannot_be_written_is_said_to_be_the_local_temporary_file(
    stdlib: Server, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(remote_stores, "IN_MEMORY", 64 << 10)
    torch.save({f"w{i}": torch.randn(10_000) for i in range(5)}, stdlib.root / "m.pth")  # 200 kB
    missing = tmp_path / "no-such-tmp"
    monkeypatch.setattr(tempfile, "tempdir", str(missing))
    assert main(["info", f"{stdlib.url}/m.pth"]) == 2
    line = one_error_line(capsys)
    assert "cannot write the local temporary file" in line and str(missing) in line and "TMPDIR" in line
    assert "connect" not in line


def test_check_and_stats_of_a_file_sent_whole_are_not_counted_against_the_budget_twice(
    stdlib: Server, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    torch.save({"w": torch.randn(75_000)}, stdlib.root / "m.pth")  # 300 kB, within 400k once, not twice
    for command in ("check", "stats"):
        assert main([command, "--max-download", "400k", f"{stdlib.url}/m.pth"]) == 0, capsys.readouterr().err
        assert capsys.readouterr().out.splitlines()[-1].startswith("fetched 301.")
        forget()  # (and a fresh count: a new process)
        monkeypatch.setattr(remote, "TRANSFER", remote.Transfer())
    assert [asked for asked, _ in stdlib.gets("/m.pth")] == ["bytes=-65536"] * 2


def test_an_index_over_a_server_without_ranges_reads_each_shard_whole_once(stdlib: Server, tmp_path: Path) -> None:
    state = dict(tiny_state_dict())
    index = write_sharded_safetensors(state, stdlib.root, shards=3)
    out = tmp_path / "one.safetensors"
    assert main(["convert", f"{stdlib.url}/{index.name}", "-o", str(out)]) == 0
    written = load_file(str(out))
    assert sorted(written) == sorted(state)
    assert all(torch.equal(written[key], value) for key, value in state.items())
    for shard in sorted(p.name for p in stdlib.root.glob("model-*.safetensors")):
        assert stdlib.gets(f"/{shard}") == [("bytes=-65536", 200)]


def test_an_index_whose_shard_is_past_the_budget_names_the_index_and_every_shard_to_download(
    stdlib: Server, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = {f"layer{i}.weight": torch.randn(64, 64) for i in range(6)}
    index = write_sharded_safetensors(state, stdlib.root, shards=3)
    url = f"{stdlib.url}/{index.name}"
    assert main(["info", "--max-download", "20k", url]) == 2
    line = one_error_line(capsys)
    assert "download the index and its 3 shards first" in line and "past --max-download 20.0 kB" in line
    # the command it gives, run as given (curl's part done here), leaves a folder that opens
    assert len(run_download(line, tmp_path / "dl")) == 4
    assert sorted(open_checkpoint(str(tmp_path / "dl" / index.name)).root) == sorted(state)


def run_download(line: str, into: Path) -> list[str]:
    """The ``curl -L --remote-name-all URL...`` an error line gives, done here (curl may be missing): each URL
    saved under its last segment in ``into``; the names saved."""
    command = shlex.split(line.split(" first (", 1)[1].split(") and ", 1)[0])
    assert command[:3] == ["curl", "-L", "--remote-name-all"]
    into.mkdir()
    for each in command[3:]:
        with urllib.request.urlopen(each) as answer:
            (into / each.rsplit("/", 1)[1]).write_bytes(answer.read())
    return [each.rsplit("/", 1)[1] for each in command[3:]]


def test_a_dcp_folder_whose_file_is_past_the_budget_names_every_file_to_download(
    stdlib: Server, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    local = copy_dcp(stdlib.root / "dcp")
    assert main(["info", "--max-download", "50k", f"{stdlib.url}/dcp/"]) == 2
    line = one_error_line(capsys)
    assert "download .metadata and its 2 storage files into one folder first" in line
    saved = run_download(line, tmp_path / "dl")
    assert sorted(saved) == sorted(p.name for p in local.iterdir())
    assert outcome(str(tmp_path / "dl"), str(tmp_path / "dl")) == outcome(str(local), str(local))


def test_a_set_naming_a_file_out_of_its_folder_gets_no_download_command(
    stdlib: Server, capsys: pytest.CaptureFixture[str]
) -> None:
    (stdlib.root / "repo").mkdir()
    torch.save({"w": torch.randn(25_000)}, stdlib.root / "repo" / "a.bin")
    weight_map = {"w": "a.bin", "x": "b/../../evil.bin"}
    (stdlib.root / "repo" / "pytorch_model.bin.index.json").write_text(json.dumps({"weight_map": weight_map}))
    assert main(["info", "--max-download", "10k", f"{stdlib.url}/repo/pytorch_model.bin.index.json"]) == 2
    line = one_error_line(capsys)
    # no command that would write ../../evil.bin: a.bin's own refusal, or the name's
    assert "evil" not in line or "leads out of" in line
    assert "--remote-name-all" not in line and "-o " not in line


@pytest.mark.parametrize("tail", ["/", ""])
def test_a_dcp_folder_s_url_opens_the_folder_from_its_listing_page(stdlib: Server, tail: str) -> None:
    local = copy_dcp(stdlib.root / "dcp")
    expected = outcome(str(local), str(local))
    # (the listing names every file of the folder: its other files are read for code as a local folder's)
    assert outcome(f"{stdlib.url}/dcp{tail}", f"{stdlib.url}/dcp{tail}".rstrip("/")) == expected


def unread_noted(found: Any) -> Any:
    """A remote folder's check outcome, whose folder's other files a server that lists nothing never names (none
    read: None, where a local check lists them), as a local check of the same folder, holding no other file, says
    it."""
    assert found["also_in_folder"] is None
    return {**found, "also_in_folder": []}


def test_a_save_pretrained_folder_s_url_opens_its_index(stdlib: Server) -> None:
    state = dict(tiny_state_dict())
    (stdlib.root / "hf").mkdir()
    index = write_sharded_safetensors(state, stdlib.root / "hf", shards=2)
    shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    checkpoint = open_checkpoint(f"{stdlib.url}/hf/")
    assert sorted(checkpoint.root) == sorted(state)
    asked = [path for method, path, _, _ in stdlib.log if method == "GET"]
    # the folder's page is its listing: no file a loader could open is probed for, only the ones listed are read
    # (the shards are read in parallel: in any order)
    assert asked[:3] == ["/hf/", "/hf/", f"/hf/{index.name}"]
    assert sorted(asked[3:]) == [f"/hf/{name}" for name in shards]


def test_an_html_page_with_no_checkpoint_behind_it_is_one_line_naming_the_dcp_way(
    stdlib: Server, capsys: pytest.CaptureFixture[str]
) -> None:
    torch.save(lightning_checkpoint(), stdlib.root / "lit.ckpt")
    # a site's page (http.server serves index.html for its folder): no listing, so the loaders' names are asked
    (stdlib.root / "index.html").write_text('<html><a href="https://example.com/">home</a></html>')
    assert main(["info", f"{stdlib.url}/"]) == 2
    line = one_error_line(capsys)
    assert f"{stdlib.url}/ is an HTML page, not a checkpoint" in line
    assert f"for a DCP folder open {stdlib.url}/.metadata" in line


async def test_the_browser_opens_a_dcp_folder_s_url(stdlib: Server) -> None:
    from builders_tui import header, loaded

    from ckpt_tui.tui.app import CkptApp

    copy_dcp(stdlib.root / "dcp")
    app = CkptApp(f"{stdlib.url}/dcp/")
    async with app.run_test(size=(80, 24)) as pilot:
        await loaded(pilot)
        assert "remote: fetched" in header(app)


async def test_the_browser_s_error_keeps_each_url_of_the_download_command_whole_and_y_copies_it(
    stdlib: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    from builders_tui import screen_text, settle

    from ckpt_tui.tui.app import CkptApp
    from ckpt_tui.tui.screens.dialogs import ErrorScreen

    state = {f"layer{i}.weight": torch.randn(64, 64) for i in range(6)}
    (stdlib.root / "tiny-gpt2").mkdir()
    index = write_sharded_safetensors(state, stdlib.root / "tiny-gpt2", shards=3)
    remote.TRANSFER.limit = 20_000
    app = CkptApp(f"{stdlib.url}/tiny-gpt2/{index.name}")
    copied: list[str] = []
    monkeypatch.setattr(app, "copy_to_clipboard", copied.append)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        assert isinstance(app.screen, ErrorScreen)
        shown = screen_text(app)
        names = [index.name, *sorted(p.name for p in (stdlib.root / "tiny-gpt2").glob("model-*"))]
        for name in names:  # every URL on one line of the screen, as a shell line continued with a backslash
            assert any(f"{stdlib.url}/tiny-gpt2/{name}" in line for line in shown.splitlines()), shown
        assert "curl -L --remote-name-all \\" in shown
        await pilot.press("y")
        await pilot.pause()
    assert copied and copied[0].startswith("curl -L --remote-name-all ") and "\n" not in copied[0]
    assert all(name in copied[0] for name in names)


# ---- Werkzeug (Flask's send_from_directory) --------------------------------------------------------


def test_werkzeug_s_416_to_a_suffix_longer_than_the_file_is_asked_again_for_the_length_it_names(
    werkzeug: Server, capsys: pytest.CaptureFixture[str]
) -> None:
    path = werkzeug.root / "lit.ckpt"
    torch.save(lightning_checkpoint(), path)
    size = path.stat().st_size
    assert size < remote.TAIL
    assert main(["check", f"{werkzeug.url}/lit.ckpt"]) == 0
    assert werkzeug.gets("/lit.ckpt") == [("bytes=-65536", 416), (f"bytes=0-{size - 1}", 206)]
    out = capsys.readouterr()
    assert "changed" not in out.out + out.err and f"of {size / 1000:.1f} kB (2 requests)" in out.out


def test_every_corpus_file_checks_as_the_local_one_over_werkzeug(werkzeug: Server) -> None:
    for name in corpus(werkzeug.root):
        local = outcome(str(werkzeug.root / name), str(werkzeug.root))
        assert outcome(f"{werkzeug.url}/{name}", werkzeug.url) == local, name
        forget()


def test_an_index_and_a_dcp_folder_s_url_open_over_werkzeug(werkzeug: Server) -> None:
    state = dict(tiny_state_dict())
    index = write_sharded_safetensors(state, werkzeug.root, shards=3)
    assert sorted(open_checkpoint(f"{werkzeug.url}/{index.name}").root) == sorted(state)
    local = copy_dcp(werkzeug.root / "dcp")
    # Werkzeug answers a folder 404: a URL ending in / is asked for the folder's .metadata all the same
    expected = outcome(str(local), str(local))
    assert unread_noted(outcome(f"{werkzeug.url}/dcp/", f"{werkzeug.url}/dcp")) == expected


def test_an_empty_file_on_a_range_server_is_said_to_be_empty(werkzeug: Server) -> None:
    (werkzeug.root / "empty.pth").write_bytes(b"")
    with pytest.raises(Exception, match="empty file") as caught:
        open_checkpoint(f"{werkzeug.url}/empty.pth")
    assert "changed" not in str(caught.value)


def test_info_lists_an_index_s_shards_in_file_order(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # transformers' weight_map is sorted by key, so lm_head (in the first shard) comes after the later shards' keys
    state = {"z_first.weight": torch.ones(2), "a_second.weight": torch.ones(2), "b_third.weight": torch.ones(2)}
    index = write_sharded_safetensors(state, tmp_path, shards=3)
    written = json.loads(index.read_text())
    written["weight_map"] = dict(sorted(written["weight_map"].items()))
    index.write_text(json.dumps(written))
    assert main(["info", str(index)]) == 0
    note = next(line for line in capsys.readouterr().out.splitlines() if "3 shards:" in line)
    # (folded only when the names run 1..3 in order)
    assert note.endswith("3 shards: model-{00001..00003}-of-00003.safetensors")


async def test_a_remote_files_header_at_80x24_keeps_its_first_warning_over_the_bytes_fetched(stdlib: Server) -> None:
    from builders_tui import fixed_training_checkpoint, header, loaded

    from ckpt_tui.tui.app import CkptApp

    checkpoint = fixed_training_checkpoint()
    checkpoint.pop("args")  # the weights_only refusal would be its first warning
    checkpoint["state_dict"] = checkpoint.pop("model")  # (a warning of three lines at 80 columns)
    torch.save(checkpoint, stdlib.root / "run.pth")
    app = CkptApp(f"{stdlib.url}/run.pth")
    async with app.run_test(size=(80, 24)) as pilot:
        await loaded(pilot)
        top = " ".join(header(app).split())
        assert "all their keys start with 'module.'" in top


def test_a_self_signed_https_server_is_one_line_naming_how_to_trust_its_certificate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import datetime
    import ssl

    pytest.importorskip("cryptography")
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    (tmp_path / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (tmp_path / "key.pem").write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tmp_path / "cert.pem", tmp_path / "key.pem")

    class Quiet(http.server.ThreadingHTTPServer):
        def handle_error(self, request: Any, client_address: Any) -> None:
            pass  # (the client refusing the certificate is the point)

    httpd = Quiet(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    httpd.socket = context.wrap_socket(httpd.socket, server_side=True)
    server = Server(httpd, tmp_path)
    try:
        url = f"https://127.0.0.1:{httpd.server_address[1]}/m.pth"
        assert main(["info", url]) == 2
        line = one_error_line(capsys)
        assert "certificate verify failed" in line.lower() and line.endswith(
            "SSL_CERT_FILE=/path/to/ca.pem trusts a private CA (or a self-signed certificate)"
        )
    finally:
        server.stop()

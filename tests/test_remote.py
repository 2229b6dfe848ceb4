"""Remote checkpoints over ranged reads: real servers on 127.0.0.1 (HTTP with Range, a Hub for
huggingface_hub through HF_ENDPOINT, moto's S3), counting the requests and bytes ckpt-tui asks for."""

from __future__ import annotations

import json
import os
import shutil
import zipfile
from collections import OrderedDict
from pathlib import Path
from typing import Any

import pytest
import torch
from builders import (
    lightning_checkpoint,
    many_keys,
    save_cuda_tagged,
    save_whole_module,
    tiny_state_dict,
    training_checkpoint,
    write_safetensors,
    write_sharded_bin,
    write_sharded_safetensors,
    write_torchscript,
)
from range_server import RangeServer

from ckpt_tui.core.errors import ReadError
from ckpt_tui.core.model import byte_source, remote
from ckpt_tui.core.operations.check import check_checkpoint
from ckpt_tui.core.readers.open import open_checkpoint
from ckpt_tui.core.values.stats import tensor_stats
from ckpt_tui.core.weights_only.verdict import verdict


@pytest.fixture(autouse=True)
def fresh_remote(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Each test starts with no remote file known, an empty header cache and a fresh count."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    forget()
    monkeypatch.setattr(remote, "TRANSFER", remote.Transfer())
    yield
    forget()


def forget() -> None:
    """As a new process: no store made yet (the header cache on disk stays)."""
    byte_source._opened_stores.clear()


@pytest.fixture
def served(tmp_path: Path) -> Any:
    root = tmp_path / "served"
    root.mkdir()
    with RangeServer(str(root)) as server:
        yield server


def root_of(server: RangeServer) -> Path:
    return Path(server.root)


def big_pth(path: Path, tensors: int = 16, elements: int = 1 << 25) -> Path:
    """A 2 GB .pth with few real bytes: torch writes the records' headers and skips their data (sparse)."""
    state = OrderedDict((f"layers.{i}.weight", torch.empty(elements)) for i in range(tensors))
    with torch.serialization.skip_data():
        torch.save(state, path)
    return path


def test_a_2gb_pth_opens_in_at_most_4_requests_and_under_1mb_plus_its_pickle(served: RangeServer) -> None:
    path = big_pth(root_of(served) / "big.pth")
    assert path.stat().st_size > 2 * 10**9
    pickle_size = zipfile.ZipFile(path).getinfo("big/data.pkl").file_size
    checkpoint = open_checkpoint(f"{served.url}/big.pth")
    assert [t.shape for t in checkpoint.root.values()] == [(1 << 25,)] * 16
    assert len(served.served.requests) <= 4
    assert served.served.bytes_sent < (1 << 20) + pickle_size
    assert byte_source.fetched_of(f"{served.url}/big.pth") == served.served.bytes_sent


def test_check_of_a_2gb_pth_gives_its_verdict_from_the_pickle_and_headers_alone(served: RangeServer) -> None:
    big_pth(root_of(served) / "big.pth")
    checkpoint = open_checkpoint(f"{served.url}/big.pth")
    judged = verdict(checkpoint)
    assert judged.loads is True
    assert served.served.bytes_sent < 2 << 20  # the records' local headers, fetched together


def corpus(folder: Path) -> list[str]:
    """One file of each kind the builders make (the names the tests' corpus uses)."""
    made = [
        write_safetensors(dict(tiny_state_dict()), folder / "model.safetensors").name,
        torch_file(tiny_state_dict(), folder / "state.pth"),
        torch_file(training_checkpoint(), folder / "training.pt"),
        torch_file(lightning_checkpoint(), folder / "lightning.ckpt"),
        torch_file(many_keys(300), folder / "many.pth"),
        torch_file(tiny_state_dict(), folder / "legacy.bin", _use_new_zipfile_serialization=False),
        torch_file(
            {"w": torch.randn(3, 3).to(torch.float16), "ids": torch.arange(4)}, folder / "proto4.pt", pickle_protocol=4
        ),
        save_cuda_tagged(dict(tiny_state_dict()), folder / "cuda.pth").name,
        save_whole_module(folder / "module.pth").name,
        write_torchscript(folder / "script.pt").name,
        torch_file({"w": torch.tensor([1.0, float("nan")])}, folder / "nan.pth"),
    ]
    (folder / "plain.pkl").write_bytes(b"\x80\x02}q\x00X\x01\x00\x00\x00aK\x01s.")
    (folder / "hostile.pkl").write_bytes(b"cos\nsystem\n(S'true'\ntR.")
    return [*made, "plain.pkl", "hostile.pkl"]


def torch_file(obj: Any, path: Path, **kwargs: Any) -> str:
    torch.save(obj, path, **kwargs)
    return path.name


def outcome(path: str, where: str) -> Any:
    """What check says of a file, with its location taken out."""
    try:
        checkpoint = open_checkpoint(path)
    except ReadError as exc:
        return ("refused", str(exc).replace(path, "FILE"))
    report = check_checkpoint(checkpoint)
    found = report.to_json()
    found["path"] = "FILE"
    return json.loads(json.dumps(found, default=str).replace(where, "FOLDER"))


def test_the_remote_verdict_and_check_equal_the_local_ones_on_every_corpus_file(served: RangeServer) -> None:
    folder = root_of(served)
    names = corpus(folder)
    for name in names:
        local = outcome(str(folder / name), str(folder))
        far = outcome(f"{served.url}/{name}", served.url)
        assert far == local, name


def test_stats_of_remote_values_equal_the_local_ones(served: RangeServer) -> None:
    folder = root_of(served)
    torch.save(
        {"w": torch.randn(300, 200), "t": torch.randn(10, 10).t(), "h": torch.randn(50).half()}, folder / "m.pth"
    )
    local = open_checkpoint(str(folder / "m.pth"))
    far = open_checkpoint(f"{served.url}/m.pth")
    for name in ("w", "t", "h"):
        assert tensor_stats(far.root[name], far.byteorder) == tensor_stats(local.root[name], local.byteorder)


def test_values_past_the_budget_are_refused_in_one_line_saying_how_much(served: RangeServer) -> None:
    torch.save({"w": torch.randn(1 << 20)}, root_of(served) / "m.pth")
    checkpoint = open_checkpoint(f"{served.url}/m.pth")
    remote.TRANSFER.limit = remote.TRANSFER.fetched + 100_000
    sent = served.served.bytes_sent
    # (the read asks for a chunk at a time: the refusal names what the next one needs; the CLI claims the
    # whole command's bytes up front)
    with pytest.raises(ReadError, match=r"needs \d\.\d MB more .* past --max-download"):
        tensor_stats(checkpoint.root["w"], checkpoint.byteorder)
    assert served.served.bytes_sent == sent  # refused before any byte was asked for


def test_a_server_without_ranges_is_refused_past_the_budget_with_an_offer_to_download(tmp_path: Path) -> None:
    torch.save({"w": torch.randn(1000)}, tmp_path / "m.pth")
    remote.TRANSFER.limit = 1000
    with RangeServer(str(tmp_path), ranges=False) as server, pytest.raises(ReadError) as caught:
        open_checkpoint(f"{server.url}/m.pth")
    message = str(caught.value)
    assert "does not support ranged reads" in message and "curl -LO" in message and "\n" not in message
    assert "past --max-download 1.0 kB" in message


def test_a_server_without_ranges_gives_the_whole_file_within_the_budget(tmp_path: Path) -> None:
    torch.save({"w": torch.arange(1000.0)}, tmp_path / "m.pth")
    with RangeServer(str(tmp_path), ranges=False) as server:
        checkpoint = open_checkpoint(f"{server.url}/m.pth")
        assert tensor_stats(checkpoint.root["w"], checkpoint.byteorder).max == 999.0
        assert len(server.served.ranged()) == 1


def test_an_empty_file_on_a_range_server_is_said_to_be_empty_not_changed(served: RangeServer) -> None:
    (root_of(served) / "empty.pth").write_bytes(b"")
    with pytest.raises(ReadError, match="empty file") as caught:
        open_checkpoint(f"{served.url}/empty.pth")
    assert "changed" not in str(caught.value)
    assert served.served.ranged() == [("GET", "/empty.pth", "bytes=-65536")]  # its 416 names its length: 0


def test_a_missing_remote_file_is_one_line(served: RangeServer) -> None:
    with pytest.raises(ReadError, match=r"no such file or directory|not found"):
        open_checkpoint(f"{served.url}/none.pth")


def test_a_file_that_changes_mid_read_is_refused(served: RangeServer) -> None:
    path = root_of(served) / "m.pth"
    torch.save({"w": torch.randn(1 << 20)}, path)
    checkpoint = open_checkpoint(f"{served.url}/m.pth")
    torch.save({"w": torch.randn(1 << 20)}, path)
    os.utime(path, ns=(1, 1))
    with pytest.raises(ReadError, match="changed while being read"):
        tensor_stats(checkpoint.root["w"], checkpoint.byteorder)


def test_reopening_a_remote_file_costs_one_request(served: RangeServer) -> None:
    torch.save(many_keys(2000), root_of(served) / "m.pth")
    first = open_checkpoint(f"{served.url}/m.pth")
    assert len(served.served.requests) >= 2
    served.served.reset()
    forget()
    again = open_checkpoint(f"{served.url}/m.pth")
    assert len(served.served.requests) == 1
    assert list(again.root) == list(first.root)


def test_a_busy_server_is_waited_for(tmp_path: Path) -> None:
    torch.save({"w": torch.ones(3)}, tmp_path / "m.pth")
    with RangeServer(str(tmp_path), throttle_first=2) as server:
        assert list(open_checkpoint(f"{server.url}/m.pth").root) == ["w"]
        assert [r for r in server.served.requests][:2] == [("GET", "/m.pth", "bytes=-65536")] * 2


def test_an_index_opens_its_remote_shards(served: RangeServer) -> None:
    state = dict(tiny_state_dict())
    (root_of(served) / "bin").mkdir()
    index = write_sharded_bin(state, root_of(served) / "bin", shards=3)
    checkpoint = open_checkpoint(f"{served.url}/bin/{index.name}")
    assert sorted(checkpoint.root) == sorted(state)


# ---- the Hub, through HF_ENDPOINT ------------------------------------------------------------------


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    pytest.importorskip("huggingface_hub")
    root = tmp_path / "hub"
    root.mkdir()
    with RangeServer(str(root)) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
        monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
        yield server


def test_an_hf_repo_of_4_shards_opens_with_its_shards_read_in_parallel(hub: RangeServer) -> None:
    hub.latency = 0.05  # requests in flight together overlap
    state = dict(many_keys(40))
    (root_of(hub) / "org" / "model").mkdir(parents=True)
    write_sharded_safetensors(state, root_of(hub) / "org" / "model", shards=4)
    checkpoint = open_checkpoint("hf://org/model")
    assert sorted(checkpoint.root) == sorted(state)
    shards = {path for _, path, _ in hub.served.ranged() if path.endswith(".safetensors")}
    assert len(shards) == 4
    # the index resolved main to a commit: every shard is read at that commit (main may move meanwhile)
    assert {path.split("/")[4] for path in shards} == {hub.served_commit("org/model")}
    assert hub.served.most_active >= 2  # several shards' requests were in flight at once
    for name, tensor in state.items():
        assert tensor_stats(checkpoint.root[name], "little").count == tensor.numel()


def test_an_hf_file_at_a_revision_opens_with_the_hub_s_routes(hub: RangeServer) -> None:
    folder = root_of(hub) / "org" / "model"
    folder.mkdir(parents=True)
    torch.save(dict(tiny_state_dict()), folder / "pytorch_model.bin")
    checkpoint = open_checkpoint("hf://org/model@v1/pytorch_model.bin")
    assert list(checkpoint.root) == list(tiny_state_dict())
    assert [path for _, path, _ in hub.served.requests][:1] == ["/org/model/resolve/v1/pytorch_model.bin"]
    assert all("/resolve/" in path for _, path, _ in hub.served.requests)  # then at the commit v1 resolved to
    hub.served.reset()
    forget()
    open_checkpoint("hf://org/model@v1/pytorch_model.bin")
    assert hub.served.requests == [("HEAD", "/org/model/resolve/v1/pytorch_model.bin", "")]  # the header cache
    assert verdict(checkpoint).loads is True


def test_a_deepspeed_folder_opens_from_the_hub(hub: RangeServer) -> None:
    fixture = Path(__file__).parent / "fixtures" / "deepspeed" / "zero2_fp32"
    target = root_of(hub) / "org" / "zero"
    for file in fixture.rglob("*"):
        if file.is_file():
            (target / file.relative_to(fixture)).parent.mkdir(parents=True, exist_ok=True)
            (target / file.relative_to(fixture)).write_bytes(file.read_bytes())
    local = open_checkpoint(str(fixture))
    far = open_checkpoint("hf://org/zero")
    assert far.format == local.format
    assert sorted(map(str, far.root)) == sorted(map(str, local.root))


def test_a_private_repo_names_hf_token_and_opens_with_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("huggingface_hub")
    folder = tmp_path / "hub" / "org" / "private"
    folder.mkdir(parents=True)
    write_safetensors(dict(tiny_state_dict()), folder / "model.safetensors")
    with RangeServer(str(tmp_path / "hub"), token="hf_secret") as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        with pytest.raises(ReadError, match="HF_TOKEN"):
            open_checkpoint("hf://org/private/model.safetensors")
        forget()
        monkeypatch.setenv("HF_TOKEN", "hf_secret")
        assert sorted(open_checkpoint("hf://org/private/model.safetensors").root) == sorted(tiny_state_dict())


# ---- S3, through moto's server and AWS_ENDPOINT_URL ------------------------------------------------------


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch) -> Any:
    moto_server = pytest.importorskip("moto.server")
    s3fs = pytest.importorskip("s3fs")
    import boto3

    # (fsspec keeps one filesystem per settings: a later test's server has another port)
    s3fs.S3FileSystem.clear_instance_cache()

    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    url = f"http://{host}:{port}"
    for name, value in {
        "AWS_ENDPOINT_URL": url,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
    }.items():
        monkeypatch.setenv(name, value)
    client = boto3.client("s3", endpoint_url=url)
    client.create_bucket(Bucket="ckpts")
    try:
        yield client
    finally:
        server.stop()


def put_folder(client: Any, folder: Path, prefix: str) -> None:
    for file in sorted(folder.rglob("*")):
        if file.is_file():
            client.put_object(Bucket="ckpts", Key=f"{prefix}/{file.relative_to(folder)}", Body=file.read_bytes())


def test_an_s3_file_and_a_dcp_folder_open_and_check_as_local(s3: Any, tmp_path: Path) -> None:
    torch.save(dict(tiny_state_dict()), tmp_path / "m.pth")
    s3.put_object(Bucket="ckpts", Key="run/m.pth", Body=(tmp_path / "m.pth").read_bytes())
    assert outcome("s3://ckpts/run/m.pth", "s3://ckpts/run") == outcome(str(tmp_path / "m.pth"), str(tmp_path))
    dcp = Path(__file__).parent / "fixtures" / "torch_distributed"
    folders = sorted({p.parent for p in dcp.rglob(".metadata")})
    assert folders
    put_folder(s3, folders[0], "dcp")
    local = open_checkpoint(str(folders[0]))
    far = open_checkpoint("s3://ckpts/dcp")
    assert far.format == local.format == "dcp"
    for (key, tensor), (_, other) in zip(sorted(flat(far.root)), sorted(flat(local.root)), strict=True):
        assert tensor_stats(tensor, far.byteorder) == tensor_stats(other, local.byteorder), key


def flat(root: Any) -> list[tuple[str, Any]]:
    from ckpt_tui.core.model.tree import iter_tensors

    return [(str(path), tensor) for path, tensor in iter_tensors(root)]


# ---- the command line -------------------------------------------------------------------------------


def test_info_ends_with_the_bytes_fetched_against_the_file_size(served: RangeServer, capsys: Any) -> None:
    from ckpt_tui.cli import main

    big_pth(root_of(served) / "big.pth")
    assert main(["info", f"{served.url}/big.pth"]) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.startswith("fetched ") and last.endswith("of 2.1 GB (3 requests)")
    forget()
    assert main(["info", "--json", f"{served.url}/big.pth"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert found["transferred"]["file_bytes"] == found["file_bytes"] > 2 * 10**9
    assert found["transferred"]["requests"] == 1  # reopened: the header cache answers the rest


def test_check_past_the_budget_is_refused_up_front_saying_how_much(served: RangeServer, capsys: Any) -> None:
    from ckpt_tui.cli import main

    big_pth(root_of(served) / "big.pth")
    assert main(["check", f"{served.url}/big.pth"]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and "needs 2.1 GB of tensor values" in error[0] and "--max-download 1.0 GB" in error[0]
    assert served.served.bytes_sent < 1 << 20


def test_stats_and_diff_of_a_remote_file_within_the_budget(served: RangeServer, capsys: Any) -> None:
    from ckpt_tui.cli import main

    torch.save({"w": torch.randn(100, 100), "b": torch.zeros(10)}, root_of(served) / "m.pth")
    url = f"{served.url}/m.pth"
    assert main(["stats", "--json", "--max-download", "1M", url]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [row["numel"] for row in rows["tensors"]] == [10000, 10]
    assert rows["transferred"]["fetched"] > 40000
    assert main(["diff", url, str(root_of(served) / "m.pth")]) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith("fetched ")
    forget()
    assert main(["stats", "--max-download", "10k", url]) == 2
    assert "past --max-download 10.0 kB" in capsys.readouterr().err


async def test_the_browser_opens_a_remote_file_and_its_header_shows_the_bytes_fetched(served: RangeServer) -> None:
    from builders_tui import header, loaded

    from ckpt_tui.tui.app import CkptApp

    big_pth(root_of(served) / "big.pth")
    app = CkptApp(f"{served.url}/big.pth")
    async with app.run_test(size=(120, 36)) as pilot:
        tree = await loaded(pilot)
        assert [str(n.label).split()[0] for n in tree.root.children][:2] == ["layers.0.weight", "layers.1.weight"]
        top = header(app)
        assert "big.pth" in top and "remote: fetched" in top and "of 2.1 GB" in top


def test_a_legacy_file_fetches_its_storage_counts_together(tmp_path: Path) -> None:
    state = OrderedDict((f"w{i}", torch.randn(50_000)) for i in range(12))
    torch.save(state, tmp_path / "old.bin", _use_new_zipfile_serialization=False)
    with RangeServer(str(tmp_path), latency=0.05) as server:
        checkpoint = open_checkpoint(f"{server.url}/old.bin")
        assert checkpoint.format == "legacy" and list(checkpoint.root) == list(state)
        spans = [r[2].removeprefix("bytes=").split("-") for r in server.served.requests]
        counts = [s for s in spans if s[0] and int(s[1]) - int(s[0]) == 7]
        assert len(counts) >= 8 and server.served.most_active >= 4  # each count's 8 bytes, asked for together
        assert server.served.bytes_sent < 200_000


def test_diff_of_remote_files_past_the_budget_compares_keys_shapes_and_dtypes(served: RangeServer, capsys: Any) -> None:
    from ckpt_tui.cli import main

    torch.save({"w": torch.randn(1 << 18), "b": torch.zeros(3)}, root_of(served) / "v1.pth")
    torch.save({"w": torch.randn(1 << 18), "c": torch.zeros(3, dtype=torch.float16)}, root_of(served) / "v2.pth")
    code = main(["diff", "--max-download", "500k", f"{served.url}/v1.pth", f"{served.url}/v2.pth"])
    out = capsys.readouterr().out
    assert code == 1
    assert "only in A (1)" in out and "values not compared" in out and "past --max-download 500.0 kB" in out
    assert served.served.bytes_sent < 300_000  # the two opens (a 64 kB tail and a pickle each), no values
    forget()
    remote.TRANSFER.limit = remote.DEFAULT_MAX_DOWNLOAD  # (the option is the process's: a new run)
    assert main(["diff", "--json", f"{served.url}/v1.pth", f"{served.url}/v2.pth"]) == 1
    found = json.loads(capsys.readouterr().out)
    assert found["values_not_compared"] is None and [c["key"] for c in found["value_changes"]] == ["w"]


def test_diff_of_two_revisions_of_an_hf_repo(hub: RangeServer, capsys: Any) -> None:
    from ckpt_tui.cli import main

    for revision, width in (("v1", 4), ("v2", 5)):
        folder = root_of(hub) / f"org/model@{revision}"
        folder.mkdir(parents=True)
        write_safetensors({"w": torch.ones(3, width), "b": torch.zeros(3)}, folder / "model.safetensors")
    assert main(["diff", "hf://org/model@v1", "hf://org/model@v2"]) == 1
    out = capsys.readouterr().out
    assert "w: [3, 4] → [3, 5]" in out and "1 tensor identical" in out and out.splitlines()[-1].startswith("fetched")


def test_a_server_that_does_not_answer_in_time_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ckpt_tui.core.model import remote_stores

    (tmp_path / "m.pth").write_bytes(b"x" * 100)
    monkeypatch.setattr(remote_stores, "TIMEOUT", 0.2)
    with (
        RangeServer(str(tmp_path), latency=1.0) as server,
        pytest.raises(ReadError, match=r"did not answer within 0\.2 s"),
    ):
        open_checkpoint(f"{server.url}/m.pth")


def test_convert_of_a_remote_file_writes_a_local_copy_torch_loads(served: RangeServer, tmp_path: Path) -> None:
    from ckpt_tui.cli import main

    state = {"module.w": torch.randn(300, 300), "module.b": torch.randn(300), "step": torch.tensor(3)}
    torch.save(state, root_of(served) / "m.pth")
    out = tmp_path / "out.pth"
    assert main(["convert", f"{served.url}/m.pth", "--strip-prefix", "module.", "-o", str(out)]) == 0
    loaded = torch.load(out, weights_only=True)
    assert list(loaded) == ["w", "b", "step"]
    assert all(torch.equal(loaded[k.removeprefix("module.")], v) for k, v in state.items())
    out = tmp_path / "out.safetensors"
    assert main(["convert", f"{served.url}/m.pth", "--dtype", "fp16", "-o", str(out)]) == 0
    from safetensors.torch import load_file

    assert torch.equal(load_file(out)["module.w"], state["module.w"].half())


def test_every_fixture_folder_checks_the_same_from_the_hub(hub: RangeServer) -> None:
    fixtures = Path(__file__).parent / "fixtures"
    target = root_of(hub) / "fixtures" / "all"
    files = sorted(p for p in fixtures.rglob("*") if p.is_file())
    for file in files:
        (target / file.relative_to(fixtures)).parent.mkdir(parents=True, exist_ok=True)
        (target / file.relative_to(fixtures)).write_bytes(file.read_bytes())
    assert len(files) > 20
    # a file of a DCP or DeepSpeed folder opens the whole folder: one file of each folder is enough
    for file in {file.parent: file for file in reversed(files)}.values():
        relative = file.relative_to(fixtures).as_posix()
        local = outcome(str(file), str(fixtures))
        far = outcome(f"hf://fixtures/all/{relative}", "hf://fixtures/all")
        assert far == local, relative


# ---- names a file hands us, asked of a web server -----------------------------------------------------


def test_a_dcp_folder_over_https_checks_as_the_local_one(served: RangeServer) -> None:
    fixtures = Path(__file__).parent / "fixtures" / "torch_distributed"
    folder = sorted({p.parent for p in fixtures.rglob(".metadata")})[0]
    far = root_of(served) / "dcp"
    far.mkdir()
    for file in folder.iterdir():
        (far / file.name).write_bytes(file.read_bytes())
    # the verdict was asked of the folder's URL, which a web server answers 404: "torch.load REFUSES it"
    local = outcome(str(folder / ".metadata"), str(folder))
    assert local["weights_only"]["loads"] is None
    assert outcome(f"{served.url}/dcp/.metadata", f"{served.url}/dcp") == local


def shards_named(folder: Path, names: list[str]) -> Path:
    """An index of one tensor per shard, the shards named ``names`` (written where the names lead)."""
    weight_map = {}
    for number, name in enumerate(names):
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        write_safetensors({f"t{number}": torch.full((2,), float(number))}, folder / name)
        weight_map[f"t{number}"] = name
    index = folder / "model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return index


def test_a_shard_name_is_asked_for_percent_encoded(served: RangeServer) -> None:
    folder = root_of(served) / "repo"
    folder.mkdir()
    shards_named(folder, ["model 1.safetensors", "sub/50%.safetensors", "q?x=1.safetensors"])
    checkpoint = open_checkpoint(f"{served.url}/repo/model.safetensors.index.json")
    assert sorted(checkpoint.root) == ["t0", "t1", "t2"]
    # the server logs each path decoded: unencoded, '?' would start a query and '%.' would not decode
    asked = {path for _, path, _ in served.served.requests}
    assert {"/repo/model 1.safetensors", "/repo/sub/50%.safetensors", "/repo/q?x=1.safetensors"} <= asked


@pytest.mark.parametrize(
    "name", ["%2e%2e/secret/evil.safetensors", "..%2Fsecret/evil.safetensors", "..\\secret.safetensors"]
)
def test_a_shard_name_that_a_server_would_resolve_out_of_the_folder_is_refused(
    served: RangeServer, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from ckpt_tui.cli import main

    root = root_of(served)
    (root / "repo").mkdir()
    (root / "secret").mkdir()
    write_safetensors({"b": torch.full((2,), 666.0)}, root / "secret" / "evil.safetensors")
    index = shards_named(root / "repo", ["a.safetensors"])
    mapping = json.loads(index.read_text())
    mapping["weight_map"]["b"] = name
    index.write_text(json.dumps(mapping))
    # the test server decodes %XX and resolves '..', as nginx does: the name must never reach it so
    assert main(["check", f"{served.url}/repo/model.safetensors.index.json"]) == 2
    assert "leads out of" in capsys.readouterr().err
    assert not any("secret" in path or "%2e" in path.lower() for _, path, _ in served.served.requests)


# ---- a remote folder's other files are not read: the report says so ---------------------------------------------


def _payload_beside(folder: Path) -> None:
    """What a local check of the folder would report: a file beside the checkpoint whose load runs code."""
    torch.save({"x": OrderedDict(a=torch.ones(1)), "code": zipfile.ZipFile}, folder / "optimizer.pt")


def test_a_remote_set_says_its_folder_s_other_files_were_not_read(served: RangeServer, capsys: Any) -> None:
    from ckpt_tui.cli import main

    fixtures = Path(__file__).parent / "fixtures" / "torch_distributed"
    dcp = root_of(served) / "dcp"
    dcp.mkdir()
    for file in sorted({p.parent for p in fixtures.rglob(".metadata")})[0].iterdir():
        (dcp / file.name).write_bytes(file.read_bytes())
    (root_of(served) / "sharded").mkdir()
    index = write_sharded_safetensors(dict(many_keys(4)), root_of(served) / "sharded")
    for folder in (dcp, index.parent):
        _payload_beside(folder)
        assert main(["check", str(folder)]) == 1  # locally, the file beside is read
        capsys.readouterr()
    unread = "files beside a remote checkpoint were not read"
    # (the folder's own URL too: a web server's folder lists only the files a loader opens)
    for url in (f"{served.url}/dcp/.metadata", f"{served.url}/dcp/", f"{served.url}/sharded/{index.name}"):
        assert main(["check", url]) == 0
        out = capsys.readouterr().out
        assert unread in out and "read for code" not in out, out
        assert main(["info", url]) == 0
        assert f"note        {unread}" in capsys.readouterr().out
    # one remote file is no set: nothing to say
    write_safetensors(dict(many_keys(2)), root_of(served) / "one.safetensors")
    assert main(["check", f"{served.url}/one.safetensors"]) == 0
    assert unread not in capsys.readouterr().out


def test_an_hf_folder_s_other_files_are_read_for_code_as_a_local_folder_s(hub: RangeServer, capsys: Any) -> None:
    from ckpt_tui.cli import main

    for name in ("clean", "run"):
        repo = root_of(hub) / "org" / name
        repo.mkdir(parents=True)
        write_sharded_safetensors(dict(many_keys(4)), repo)
        (repo / "README.md").write_text("# a model\n")
        (repo / "config.json").write_text('{"hidden_size": 8}')
        (repo / "trainer_state.json").write_text('{"global_step": 3}')
    _payload_beside(repo)
    assert main(["check", "hf://org/clean"]) == 0
    out = capsys.readouterr().out
    assert "files beside a remote checkpoint were not read" not in out and "[code-beside]" not in out, out
    assert main(["check", str(repo)]) == 1
    local = capsys.readouterr().out
    assert main(["check", "hf://org/run"]) == 1
    far = capsys.readouterr().out
    assert "[code-beside] optimizer.pt (also in the folder" in far and "zipfile.ZipFile" in far
    said = [line for line in far.replace("hf://org/run", "FOLDER").splitlines()[1:] if not line.startswith("fetched")]
    assert said == [
        line for line in local.replace(str(repo), "FOLDER").splitlines()[1:] if not line.startswith("fetched")
    ]


def test_converting_a_remote_dcp_folder_past_the_budget_says_so_not_truncated(
    served: RangeServer, capsys: Any, tmp_path: Path
) -> None:
    import warnings

    import torch.distributed.checkpoint as dcp

    from ckpt_tui.cli import main

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (saved in one process, without a process group)
        dcp.save(
            {"model": {"w": torch.randn(500, 1000), "v": torch.randn(300, 1000)}},
            checkpoint_id=str(root_of(served) / "dcp"),
        )
    out = tmp_path / "out.pth"
    assert main(["convert", f"{served.url}/dcp/", "-o", str(out), "--max-download", "1M"]) == 2
    # (the server thread may log a request cut short to stderr too)
    error = [line for line in capsys.readouterr().err.splitlines() if line.startswith("ckpt-tui:")]
    assert len(error) == 1 and "past --max-download 1.0 MB" in error[0] and "raise it" in error[0], error
    assert "truncated" not in error[0] and not out.exists()
    forget()
    remote.TRANSFER.limit = remote.DEFAULT_MAX_DOWNLOAD  # (the option is the process's: a new run)
    assert main(["convert", f"{served.url}/dcp/", "-o", str(out)]) == 0
    assert torch.equal(torch.load(out, weights_only=True)["model"]["v"], dcp_values(root_of(served) / "dcp")["v"])


def dcp_values(folder: Path) -> dict[str, torch.Tensor]:
    """The DCP's model values, as torch's own converter writes them."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    dcp_to_torch_save(folder, folder.parent / "ref.pt")
    return torch.load(folder.parent / "ref.pt", weights_only=True)["model"]


# ---- every byte fetched is counted, and held to --max-download -------------------------------------


def nan_training_file(path: Path) -> Path:
    """A torch zip of 8 weights of 256 kB (one holding a NaN) inside a training checkpoint."""
    model = OrderedDict((f"layer{i}.weight", torch.randn(256, 256)) for i in range(8))
    model["layer3.weight"][0, 0] = float("nan")
    torch.save({"epoch": 3, "model": model}, path)
    return path


def cli(*args: str, cache: Path) -> Any:
    """The command line in a process of its own (single-threaded, as a user runs it: where a child may be forked)."""
    import subprocess
    import sys

    environment = {**os.environ, "XDG_CACHE_HOME": str(cache)}
    return subprocess.run(
        [sys.executable, "-m", "ckpt_tui", *args], capture_output=True, text=True, env=environment, timeout=120
    )


def test_check_of_a_remote_zip_counts_every_byte_the_server_sent(served: RangeServer, tmp_path: Path) -> None:
    nan_training_file(root_of(served) / "train.pth")
    done = cli("check", "--json", f"{served.url}/train.pth", cache=tmp_path / "cache")
    assert done.returncode == 1, done.stderr  # the NaN
    found = json.loads(done.stdout)
    assert any(p["kind"] == "nan" or "NaN" in p["message"] for p in found["problems"])
    assert found["transferred"]["fetched"] == served.served.bytes_sent
    assert found["transferred"]["requests"] == len(served.served.requests)
    # each byte once: no value is fetched twice (the NaN's tensor is read again from what was fetched)
    assert served.served.bytes_sent <= (root_of(served) / "train.pth").stat().st_size


def test_check_within_a_cap_just_above_its_need_never_fetches_past_it(served: RangeServer, tmp_path: Path) -> None:
    size = nan_training_file(root_of(served) / "train.pth").stat().st_size
    cap = size + 200_000  # (the values, and what the open fetched: the need said up front)
    done = cli("check", "--max-download", str(cap), f"{served.url}/train.pth", cache=tmp_path / "cache")
    assert done.returncode == 1, done.stderr
    assert served.served.bytes_sent <= size
    assert done.stdout.splitlines()[-1].startswith(f"fetched {byte_source.human(served.served.bytes_sent)} of ")


def test_a_forked_child_fetches_nothing_it_could_not_count() -> None:
    counted = remote.Transfer()
    counted._pid = -1  # (as the count a forked child inherits: its parent's)
    with pytest.raises(ReadError, match="not a child"):
        counted.reserve("http://h/f.pth", 10)
    with pytest.raises(ReadError, match="not a child"):
        counted.claim("http://h/f.pth", 10)
    assert counted.fetched == 0


def suggested(line: str) -> str:
    """The value a budget refusal says to raise ``--max-download`` to."""
    import re

    found = re.search(r"--max-download (\S+?)\)", line)
    assert found is not None, line
    return found.group(1)


@pytest.mark.parametrize(("command", "passes"), [("check", 1), ("stats", 1), ("convert", 0)])
def test_past_the_budget_each_value_command_is_refused_up_front_with_a_value_that_then_passes(
    served: RangeServer, capsys: Any, tmp_path: Path, command: str, passes: int
) -> None:
    # (check and stats say the NaN with exit 1; convert copies it)
    from ckpt_tui.cli import main

    size = nan_training_file(root_of(served) / "train.pth").stat().st_size
    url, out = f"{served.url}/train.pth", tmp_path / "out.pth"
    tail = ["-o", str(out)] if command == "convert" else []
    assert main([command, "--max-download", str(size - 1000), url, *tail]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "needs 2.1 MB of tensor values" in err[0], err
    assert "in all" in err[0] and "fetched already" in err[0]
    # nothing but the open was fetched, nor written
    assert served.served.bytes_sent < 200_000 and not out.exists()
    value = suggested(err[0])
    assert remote.parse_size(value) >= size  # rounded up: never less than the need it names
    forget()
    remote.TRANSFER = remote.Transfer()  # (a new run)
    assert main([command, "--max-download", value, url, *tail]) == passes, capsys.readouterr().err


def test_a_suggested_cap_is_never_below_the_need_it_answers() -> None:
    for count in (1, 999, 1000, 1001, 16_929_325, 16_900_000, 10**9 + 1, 123_456_789_012, 7 * 10**12 + 1):
        value = remote.size_text(count)
        assert remote.parse_size(value) >= count, (count, value)
        assert remote.parse_size(value) <= count * 1.01 + 100, (count, value)


def test_a_cap_below_a_header_read_says_what_came_and_the_least_value_to_read_on(
    served: RangeServer, capsys: Any
) -> None:
    from ckpt_tui.cli import main

    nan_training_file(root_of(served) / "train.pth")
    assert main(["info", "--max-download", "10k", f"{served.url}/train.pth"]) == 2
    line = one_line(capsys)
    assert "past --max-download 10.0 kB (65.5 kB fetched already)" in line
    assert remote.parse_size(suggested(line)) > 65_536


def one_line(capsys: Any) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


# ---- the Hub's LFS files, served by a CDN with its own ETag -----------------------------------------


@pytest.fixture
def cdn_hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A Hub whose resolve redirects every file to a CDN on another origin, whose ETag is not the Hub's (as
    huggingface.co's X-Linked-Etag, the file's sha256, never is the CDN's), and which answers 412 to an If-Match
    naming another (as S3 and CloudFront do)."""
    pytest.importorskip("huggingface_hub")
    root = tmp_path / "hub"
    root.mkdir()
    with RangeServer(str(root)) as cdn, RangeServer(str(root), cdn=cdn.url) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
        monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
        yield server, cdn


def test_an_lfs_file_behind_a_cdn_with_its_own_etag_opens_and_checks_as_the_local_one(cdn_hub: Any) -> None:
    hub, cdn = cdn_hub
    folder = root_of(hub) / "org" / "model"
    folder.mkdir(parents=True)
    nan_training_file(folder / "train.pth")
    write_safetensors(dict(tiny_state_dict()), folder / "model.safetensors")
    for name in ("train.pth", "model.safetensors"):
        local = outcome(str(folder / name), str(folder))
        assert outcome(f"hf://org/model/{name}", "hf://org/model") == local, name
    # the bytes came from the CDN (the values too); the Hub was asked for each file's metadata alone
    assert cdn.served.bytes_sent > 2 << 20
    assert {path for _, path, _ in cdn.served.requests} == {"/org/model/train.pth", "/org/model/model.safetensors"}
    assert {method for method, path, _ in hub.served.requests if "/resolve/" in path} == {"HEAD"}


def test_an_lfs_file_that_changes_on_the_cdn_between_ranges_is_refused(cdn_hub: Any) -> None:
    hub, _ = cdn_hub
    folder = root_of(hub) / "org" / "model"
    folder.mkdir(parents=True)
    state = OrderedDict((f"w{i}", torch.randn(300_000)) for i in range(3))
    torch.save(state, folder / "m.pth")
    checkpoint = open_checkpoint("hf://org/model/m.pth")
    before = os.stat(folder / "m.pth")
    torch.save(OrderedDict((k, v + 1) for k, v in state.items()), folder / "m.pth")
    os.utime(folder / "m.pth", ns=(before.st_atime_ns, before.st_mtime_ns + 10**9))
    with pytest.raises(ReadError, match="changed while being read"):
        tensor_stats(checkpoint.root["w2"], "little")


def test_reopening_an_lfs_file_behind_a_cdn_costs_one_request_to_the_hub(cdn_hub: Any) -> None:
    hub, cdn = cdn_hub
    folder = root_of(hub) / "org" / "model"
    folder.mkdir(parents=True)
    torch.save(dict(tiny_state_dict()), folder / "pytorch_model.bin")
    assert list(open_checkpoint("hf://org/model/pytorch_model.bin").root) == list(tiny_state_dict())
    hub.served.reset()
    cdn.served.reset()
    forget()
    assert list(open_checkpoint("hf://org/model/pytorch_model.bin").root) == list(tiny_state_dict())
    assert [method for method, _, _ in hub.served.requests] == ["HEAD"] and cdn.served.requests == []


def test_values_read_from_a_remote_file_are_not_all_kept_in_memory(
    served: RangeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(remote, "MAX_AHEAD", 256 << 10)
    monkeypatch.setattr(remote, "WINDOW", 512 << 10)
    state = OrderedDict((f"w{i}", torch.randn(32_768)) for i in range(64))  # 8 MB of 128 kB values
    path = root_of(served) / "many.pth"
    torch.save(state, path)
    url = f"{served.url}/many.pth"
    checkpoint = open_checkpoint(url)
    source = byte_source.source_of(url)
    opened = {start for start, _ in source.extents()}  # type: ignore[attr-defined]
    local = open_checkpoint(str(path))
    for key in state:
        assert tensor_stats(checkpoint.root[key], "little") == tensor_stats(local.root[key], "little")
    later = sum(len(data) for start, data in source.extents() if start not in opened)  # type: ignore[attr-defined]
    assert later <= (512 + 256) << 10  # the window, not the file's 8 MB
    # what the open fetched stays (the header cache keeps it), and no value was fetched twice
    assert opened <= {start for start, _ in source.extents()}  # type: ignore[attr-defined]
    assert served.served.bytes_sent <= path.stat().st_size


def test_diff_of_two_remote_files_each_within_the_cap_but_not_together_compares_no_value(
    served: RangeServer, capsys: Any
) -> None:
    from ckpt_tui.cli import main

    state = OrderedDict((f"w{i}", torch.randn(65_536)) for i in range(4))  # 1 MB each file
    torch.save(state, root_of(served) / "a.pth")
    torch.save(state, root_of(served) / "b.pth", _use_new_zipfile_serialization=False)
    a, b = f"{served.url}/a.pth", f"{served.url}/b.pth"
    assert main(["diff", "--json", "--max-download", "1.6M", a, b]) == 1
    found = json.loads(capsys.readouterr().out)
    # refused up front for the two together: no value read, none said to differ
    assert f"{a} and {b}: comparing values needs 2.1 MB" in found["values_not_compared"]
    assert found["unreadable"] == [] and found["value_changes"] == []
    assert served.served.bytes_sent < 400_000
    forget()
    remote.TRANSFER = remote.Transfer()  # (a new run)
    assert main(["diff", "--max-download", "3M", a, b]) == 0, capsys.readouterr().out


def test_a_deepspeed_file_on_a_web_server_opens_alone_and_says_how_to_get_the_save(served: RangeServer) -> None:
    # a web server lists no folder: the rank files beside it cannot be found, so the file named is read as it is
    tag = Path(__file__).parent / "fixtures" / "deepspeed" / "zero2_fp32" / "global_step2"
    far = root_of(served) / "global_step2"
    far.mkdir()
    for file in tag.iterdir():
        (far / file.name).write_bytes(file.read_bytes())
    for name in ("mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_optim_states.pt"):
        checkpoint = open_checkpoint(f"{served.url}/global_step2/{name}")
        assert checkpoint.format == "zip"
        assert any("one file of a DeepSpeed folder on a web server" in note for note in checkpoint.notes)


FOLDER_LAYOUTS = (
    "deepspeed/zero2_fp32",
    "deepspeed/zero3_bf16/global_step2",
    "frameworks/hf_dcp",
    "torch_distributed/fsdp1_sharded",
    "frameworks/trainer_deepspeed/checkpoint-2",
    "frameworks/lightning_fsdp",
    "frameworks/zero1_pipeline",
)
"""Fixture folders of every layout read from a folder's listing (DeepSpeed, torch's HF writer, FSDP1 rank files,
the Trainer's DeepSpeed checkpoint, Lightning's sharded FSDP)."""


def fixture_copy(root: Path, relative: str) -> Path:
    """The fixture folder ``relative`` (returned), copied under ``root`` at the same relative path."""
    local = Path(__file__).parent / "fixtures" / relative
    shutil.copytree(local, root / relative)
    return local


@pytest.mark.parametrize("relative", FOLDER_LAYOUTS)
def test_every_folder_layout_opens_over_https_from_the_server_s_listing_as_the_local_folder(
    tmp_path: Path, relative: str
) -> None:
    (tmp_path / "served").mkdir()
    with RangeServer(str(tmp_path / "served"), listings=True) as server:
        local = fixture_copy(tmp_path / "served", relative)
        expected = outcome(str(local), str(local))
        assert not isinstance(expected, tuple), expected  # (opened, not refused)
        folder = f"{server.url}/{relative}"
        first = sorted(p for p in local.rglob("*") if p.is_file())[0].relative_to(local).as_posix()
        for url in (folder, f"{folder}/"):
            forget()
            assert outcome(url, folder) == expected, url
        # a file of the folder opens the whole folder, as a local one does
        forget()
        assert outcome(f"{folder}/{first}", folder) == outcome(str(local / first), str(local)), first


def test_a_listing_page_names_the_entries_directly_inside_its_folder_and_nothing_else() -> None:
    from ckpt_tui.core.model.remote_stores import listed_entries

    folder = "http://h/run/ckpt/"
    apache = (
        '<a href="?C=N;O=D">Name</a><a href="/run/">Parent Directory</a><a href="latest">latest</a>'
        "<a href='global_step2/'>global_step2/</a><a href=\"a%20b.pt\">a b.pt</a><a HREF=x&amp;y.pt>x</a>"
    )
    assert listed_entries(apache, folder) == {"latest": False, "global_step2": True, "a b.pt": False, "x&y.pt": False}
    # absolute links into the folder count (some servers write them); out of it, to other hosts, or names that
    # could be no file's do not
    hostile = (
        '<a href="/run/ckpt/rank0.pt">r</a><a href="../">up</a><a href="http://other/run/ckpt/x.pt">x</a>'
        '<a href="a%2Fb.pt">s</a><a href="..%2Fup.pt">u</a><a href="sub/deeper.pt">d</a><a href="#top">t</a>'
    )
    assert listed_entries(hostile, folder) == {"rank0.pt": False}
    assert listed_entries("<html><p>a site's page</p><a href='/'>home</a></html>", folder) is None
    # a site's page that links to files is no listing (its links need not name every file): the loaders' names
    # are asked for, as on a server that lists nothing
    assert listed_entries("<html><title>Run 7</title><a href='model.safetensors'>weights</a></html>", folder) is None
    python = "<title>Directory listing for /run/ckpt/</title><h1>Directory listing for /run/ckpt/</h1><a href=latest>"
    assert listed_entries(python, folder) == {"latest": False}


@pytest.mark.parametrize("relative", FOLDER_LAYOUTS)
def test_every_folder_layout_opens_from_s3_by_its_folder_s_url(s3: Any, relative: str) -> None:
    local = Path(__file__).parent / "fixtures" / relative
    put_folder(s3, local, relative)
    folder = f"s3://ckpts/{relative}"
    assert outcome(folder, folder) == outcome(str(local), str(local))


@pytest.mark.parametrize("relative", FOLDER_LAYOUTS)
def test_every_folder_layout_opens_from_the_hub_by_its_folder_s_url(hub: RangeServer, relative: str) -> None:
    local = fixture_copy(root_of(hub) / "fixtures" / "all", relative)
    folder = f"hf://fixtures/all/{relative}"
    assert outcome(folder, folder) == outcome(str(local), str(local))


def test_an_expired_signed_link_to_the_cdn_is_asked_of_the_hub_anew(cdn_hub: Any, capsys: Any) -> None:
    from ckpt_tui.cli import main

    hub, cdn = cdn_hub
    folder = root_of(hub) / "org" / "model"
    folder.mkdir(parents=True)
    nan_training_file(folder / "train.pth")
    cdn.signed_uses = 10**6
    checkpoint = open_checkpoint("hf://org/model/train.pth")
    # the link the Hub signed for the open expires now (as an hour's signature does): the next read is refused
    cdn.signed_uses = max(cdn.signatures.values())
    local = open_checkpoint(str(folder / "train.pth"))
    far, near = checkpoint.root["model"]["layer5.weight"], local.root["model"]["layer5.weight"]
    assert tensor_stats(far, "little") == tensor_stats(near, "little")
    assert [method for method, path, _ in hub.served.requests if "/resolve/" in path] == ["HEAD", "HEAD"]
    forget()
    cdn.signed_uses = 0  # the CDN refuses every link: one line naming no token (a token does not sign links)
    assert main(["check", "hf://org/model/train.pth"]) == 2
    # (the server thread may log a connection dropped after a refusal to stderr too)
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("ckpt-tui:")]
    assert len(lines) == 1 and "no access (HTTP 403)" in lines[0] and "HF_TOKEN" not in lines[0], lines


def test_average_of_urls_takes_max_download_and_is_refused_up_front_past_it(
    served: RangeServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from ckpt_tui.cli import main

    for name in ("a.pth", "b.pth"):
        torch.save({"w": torch.randn(100_000)}, root_of(served) / name)  # 400 kB each
    urls = [f"{served.url}/a.pth", f"{served.url}/b.pth"]
    out = tmp_path / "avg.pth"
    served.served.reset()
    assert main(["average", *urls, "-o", str(out), "--max-download", "500k"]) == 2
    error = [line for line in capsys.readouterr().err.splitlines() if line.startswith("ckpt-tui:")]
    assert len(error) == 1 and "average (it reads every tensor) needs 800.0 kB" in error[0], error
    assert "raise it (--max-download" in error[0] and not out.exists()
    assert served.served.bytes_sent < 300_000  # (the opening reads of each file only: not their 800 kB of values)
    forget()
    remote.TRANSFER.limit = remote.DEFAULT_MAX_DOWNLOAD
    assert main(["average", *urls, "-o", str(out), "--max-download", "2M"]) == 0
    expected = (torch.load(root_of(served) / "a.pth")["w"] + torch.load(root_of(served) / "b.pth")["w"]) / 2
    assert torch.allclose(torch.load(out, weights_only=True)["w"], expected)


@pytest.mark.parametrize("command", ["convert", "average"])
@pytest.mark.parametrize("url", ["s3://bkt/out.pth", "https://host/out.pth", "hf://org/repo/out.pth"])
def test_an_output_url_is_refused_as_not_a_local_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str, url: str
) -> None:
    from ckpt_tui.cli import main

    torch.save(tiny_state_dict(), tmp_path / "a.pth")
    inputs = [str(tmp_path / "a.pth")] * (2 if command == "average" else 1)
    with pytest.raises(SystemExit) as exited:
        main([command, *inputs, "-o", url])
    assert exited.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "-o/--output: takes a local path" in err and "read-only" in err, err
    assert not any(p.name.endswith(":") for p in tmp_path.iterdir())


def test_a_remote_plain_pickle_past_the_budget_is_refused_before_its_body_with_the_value_that_reads_it(
    served: RangeServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """Unpickling reads a plain pickle to its end: its size, known from the first answer, is the need (was: fetched
    up to the cap, then refused for "a bit more", run after run)."""
    import pickle
    import re

    from ckpt_tui.cli import main

    (root_of(served) / "rng_state.pth").write_bytes(pickle.dumps({"rng": os.urandom(2_000_000)}, protocol=4))
    url = f"{served.url}/rng_state.pth"
    served.served.reset()
    assert main(["info", "--max-download", "500k", url]) == 2
    error = [line for line in capsys.readouterr().err.splitlines() if line.startswith("ckpt-tui:")]
    assert len(error) == 1 and "plain pickle (2.0 MB, read whole) needs" in error[0], error
    assert served.served.bytes_sent < 200_000  # (its head and tail: none of the rest)
    raise_to = re.search(r"raise it \(--max-download (\S+)\)", error[0])
    assert raise_to is not None
    forget()
    remote.TRANSFER = remote.Transfer()
    remote.TRANSFER.limit = remote.parse_size(raise_to.group(1))
    assert main(["info", url]) == 0
    assert "rng" in capsys.readouterr().out


def test_convert_of_a_remote_zip_keeping_small_records_fetches_those_records_not_a_window_each(
    served: RangeServer, tmp_path: Path
) -> None:
    from ckpt_tui.cli import main

    state = {}
    for i in range(8):
        state[f"layer{i}.weight"] = torch.randn(512, 1024)  # 2 MB each, dropped
        state[f"layer{i}.bias"] = torch.randn(512)  # 2 kB each, kept
    torch.save(state, root_of(served) / "train.pth")
    out = tmp_path / "biases.pth"
    served.served.reset()
    assert main(["convert", f"{served.url}/train.pth", "-o", str(out), "--drop-keys", "*.weight"]) == 0
    written = torch.load(out, weights_only=True)
    assert sorted(written) == sorted(k for k in state if k.endswith(".bias"))
    assert all(torch.equal(written[k], state[k]) for k in written)
    # the opening reads (two 64 kB ends and the pickle), then each kept record: never 1 MB of a weight per bias
    assert served.served.bytes_sent < 200_000, served.served.requests


@pytest.fixture
def cdn_without_ranges(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A Hub whose resolve redirects to a signed link on a CDN that ignores ranges (200 and the whole file), as a
    mirror or proxy reached through HF_ENDPOINT may."""
    pytest.importorskip("huggingface_hub")
    root = tmp_path / "hub"
    root.mkdir()
    with RangeServer(str(root), ranges=False) as cdn, RangeServer(str(root), cdn=cdn.url) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
        monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
        yield server, cdn


def test_an_hf_file_whose_host_sends_it_whole_is_kept_within_the_budget_as_over_https(cdn_without_ranges: Any) -> None:
    hub, cdn = cdn_without_ranges
    folder = root_of(hub) / "org" / "model"
    folder.mkdir(parents=True)
    write_safetensors(dict(tiny_state_dict()), folder / "model.safetensors")
    torch.save(dict(tiny_state_dict()), folder / "train.pth")
    for name in ("model.safetensors", "train.pth"):
        local = outcome(str(folder / name), str(folder))
        assert outcome(f"hf://org/model/{name}", "hf://org/model") == local, name
        # one answer of the whole file: every read served from it
        assert [path for _, path, _ in cdn.served.requests].count(f"/org/model/{name}") == 1, cdn.served.requests
        forget()


def test_an_hf_file_sent_whole_past_the_budget_names_hf_download_never_the_signed_link(
    cdn_without_ranges: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    import re

    from ckpt_tui.cli import main

    hub, cdn = cdn_without_ranges
    folder = root_of(hub) / "org" / "model"
    folder.mkdir(parents=True)
    torch.save({"w": torch.randn(100_000)}, folder / "train.pth")  # 400 kB
    assert main(["info", "--max-download", "100k", "hf://org/model/train.pth"]) == 2
    # (the server thread may log the answer cut short to stderr too)
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("ckpt-tui:")]
    assert len(lines) == 1, lines
    line = lines[0]
    assert "does not support ranged reads" in line and "past --max-download 100.0 kB" in line, line
    assert re.search(r"\(hf download org/model train\.pth --revision [0-9a-f]{40} --local-dir \.\)", line), line
    assert "signature" not in line and cdn.url not in line

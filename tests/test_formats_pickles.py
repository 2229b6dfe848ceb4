"""Every pickle a loader would unpickle is scanned: the legacy format's head pickles, every pickle of a
TorchScript archive. Official TorchScript models are data (check passes) and their weights extract."""

from __future__ import annotations

import os
import pickle
import re
import struct
import warnings
import zipfile
from pathlib import Path

import pytest
import torch
from builders import Payload, touch_command
from builders_readers import LEGACY_MAGIC, legacy_bytes, legacy_view, pickle_with_pids
from torch import nn

from ckpt_tui.cli import main
from ckpt_tui.core.model.tree import Opaque, iter_tensors
from ckpt_tui.core.operations.check import check_checkpoint
from ckpt_tui.core.operations.info import summarize
from ckpt_tui.core.pickles import unpickle
from ckpt_tui.core.readers.open import open_checkpoint

SYS_INFO = {"protocol_version": 1001, "little_endian": True, "type_sizes": {"short": 2, "int": 4, "long": 4}}


@pytest.fixture(autouse=True)
def exact_names_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Judge with no prefix rule in the allowlist (what unpickle.py is moving to): names are known exactly."""
    monkeypatch.setattr(unpickle, "_SAFE_OPAQUE_PREFIXES", (), raising=False)


def payload_then(value: object, canary: Path) -> bytes:
    """A pickle that runs ``touch canary`` (if unpickled for real), drops the result, then gives ``value``."""
    evil = pickle.dumps(Payload(os.system, touch_command(canary)), protocol=2)[2:-1]  # without PROTO and STOP
    return b"\x80\x02" + evil + b"0" + pickle.dumps(value, protocol=2)[2:]


def unsafe_names(path: Path) -> set[str]:
    findings = summarize(open_checkpoint(path)).findings
    return {f.global_name for f in findings if f.kind == "unsafe-global" and f.global_name}


@pytest.mark.parametrize("where", ["magic", "protocol", "sys_info", "keys"])
def test_payload_in_any_legacy_pickle_is_found_and_never_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], where: str
) -> None:
    canary = tmp_path / "CANARY"
    heads = [LEGACY_MAGIC, 1001, SYS_INFO]
    parts = [
        payload_then(v, canary) if where == name else pickle.dumps(v, 2)
        for v, name in zip(heads, ["magic", "protocol", "sys_info"], strict=True)
    ]
    obj = pickle_with_pids({"w": legacy_view("0", 4, 0, (4,), (1,))})
    storages = [(4, struct.pack("<4f", 1, 2, 3, 4))]
    raw = legacy_bytes(obj, ["0"], storages, head=b"".join(parts))
    if where == "keys":
        raw = raw.replace(pickle.dumps(["0"], 2), payload_then(["0"], canary))
    path = tmp_path / "evil.pth"
    path.write_bytes(raw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.load(path, weights_only=False)
    assert canary.exists(), "the payload must really run under torch.load"
    canary.unlink()
    checkpoint = open_checkpoint(path)
    assert checkpoint.format == "legacy" and checkpoint.root["w"].shape == (4,)
    assert unsafe_names(path) == {"posix.system"}
    assert main(["check", str(path)]) == 1
    assert "posix.system" in capsys.readouterr().out
    assert not canary.exists()


def test_plain_pickle_says_torch_load_refuses_it(tmp_path: Path) -> None:
    path = tmp_path / "p.pkl"
    path.write_bytes(pickle.dumps({"a": 1}, 2))
    assert any("plain pickle" in note for note in open_checkpoint(path).notes)


class Legacy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(3, 2)


def test_legacy_whole_module_is_read_with_its_class_reported(tmp_path: Path) -> None:
    path = tmp_path / "module.pth"
    torch.save(Legacy(), path, _use_new_zipfile_serialization=False)
    checkpoint = open_checkpoint(path)
    assert isinstance(checkpoint.root, Opaque) and checkpoint.root.is_module
    assert unsafe_names(path) >= {f"{__name__}.Legacy"}


def test_legacy_reads_as_fast_as_zip_in_lookups(tmp_path: Path) -> None:
    # storage lookups are by dict: a missing-record scan over many storages is linear (no timing asserted)
    state = {f"p{i}": torch.full((2,), float(i)) for i in range(3000)}
    torch.save(state, tmp_path / "many.pth", _use_new_zipfile_serialization=False)
    checkpoint = open_checkpoint(tmp_path / "many.pth")
    assert checkpoint.loader_problems == []
    assert check_checkpoint(checkpoint).ok


# ---- TorchScript ------------------------------------------------------------------------------


class Sub(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 2)
        self.register_buffer("scale", torch.ones(2))
        self.k = 3

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * self.scale * self.k + torch.tensor([1.0, 2.0])


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.sub = Sub()
        self.bn = nn.BatchNorm1d(2)
        self.seq = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
        self.layers = nn.ModuleList([nn.Linear(2, 2) for _ in range(2)])
        self.shape = [1, 2, 3]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.seq(self.bn(self.sub(x)))
        for layer in self.layers:
            x = layer(x)
        return x


def script_models() -> dict[str, torch.jit.ScriptModule]:
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return {
            "scripted": torch.jit.script(Net()),
            "traced": torch.jit.trace(Net().eval(), torch.randn(4, 3)),
            "lstm": torch.jit.script(nn.LSTM(3, 4)),
            "transformer": torch.jit.script(nn.TransformerEncoderLayer(8, 2, 16)),
            "conv": torch.jit.trace(nn.Sequential(nn.Conv2d(1, 2, 3), nn.ReLU()), torch.randn(1, 1, 5, 5)),
            "frozen": torch.jit.freeze(torch.jit.script(nn.Sequential(nn.Linear(3, 3)).eval())),
            "quantized": torch.jit.script(
                torch.ao.quantization.quantize_dynamic(nn.Sequential(nn.Linear(4, 4)), {nn.Linear}, dtype=torch.qint8)
            ),
        }


@pytest.fixture(scope="module")
def script_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("script")
    files = {}
    for name, module in script_models().items():
        files[name] = folder / f"{name}.pt"
        module.save(str(files[name]))
    return files


@pytest.mark.parametrize("name", ["scripted", "traced", "lstm", "transformer", "conv", "frozen", "quantized"])
def test_official_torchscript_models_pass_check(
    script_files: dict[str, Path], capsys: pytest.CaptureFixture[str], name: str
) -> None:
    assert main(["check", str(script_files[name])]) == 0, capsys.readouterr().out
    checkpoint = open_checkpoint(script_files[name])
    assert checkpoint.format == "torchscript" and checkpoint.unsafe_globals == set()


@pytest.mark.parametrize("name", ["scripted", "traced", "lstm", "transformer", "conv"])
@pytest.mark.parametrize("suffix", [".pth", ".safetensors"])
def test_torchscript_weights_extract_as_its_state_dict(
    script_files: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, suffix: str
) -> None:
    out = tmp_path / f"weights{suffix}"
    assert main(["convert", str(script_files[name]), "--extract", "auto", "-o", str(out)]) == 0, capsys.readouterr()
    expected = torch.jit.load(str(script_files[name])).state_dict()
    if suffix == ".pth":
        got = torch.load(out, weights_only=True)
        assert list(got) == list(expected)
    else:
        from safetensors.torch import load_file

        got = load_file(str(out))
        assert sorted(got) == sorted(expected)
    for key, tensor in expected.items():
        assert torch.equal(got[key], tensor), key


def test_torchscript_storage_ids_are_unique_across_sections(script_files: dict[str, Path]) -> None:
    info = summarize(open_checkpoint(script_files["traced"])).to_json()
    ids = [t["storage"] for t in info["tensors"]]
    assert len(ids) == len(set(ids))
    assert any(i.startswith("constants/") for i in ids) and "0" in ids


def rewrite_member(source: Path, target: Path, member: str, data: bytes) -> Path:
    with zipfile.ZipFile(source) as src, zipfile.ZipFile(target, "w") as dst:
        for info in src.infolist():
            dst.writestr(info, data if info.filename.endswith(member) else src.read(info))
    return target


@pytest.mark.parametrize("member", ["constants.pkl", ".debug_pkl", "traced_inputs.pkl", "extra.pkl"])
def test_payload_in_any_torchscript_pickle_is_found(script_files: dict[str, Path], tmp_path: Path, member: str) -> None:
    source = script_files["traced"] if member == "traced_inputs.pkl" else script_files["scripted"]
    canary = tmp_path / "CANARY"
    evil = pickle.dumps(Payload(os.system, touch_command(canary)), protocol=2)
    if member == "extra.pkl":
        with zipfile.ZipFile(source) as src, zipfile.ZipFile(tmp_path / "evil.pt", "w") as dst:
            for info in src.infolist():
                dst.writestr(info, src.read(info))
            dst.writestr(f"{src.namelist()[0].split('/')[0]}/extra.pkl", evil)
        path = tmp_path / "evil.pt"
    else:
        path = rewrite_member(source, tmp_path / "evil.pt", member, evil)
    assert "posix.system" in unsafe_names(path)
    assert check_checkpoint(open_checkpoint(path)).ok is False
    assert not canary.exists()


def test_torchscript_class_not_defined_by_its_code_is_unsafe(script_files: dict[str, Path], tmp_path: Path) -> None:
    with zipfile.ZipFile(script_files["scripted"]) as archive:
        data = next(archive.read(n) for n in archive.namelist() if n.endswith("/data.pkl"))
    module = data[data.index(b"c__torch__") + 1 : data.index(b"\nNet\n")]
    forged = data.replace(b"c" + module + b"\nNet\n", b"c__torch__.evil\nNet\n", 1)
    assert forged != data
    path = rewrite_member(script_files["scripted"], tmp_path / "forged.pt", "/data.pkl", forged)
    assert unsafe_names(path) == {"__torch__.evil.Net"}


def test_torchscript_extra_files_are_not_pickles(tmp_path: Path) -> None:
    module = torch.jit.script(nn.Sequential(nn.Linear(2, 2)))
    path = tmp_path / "extra.pt"
    torch.jit.save(module, str(path), _extra_files={"notes.pkl": "not a pickle", "config.json": "{}"})
    checkpoint = open_checkpoint(path)
    assert checkpoint.loader_problems == [] and checkpoint.unsafe_globals == set()
    assert check_checkpoint(checkpoint).ok


def published_style_script(source: Path, target: Path, extra_fields: bytes) -> Path:
    """A TorchScript archive as published ones are: fp16 storages tagged ``cuda:0``, ids with extra fields."""
    with zipfile.ZipFile(source) as archive:
        data = next(archive.read(n) for n in archive.namelist() if n.endswith("/data.pkl"))
    cuda = data.replace(b"X\x03\x00\x00\x00cpu", b"X\x06\x00\x00\x00cuda:0")
    forged = cuda.replace(b"tQ", extra_fields + b"tQ")  # each persistent id: TUPLE then BINPERSID
    assert cuda != data and forged.count(extra_fields + b"tQ") == 2
    return rewrite_member(source, target, "/data.pkl", forged)


@pytest.mark.parametrize("extra", [b"N", b"NK\x01"], ids=["6 fields", "7 fields"])
def test_torchscript_with_longer_storage_ids_on_cuda_passes_check(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: bytes
) -> None:
    module = torch.jit.script(nn.Sequential(nn.Linear(3, 2), nn.ReLU()).half())
    torch.jit.save(module, str(tmp_path / "plain.pt"))
    path = published_style_script(tmp_path / "plain.pt", tmp_path / "published.pt", extra)
    loaded = torch.jit.load(str(path), map_location="cpu").state_dict()  # torch.jit.load reads it
    assert loaded["0.weight"].dtype == torch.float16
    assert main(["check", str(path)]) == 0, capsys.readouterr().out
    checkpoint = open_checkpoint(path)
    assert checkpoint.loader_problems == []
    assert {s.location for s in (t.storage for _, t in iter_tensors(checkpoint.root)) if s is not None} == {"cuda:0"}


def test_torchscript_with_shorter_storage_ids_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    module = torch.jit.script(nn.Sequential(nn.Linear(3, 2)))
    torch.jit.save(module, str(tmp_path / "plain.pt"))
    with zipfile.ZipFile(tmp_path / "plain.pt") as archive:
        data = next(archive.read(n) for n in archive.namelist() if n.endswith("/data.pkl"))
    short = re.sub(rb"K.tQ", b"tQ", data, flags=re.S)  # each id without its element count
    path = rewrite_member(tmp_path / "plain.pt", tmp_path / "short.pt", "/data.pkl", short)
    with pytest.raises(Exception, match="Index = 4"):
        torch.jit.load(str(path))
    assert main(["check", str(path)]) != 0

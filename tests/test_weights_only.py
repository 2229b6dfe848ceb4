"""The weights_only verdict against the real ``torch.load(weights_only=True)``, on every fixture."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from builders_weights_only import ACCEPTED, OTHER, REFUSED, every_fixture

from ckpt_tui.core.errors import CkptError
from ckpt_tui.core.readers.open import open_checkpoint
from ckpt_tui.core.weights_only.verdict import Verdict, scan_file, verdict, verdict_from_scan

HERE = Path(__file__).parent
ORACLE = HERE / "weights_only_oracle.py"


@dataclass
class Case:
    """One fixture: its file, our verdict, and what torch did."""

    path: Path
    verdict: Verdict
    torch_loads: bool | None = None
    torch_error: str = ""
    line_loads: bool | None = None
    line_error: str = ""


def run_oracle(jobs: list[dict[str, Any]]) -> dict[str, Any]:
    """Run the real torch.load on each job in one fresh process."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, str(ORACLE)],
        input=json.dumps(jobs),
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=True,
    )
    return json.loads(done.stdout)


def _verdict_of(path: Path) -> Verdict:
    try:
        return verdict(open_checkpoint(path))
    except CkptError:  # files ckpt-tui cannot open still get a verdict from the scan alone
        return verdict_from_scan(scan_file(str(path)), None)


def _shards(path: Path) -> list[Path]:
    if path.is_dir():
        path = next(path.glob("*.index.json"))
    index = json.loads(path.read_text())
    return [path.parent / name for name in dict.fromkeys(index["weight_map"].values())]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Case]:
    """Every fixture built, judged by us, and loaded by torch in a fresh process."""
    cases: dict[str, Case] = {}
    for index, (name, build) in enumerate(every_fixture().items()):
        folder = tmp_path_factory.mktemp(f"f{index}")
        path = build(folder)
        cases[name] = Case(path, _verdict_of(path))
    jobs: list[dict[str, Any]] = []
    owners: list[tuple[str, str]] = []
    for name, case in cases.items():
        targets = _shards(case.path) if case.verdict.route == "sharded" else [case.path]
        for target in targets:
            jobs.append({"path": str(target)})
            owners.append((name, "plain"))
        if case.verdict.safe_globals and _importable(case.verdict.imports):
            jobs.append({"path": str(case.path), "imports": case.verdict.imports, "line": case.verdict.safe_globals})
            owners.append((name, "line"))
    oracle = run_oracle(jobs)
    for (name, kind), result in zip(owners, oracle["results"], strict=True):
        case = cases[name]
        if kind == "plain":
            case.torch_loads = result["loads"] if case.torch_loads is None else case.torch_loads and result["loads"]
            case.torch_error = case.torch_error or result["error"]
        else:
            case.line_loads, case.line_error = result["loads"], result["error"]
    cases["__oracle__"] = Case(Path(), Verdict(None, "", ""), torch_error=json.dumps(oracle))
    return cases


def _importable(modules: list[str]) -> bool:
    return all(not m.startswith("ghost_") for m in modules)


def _applies(case: Case) -> bool:
    return case.verdict.loads is not None


@pytest.mark.parametrize("name", list(every_fixture()))
def test_verdict_agrees_with_torch_load(corpus: dict[str, Case], name: str) -> None:
    case = corpus[name]
    if not _applies(case):
        pytest.skip(f"torch.load's weights-only unpickler does not apply ({case.verdict.reason})")
    if case.verdict.answer == "cannot_tell":
        # doubt is allowed only where ckpt-tui's reader flags the file (torch.save never writes what it flags)
        assert "reader flags it" in (case.verdict.unknown or ""), case.verdict.to_json()
        return
    assert case.verdict.loads == case.torch_loads, f"ours: {case.verdict.to_json()}\ntorch: {case.torch_error}"


@pytest.mark.parametrize("name", list(REFUSED))
def test_refused_content_is_refused(corpus: dict[str, Case], name: str) -> None:
    case = corpus[name]
    assert case.verdict.loads is False
    assert case.torch_loads is False
    assert case.verdict.blockers or case.verdict.reason


def test_at_least_ten_kinds_of_refused_content_built_by_torch(corpus: dict[str, Case]) -> None:
    refused = [name for name in REFUSED if corpus[name].verdict.loads is False and corpus[name].torch_loads is False]
    assert len(refused) >= 10, refused


@pytest.mark.parametrize("name", list(ACCEPTED))
def test_accepted_content_loads(corpus: dict[str, Case], name: str) -> None:
    case = corpus[name]
    assert case.verdict.loads is True, case.verdict.to_json()
    assert case.verdict.blockers == []
    assert case.torch_loads is True, case.torch_error


DATA_ONLY = [  # OmegaConf ones only when omegaconf is installed (a test dependency)
    "numpy array",
    "numpy arrays of many dtypes",
    "numpy scalar",
    "numpy dtype",
    "argparse.Namespace",
    "SimpleNamespace",
    "pathlib",
    "datetime",
    "frozenset",
    "legacy format with numpy",
    "OmegaConf DictConfig",
    "OmegaConf ListConfig",
]


@pytest.mark.parametrize("name", DATA_ONLY)
def test_data_only_blockers_get_an_add_safe_globals_line_that_works(corpus: dict[str, Case], name: str) -> None:
    if name.startswith("OmegaConf"):
        pytest.importorskip("omegaconf")
    case = corpus[name]
    assert all(b.kind == "data" for b in case.verdict.blockers), case.verdict.to_json()
    line = case.verdict.safe_globals
    assert line is not None and line.startswith("torch.serialization.add_safe_globals([")
    if _importable(case.verdict.imports):
        assert case.line_loads is True, f"{line}\n{case.line_error}"


@pytest.mark.parametrize("name", ["enum", "int enum and str enum"])
def test_enum_members_are_code_with_a_note_and_no_allowlisting_line(corpus: dict[str, Case], name: str) -> None:
    case = corpus[name]
    assert case.verdict.blockers and all(b.kind == "code" for b in case.verdict.blockers)
    assert all("may be an enum member" in b.note for b in case.verdict.blockers)
    assert case.verdict.safe_globals is None


def test_numpy_arrays_need_the_dtype_classes_that_no_global_names(corpus: dict[str, Case]) -> None:
    case = corpus["numpy arrays of many dtypes"]
    names = {b.name for b in case.verdict.blockers}
    assert {"numpy.dtypes.Float32DType", "numpy.dtypes.Int64DType", "numpy.dtypes.BoolDType"} <= names
    assert "numpy.dtypes.Float32DType" in (case.verdict.safe_globals or "")


@pytest.mark.parametrize(
    ("name", "code_global"),
    [
        ("custom class", "ghost_config.Config"),
        ("functools.partial", "functools.partial"),
        ("pickled nn.Module", "ghost_models.GhostNet"),
        ("pickled DataParallel", "torch.nn.parallel.data_parallel.DataParallel"),
        ("tensor subclass", "builders_weights_only.Scaled"),
    ],
)
def test_code_blockers_get_no_allowlisting_line(corpus: dict[str, Case], name: str, code_global: str) -> None:
    case = corpus[name]
    kinds = {b.name: b.kind for b in case.verdict.blockers}
    assert kinds[code_global] == "code"
    assert case.verdict.safe_globals is None


def test_blockers_name_their_key_paths_and_counts(corpus: dict[str, Case]) -> None:
    numpy = {b.name: b for b in corpus["numpy arrays of many dtypes"].verdict.blockers}
    reconstruct = next(b for name, b in numpy.items() if name.endswith("._reconstruct"))
    assert reconstruct.count == 10
    assert ("f32",) in reconstruct.paths and ("fortran",) in reconstruct.paths
    assert numpy["numpy.dtypes.Float16DType"].paths == [("f16",)]
    namespace = corpus["argparse.Namespace"].verdict.blockers[0]
    assert (namespace.name, namespace.paths, namespace.count) == ("argparse.Namespace", [("args",)], 1)
    module = {b.name: b for b in corpus["pickled nn.Module"].verdict.blockers}
    assert module["ghost_models.GhostNet"].paths == [()]
    assert module["torch.nn.modules.linear.Linear"].count == 2


def test_reasons_that_no_allowlisting_fixes(corpus: dict[str, Case]) -> None:
    assert "opcode" in (corpus["protocol 4"].verdict.reason or "")
    assert "TorchScript" in (corpus["TorchScript archive"].verdict.reason or "")
    assert "magic number" in (corpus["plain pickle"].verdict.reason or "")
    assert "data/1" in (corpus["missing storage record"].verdict.reason or "")
    assert corpus["defaultdict"].verdict.torch == "2.10-2.14"  # older torch writes SETITEM into anything
    assert corpus["torch file named .safetensors"].verdict.torch == "2.13-2.14"


def test_not_applicable_formats(corpus: dict[str, Case]) -> None:
    assert corpus["safetensors"].verdict.loads is True  # torch 2.13 hands *.safetensors to safetensors
    assert corpus["safetensors"].torch_loads is True and corpus["safetensors"].verdict.torch == "2.13-2.14"
    assert corpus["dcp"].verdict.loads is None
    assert corpus["sharded .bin"].verdict.loads is True  # every shard loads


def test_allowlist_table_is_torchs(corpus: dict[str, Case]) -> None:
    from ckpt_tui.core.weights_only import tables

    oracle = json.loads(corpus["__oracle__"].torch_error)
    assert set(tables.ALLOWED) == set(oracle["allowed"])
    assert set(tables.IMPORTED_ALLOWED) == set(oracle["import_allowed"])


def test_every_fixture_kind_is_covered() -> None:
    assert len(REFUSED) >= 20 and len(ACCEPTED) >= 15 and len(OTHER) >= 20


def test_check_json_contract_and_exit_code(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from ckpt_tui.cli import main

    path = REFUSED["argparse.Namespace"](tmp_path)
    assert main(["check", "--json", str(path)]) == 1
    report = json.loads(capsys.readouterr().out)
    wo = report["weights_only"]
    assert set(wo) >= {"loads", "torch", "blockers"}
    assert wo["loads"] is False and wo["torch"] == "2.6-2.14"
    assert wo["blockers"] == [{"global": "argparse.Namespace", "kind": "data", "paths": [["args"]], "count": 1}]
    assert wo["add_safe_globals"] == "torch.serialization.add_safe_globals([argparse.Namespace])"
    assert any(p["kind"] == "weights-only" for p in report["problems"])


def test_check_text_says_how_to_load_or_sanitize(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from ckpt_tui.cli import main

    path = REFUSED["numpy array"](tmp_path)
    assert main(["check", str(path)]) == 1
    text = capsys.readouterr().out
    assert "weights_only: torch.load REFUSES it (as torch 2.6-2.14 judge it)" in text
    assert 'numpy.ndarray at ckpt["mean"]' in text
    assert "    import numpy, torch\n    torch.serialization.add_safe_globals([" in text
    assert f"ckpt-tui convert {path} --output {tmp_path / 'ckpt.sanitized.pth'} --sanitize" in text


def test_clean_file_says_it_loads(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from ckpt_tui.cli import main

    path = ACCEPTED["plain state_dict with _metadata"](tmp_path)
    assert main(["check", str(path)]) == 0
    assert "weights_only: torch.load loads it (as torch 2.6-2.14 judge it)" in capsys.readouterr().out


def test_a_gpu_tagged_file_loads_only_where_that_device_is(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """torch.load without map_location puts storages on their saved device: on a CPU machine it raises."""
    from builders import save_cuda_tagged

    from ckpt_tui.cli import main

    path = save_cuda_tagged({"w": torch.ones(2)}, tmp_path / "gpu.pth", device="cuda:3")
    assert main(["check", str(path)]) == 0
    out = capsys.readouterr().out
    assert "weights_only: torch.load loads it on a machine with cuda:3 (as torch 2.6-2.14 judge it)" in out
    assert "without that device torch.load needs map_location='cpu'" in out


def test_browser_header_shows_the_verdict(tmp_path: Path) -> None:
    from ckpt_tui.core.operations.info import summarize
    from ckpt_tui.tui.widgets.summary import Judged, summary_text

    checkpoint = open_checkpoint(REFUSED["pickled nn.Module"](tmp_path))
    text = summary_text(summarize(checkpoint), weights_only=Judged(verdict(checkpoint))).plain
    # code, where it is; no key to delete a whole pickled model with
    assert "! weights_only: torch.load REFUSES it: CODE: ghost_models.GhostNet at the root; " in text
    assert "deletes it" not in text


def test_strings_from_the_file_are_escaped_in_the_text(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from builders_weights_only import write_zip_members

    from ckpt_tui.cli import main

    evil = b"\x80\x02cevil\x1b[8m\nName\n)R."
    path = write_zip_members(tmp_path / "e.pth", {"a/data.pkl": evil, "a/version": b"3\n"})
    main(["check", str(path)])
    lines = capsys.readouterr().out.splitlines()
    ours = [line for line in lines if "weights-only]" in line or "weights_only:" in line or line.startswith("  code")]
    assert len(ours) == 3
    assert all("\x1b" not in line and "\\x1b[8m" in line for line in ours), ours


def test_safetensors_content_under_another_name_is_refused_as_torch_refuses_it(tmp_path: Path) -> None:
    """torch.load routes by name: safetensors bytes in a .pth are unpickled, and fail."""
    from safetensors.torch import save_file

    path = tmp_path / "weights.pth"
    save_file({"a": torch.ones(2)}, str(path))
    judged = verdict(open_checkpoint(path))
    with pytest.raises(Exception):  # noqa: B017 - whatever torch raises
        torch.load(path, weights_only=True)
    assert judged.loads is False and "safetensors" in (judged.reason or "")


@pytest.mark.parametrize("dtype", [torch.uint16, torch.uint32, torch.uint64, torch.float8_e4m3fn, torch.float8_e5m2])
def test_legacy_untyped_storages_are_refused_as_torch_fails_on_them(tmp_path: Path, dtype: torch.dtype) -> None:
    """The legacy format saves these as UntypedStorage, which torch.load cannot read back (either mode)."""
    path = tmp_path / "legacy.pth"
    torch.save({"a": torch.zeros(3, dtype=dtype)}, path, _use_new_zipfile_serialization=False)
    for weights_only in (True, False):
        with pytest.raises(AttributeError):
            torch.load(path, weights_only=weights_only)
    judged = verdict(open_checkpoint(path))
    assert judged.loads is False and "UntypedStorage" in (judged.reason or "")


def _patched(source: Path, target: Path, member: str, central: list[tuple[int, str, int]], local_sig: bool) -> Path:
    """A copy of a torch zip with fields of one member's central entry set, and its local signature broken."""
    import struct
    import zipfile

    data = bytearray(source.read_bytes())
    with zipfile.ZipFile(source) as archive:
        info = next(i for i in archive.infolist() if i.filename.endswith(member))
    eocd = data.rfind(b"PK\x05\x06")
    count, _, at = struct.unpack_from("<HII", data, eocd + 10)
    for _ in range(count):
        name_len, extra_len, comment_len = struct.unpack_from("<HHH", data, at + 28)
        if bytes(data[at + 46 : at + 46 + name_len]) == info.filename.encode():
            for offset, fmt, value in central:
                struct.pack_into(fmt, data, at + offset, value)
            break
        at += 46 + name_len + extra_len + comment_len
    if local_sig:
        data[info.header_offset : info.header_offset + 4] = b"PK\x00\x00"
    target.write_bytes(bytes(data))
    return target


ZIP_READER_CASES = {  # central field offsets: flags 8, method 10, disk 34, external attributes 38
    "a directory record's local header is never read": ([(38, "<I", 0x10)], True, True),
    "an encrypted record": ([(8, "<H", 1)], False, False),
    "patch data": ([(8, "<H", 0x20)], False, False),
    "a member on another disk": ([(34, "<H", 5)], False, False),
    "an empty record with method 12": ([(10, "<H", 12)], False, False),
}


@pytest.mark.parametrize("name", list(ZIP_READER_CASES))
def test_records_torch_zip_reader_reads_or_refuses(tmp_path: Path, name: str) -> None:
    """What miniz refuses (methods, encryption, multidisk) and what it never reads (a directory's header)."""
    central, broken_signature, loads = ZIP_READER_CASES[name]
    torch.save({"w": torch.ones(3), "e": torch.zeros(0)}, tmp_path / "plain.pth")
    member = "data/1" if "empty" in name else "data/0"
    path = _patched(tmp_path / "plain.pth", tmp_path / "patched.pth", member, central, broken_signature)
    try:
        torch.load(path, weights_only=True)
        torch_loads = True
    except RuntimeError:
        torch_loads = False
    assert torch_loads is loads
    reason = scan_file(str(path)).reason
    assert (reason is None) is loads, reason


def test_a_zero_size_shape_whose_count_overflows_first_is_refused(tmp_path: Path) -> None:
    """torch multiplies sizes in 64 bits left to right: (2**32, 2**32, 0) overflows before the 0."""
    import zipfile

    torch.save({"e": torch.zeros(0)}, tmp_path / "plain.pth")
    data = zipfile.ZipFile(tmp_path / "plain.pth").read("plain/data.pkl")
    big = b"\x8a\x05" + (2**32).to_bytes(5, "little")
    changed = data.replace(b"K\x00\x85", big + big + b"K\x00\x87", 1).replace(b"K\x01\x85", b"K\x01K\x01K\x01\x87", 1)
    assert changed != data
    from builders import rewrite_zip

    path = rewrite_zip(tmp_path / "plain.pth", tmp_path / "overflow.pth", data_pkl=changed)
    with pytest.raises(RuntimeError, match="overflow"):
        torch.load(path, weights_only=True)
    assert "integer multiplication overflow" in (scan_file(str(path)).reason or "")


def test_the_numpy_allowlisting_line_names_numpy_as_the_file_does_and_warns_nothing(tmp_path: Path) -> None:
    """numpy 2 writes numpy._core: the line names that, not numpy.core (numpy 2's DeprecationWarning)."""
    import warnings

    import numpy

    path = tmp_path / "arrays.pth"
    torch.save({"w": torch.ones(2), "stats": numpy.array([1.0]), "best": numpy.float64(0.5)}, path)
    judged = verdict(open_checkpoint(str(path)))
    assert judged.safe_globals is not None and "numpy.core." not in judged.safe_globals
    before = torch.serialization.get_safe_globals()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            exec(judged.safe_globals, {"torch": torch, "numpy": numpy})  # our own generated line
        assert list(torch.load(path, weights_only=True)) == ["w", "stats", "best"]
    finally:
        torch.serialization.clear_safe_globals()
        torch.serialization.add_safe_globals(before)

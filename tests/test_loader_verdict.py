"""``check``'s verdict is the real loader's: each hand-built file is judged by ``torch.load`` or the
``safetensors`` library and by ckpt-tui. Where the loader refuses, ckpt-tui refuses to read (exit 2) or
says why (a ``loader-refuses`` finding, exit 1); where it accepts, ckpt-tui reads the file and finds
nothing wrong (exit 0)."""

from __future__ import annotations

import struct
import warnings
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from builders_readers import (
    StorageRef,
    View,
    f32_entry,
    legacy_bytes,
    legacy_view,
    pickle_with_pids,
    safetensors_bytes,
    torch_zip_members,
    write_zip,
)

from ckpt_tui.cli import main
from ckpt_tui.core.errors import ReadError
from ckpt_tui.core.readers.open import open_checkpoint

FOUR = struct.pack("<4f", 0.0, 1.0, 2.0, 3.0)


def torch_accepts(path: Path) -> bool:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            torch.load(path, weights_only=False)
        except Exception:
            return False
    return True


def library_accepts(path: Path) -> bool:
    from safetensors import safe_open

    try:
        with safe_open(str(path), "pt") as file:
            for key in file.keys():  # noqa: SIM118 - safe_open has no __iter__
                file.get_tensor(key)
    except Exception:
        return False
    return True


def assert_same_verdict(path: Path, accepts: bool, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["check", str(path)])
    out = capsys.readouterr()
    if accepts:
        assert code == 0, out.out + out.err
        assert open_checkpoint(path).loader_problems == []
    else:
        assert code in (1, 2), out.out
        if code == 1:
            assert "loader-refuses" in out.out or "unreadable" in out.out or "missing" in out.out, out.out


def zip_file(path: Path, members: dict[str, bytes], deflate: tuple[str, ...] = ()) -> Path:
    return write_zip(path, members, deflate)


def base_pickle(storage: StorageRef | None = None, size: tuple[int, ...] = (4,)) -> bytes:
    return pickle_with_pids({"w": View(storage or StorageRef(), 0, size, (1,))})


def members(**changes: bytes | None) -> dict[str, bytes]:
    built = torch_zip_members(base_pickle(), {"0": FOUR})
    for name, value in changes.items():
        member = "archive/" + name.replace("__", ".").replace("_slash_", "/")
        if value is None:
            built.pop(member, None)
        else:
            built[member] = value
    return built


def renamed(built: dict[str, bytes], old: str, new: str) -> dict[str, bytes]:
    return {name.replace(old, new, 1): value for name, value in built.items()}


ZIP_CASES: dict[str, Callable[[], dict[str, bytes]]] = {
    "torch_layout": lambda: members(),
    "record_longer": lambda: members(**{"data_slash_0": FOUR + b"\0" * 8}),
    "record_shorter": lambda: members(**{"data_slash_0": FOUR[:8]}),
    "data_pkl_at_top_level": lambda: renamed(members(), "archive/", ""),
    "two_archives": lambda: {**members(), **renamed(members(), "archive/", "other/")},
    "two_archives_other_first": lambda: {**renamed(members(), "archive/", "other/"), **members()},
    "member_outside_the_folder": lambda: {**members(), "zzz/evil.pkl": b"junk"},
    "folder_entry_first": lambda: {"archive/": b"", **members()},
    "data_pkl_only_in_a_subfolder": lambda: renamed(members(), "archive/data.pkl", "archive/sub/data.pkl"),
    "no_version": lambda: members(version=None),
    "version_0": lambda: members(version=b"0"),
    "version_1": lambda: members(version=b"1"),
    "version_spaced": lambda: members(version=b" 3\n"),
    "version_with_tail": lambda: members(version=b"3abc"),
    "version_text": lambda: members(version=b"abc"),
    "version_empty": lambda: members(version=b""),
    "version_10": lambda: members(version=b"10"),
    "version_11": lambda: members(version=b"11"),
    "data_version_only": lambda: {**members(version=None), "archive/.data/version": b"3\n"},
    "data_version_wins": lambda: {**members(), "archive/.data/version": b"99\n"},
    "no_byteorder": lambda: members(byteorder=None),
    "byteorder_newline": lambda: members(byteorder=b"little\n"),
    "byteorder_unknown": lambda: members(byteorder=b"middle"),
    "byteorder_big": lambda: members(byteorder=b"big"),
    "pid_with_extra_field": lambda: members(data__pkl=base_pickle(StorageRef(extra=(7,)))),
    "pid_with_two_extra_fields": lambda: members(data__pkl=base_pickle(StorageRef(extra=(7, 8)))),
    "pid_missing_numel": lambda: members(
        data__pkl=base_pickle(StorageRef(fields=("storage", torch.FloatStorage, "0", "cpu")))
    ),
    "int_record_key": lambda: members(data__pkl=base_pickle(StorageRef(key=0))),
    "bytes_location": lambda: members(data__pkl=base_pickle(StorageRef(location=b"cpu"))),
    "meta_location": lambda: members(data__pkl=base_pickle(StorageRef(location="meta"))),
    **{
        f"location_{tag}": (lambda tag=tag: members(data__pkl=base_pickle(StorageRef(location=tag))))
        for tag in ("cpu:0", "CPU", "tpu", "cuda0", "cuda:x", "cuda:01", "cpu ", "")
    },
}


@pytest.mark.parametrize("name", list(ZIP_CASES))
def test_zip_verdict_matches_torch_load(tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str) -> None:
    path = zip_file(tmp_path / f"{name}.pth", ZIP_CASES[name]())
    assert_same_verdict(path, torch_accepts(path), capsys)


@pytest.mark.parametrize("deflate", [("data.pkl",), ("/0",), ("data.pkl", "/0", "version", "byteorder")])
def test_deflated_members_are_read_as_torch_reads_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], deflate: tuple[str, ...]
) -> None:
    path = zip_file(
        tmp_path / "deflated.pth",
        torch_zip_members(base_pickle(StorageRef(numel=256), (256,)), {"0": FOUR * 64}),
        deflate,
    )
    assert torch_accepts(path)
    assert_same_verdict(path, True, capsys)


def test_crc_mismatch_is_a_note_not_a_refusal(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    torch.save({"w": torch.arange(4.0)}, tmp_path / "good.pth")
    raw = bytearray((tmp_path / "good.pth").read_bytes())
    with zipfile.ZipFile(tmp_path / "good.pth") as archive:
        crc = struct.pack("<I", archive.getinfo("good/data.pkl").CRC)
    for at in (raw.find(crc), raw.find(crc, raw.find(crc) + 1)):
        raw[at] ^= 0xFF
    path = tmp_path / "crc.pth"
    path.write_bytes(bytes(raw))
    assert torch_accepts(path)
    assert_same_verdict(path, True, capsys)
    assert any("CRC" in note for note in open_checkpoint(path).notes)


# ---- legacy files ---------------------------------------------------------------------------


def legacy_file(path: Path, **change: object) -> Path:
    keys = change.get("keys", ["0"])
    storages = change.get("storages", [(4, FOUR)])
    view = change.get("view", legacy_view("0", 4, 0, (4,), (1,)))
    obj = pickle_with_pids({"w": view})
    head = change.get("head", b"")
    path.write_bytes(legacy_bytes(obj, keys, storages, head) + change.get("tail", b""))  # type: ignore[arg-type,operator]
    return path


def _legacy_head(protocol: object) -> bytes:
    """A legacy file's magic, protocol (as given) and sys_info pickles."""
    import pickle

    from ckpt_tui.core.weights_only.verdict import MAGIC_NUMBER

    sys_info = {"protocol_version": 1001, "little_endian": True, "type_sizes": {"short": 2, "int": 4, "long": 4}}
    return pickle.dumps(MAGIC_NUMBER, 2) + pickle.dumps(protocol, 2) + pickle.dumps(sys_info, 2)


LEGACY_CASES: dict[str, dict[str, object]] = {
    "torch_layout": {},
    "trailing_bytes": {"tail": b"junk"},
    "count_too_large": {"storages": [(5, FOUR + b"\0" * 4)]},
    "count_too_small": {"storages": [(3, FOUR[:12])]},
    "truncated": {"storages": [(4, FOUR[:10])]},
    "key_listed_but_unused": {"keys": ["0", "9"], "storages": [(4, FOUR), (1, b"\0" * 4)]},
    "key_listed_twice": {"keys": ["0", "0"], "storages": [(4, FOUR), (4, FOUR)]},
    "pid_without_view_field": {"view": View(StorageRef(numel=4), 0, (4,), (1,))},
    "pid_with_extra_field": {"view": View(StorageRef(numel=4, extra=(None, 1)), 0, (4,), (1,))},
    "unknown_location": {"view": View(StorageRef(numel=4, location="tpu", extra=(None,)), 0, (4,), (1,))},
    # legacy_load only compares the protocol with != and iterates the key list: any number equal to 1001, any
    # iterable of the keys in a known order
    "protocol_as_float": {"head": _legacy_head(1001.0)},
    "protocol_as_text": {"head": _legacy_head("1001")},
    "protocol_as_true": {"head": _legacy_head(True)},
    "key_list_a_tuple": {"keys": ("0",)},
    "key_list_a_str": {"keys": "0"},
    "key_list_a_dict": {"keys": {"0": 1}},
    "key_list_a_set": {"keys": {"0"}},
    "key_list_an_int": {"keys": 0},
    # legacy_load's storages are resizable: a tensor needing more grows its storage, whose blob is read at that size
    "storage_grown_by_its_tensor": {"view": legacy_view("0", 4, 0, (5,), (1,)), "storages": [(5, FOUR + FOUR[:4])]},
    "storage_grown_blob_too_short": {"view": legacy_view("0", 4, 0, (5,), (1,))},
    "storage_of_none_grown": {"view": legacy_view("0", 0, 0, (4,), (1,))},
}


@pytest.mark.parametrize("name", list(LEGACY_CASES))
def test_legacy_verdict_matches_torch_load(tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str) -> None:
    path = legacy_file(tmp_path / f"{name}.pth", **LEGACY_CASES[name])
    assert_same_verdict(path, torch_accepts(path), capsys)


@pytest.mark.parametrize("protocol", [1, 2, 4])
def test_legacy_files_of_every_pickle_protocol_are_read(tmp_path: Path, protocol: int) -> None:
    path = tmp_path / f"p{protocol}.pth"
    torch.save({"w": torch.arange(3.0)}, path, _use_new_zipfile_serialization=False, pickle_protocol=protocol)
    assert torch_accepts(path)
    checkpoint = open_checkpoint(path)
    assert checkpoint.format == "legacy"
    assert checkpoint.root["w"].shape == (3,)
    assert checkpoint.loader_problems == []


def test_legacy_protocol_0_is_refused_as_torch_refuses_it(tmp_path: Path) -> None:
    # protocol 0 writes each persistent id as text: torch.load fails on it ("saved_id must be a tuple")
    path = tmp_path / "p0.pth"
    torch.save({"w": torch.arange(3.0)}, path, _use_new_zipfile_serialization=False, pickle_protocol=0)
    assert not torch_accepts(path)
    with pytest.raises(ReadError, match="persistent id"):
        open_checkpoint(path)


# ---- safetensors ----------------------------------------------------------------------------

ONE = '{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}'
EIGHT = b"\0" * 8
SAFETENSORS_CASES: dict[str, bytes] = {
    "library_layout": safetensors_bytes(ONE, EIGHT),
    "leading_whitespace": safetensors_bytes("  \n\t" + ONE, EIGHT),
    "trailing_whitespace": safetensors_bytes(ONE + " \r\n ", EIGHT),
    "trailing_nul": safetensors_bytes(ONE + "\0\0", EIGHT),
    "byte_order_mark": safetensors_bytes("\ufeff" + ONE, EIGHT),
    "same_key_twice_same_entry": safetensors_bytes(
        '{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}',
        EIGHT,
    ),
    "same_key_twice_hole": safetensors_bytes(
        '{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}',
        EIGHT,
    ),
    "metadata_twice": safetensors_bytes('{"__metadata__":{"x":"1"},"__metadata__":{"y":"2"},' + ONE[1:], EIGHT),
    "metadata_key_twice": safetensors_bytes('{"__metadata__":{"x":"1","x":"2"},' + ONE[1:], EIGHT),
    "field_twice_in_an_earlier_entry": safetensors_bytes(
        '{"a":{"dtype":"F32","dtype":"F32","shape":[2],"data_offsets":[0,8]},' + ONE[1:], EIGHT
    ),
    "an_earlier_entry_nests_deep": safetensors_bytes(
        '{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":' + "[" * 130 + "]" * 130 + "}," + ONE[1:], EIGHT
    ),
    "field_twice_in_entry": safetensors_bytes(
        '{"a":{"dtype":"F32","dtype":"F32","shape":[2],"data_offsets":[0,8]}}', EIGHT
    ),
    "overlapping_ranges": safetensors_bytes({"a": f32_entry(0, 2), "b": f32_entry(4, 1)}, EIGHT),
    "hole_before_data": safetensors_bytes({"a": f32_entry(4, 1)}, EIGHT),
    "hole_between": safetensors_bytes({"a": f32_entry(0, 1), "b": f32_entry(8, 1)}, EIGHT + b"\0" * 4),
    "trailing_bytes": safetensors_bytes(ONE, EIGHT + b"\0" * 4),
    "unordered_offsets": safetensors_bytes({"b": f32_entry(4, 1), "a": f32_entry(0, 1)}, EIGHT),
    "metadata_int_value": safetensors_bytes('{"__metadata__":{"x":1},' + ONE[1:], EIGHT),
    "metadata_null": safetensors_bytes('{"__metadata__":null,' + ONE[1:], EIGHT),
    "metadata_list": safetensors_bytes('{"__metadata__":["x"],' + ONE[1:], EIGHT),
    "metadata_nested": safetensors_bytes('{"__metadata__":{"x":{"y":"z"}},' + ONE[1:], EIGHT),
    "extra_field_in_entry": safetensors_bytes('{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"z":[1]}}', EIGHT),
    "deep_extra_field": safetensors_bytes(
        '{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"z":' + "[" * 130 + "]" * 130 + "}}", EIGHT
    ),
    **{
        f"nested_{levels}_levels": safetensors_bytes(
            '{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"z":'
            + "[" * (levels - 2)
            + "]" * (levels - 2)
            + "}}",
            EIGHT,
        )
        for levels in (127, 128)
    },
    "no_tensors": safetensors_bytes("{}"),
    "two_empty_tensors": safetensors_bytes(
        {
            "a": {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]},
            "b": {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]},
        }
    ),
    "fnuz_dtype": safetensors_bytes({"a": {"dtype": "F8_E4M3FNUZ", "shape": [2], "data_offsets": [0, 2]}}, b"\0\0"),
    "escaped_name": safetensors_bytes('{"\\u0061":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}', EIGHT),
    "lone_surrogate_name": safetensors_bytes('{"\\ud800":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}', EIGHT),
    "empty_name": safetensors_bytes('{"":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}', EIGHT),
    "nan_literal": safetensors_bytes('{"__metadata__":{"x":NaN},' + ONE[1:], EIGHT),
    "float_offsets": safetensors_bytes('{"a":{"dtype":"F32","shape":[2],"data_offsets":[0.0,8]}}', EIGHT),
    "three_offsets": safetensors_bytes('{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8,8]}}', EIGHT),
    "unknown_dtype": safetensors_bytes('{"a":{"dtype":"F31","shape":[2],"data_offsets":[0,8]}}', EIGHT),
    "size_mismatch": safetensors_bytes('{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}', EIGHT),
    "huge_shape": safetensors_bytes('{"a":{"dtype":"F32","shape":[18446744073709551616],"data_offsets":[0,8]}}', EIGHT),
    "missing_field": safetensors_bytes('{"a":{"dtype":"F32","shape":[2]}}', EIGHT),
    "not_padded": safetensors_bytes('{"a":{"dtype":"U8","shape":[3],"data_offsets":[0,3]}}', b"abc"),
    # each value given for a name is parsed as an entry: null, a string or {} first is refused
    **{
        f"same_key_twice_{label}_first": safetensors_bytes(f'{{"a":{first},' + ONE[1:], EIGHT)
        for label, first in (("null", "null"), ("string", '"x"'), ("empty", "{}"), ("list", "[1,2]"))
    },
    "same_key_twice_null_first_escaped": safetensors_bytes('{"\\u0061":null,' + ONE[1:], EIGHT),
    "same_key_twice_entry_first": safetensors_bytes(
        '{"a":{"dtype":"F16","shape":[4],"data_offsets":[0,8]},' + ONE[1:], EIGHT
    ),
    # the element count is multiplied left to right in 64 bits: it may overflow before a 0
    "zero_size_overflowing": safetensors_bytes(
        '{"a":{"dtype":"F32","shape":[4294967296,4294967296,0],"data_offsets":[0,0]}}'
    ),
    "zero_size_not_overflowing": safetensors_bytes(
        '{"a":{"dtype":"U8","shape":[4294967296,2147483648,0],"data_offsets":[0,0]}}'
    ),
    "minus_zero_offset": safetensors_bytes('{"a":{"dtype":"F32","shape":[2],"data_offsets":[-0,8]}}', EIGHT),
    "minus_zero_size": safetensors_bytes('{"a":{"dtype":"F32","shape":[-0],"data_offsets":[0,0]}}'),
    "minus_zero_name": safetensors_bytes('{"layer-0":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}', EIGHT),
}


@pytest.mark.parametrize("name", list(SAFETENSORS_CASES))
def test_safetensors_verdict_matches_the_library(tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str) -> None:
    path = tmp_path / f"{name}.safetensors"
    path.write_bytes(SAFETENSORS_CASES[name])
    assert_same_verdict(path, library_accepts(path), capsys)


@pytest.mark.parametrize("name", list(SAFETENSORS_CASES))
def test_the_weights_only_verdict_of_a_safetensors_name_is_the_librarys(tmp_path: Path, name: str) -> None:
    """torch.load hands *.safetensors paths to the library: the weights_only verdict is the library's answer."""
    from ckpt_tui.core.weights_only.verdict import verdict

    path = tmp_path / f"{name}.safetensors"
    path.write_bytes(SAFETENSORS_CASES[name])
    try:
        checkpoint = open_checkpoint(path)
    except ReadError:
        assert not library_accepts(path)
        return
    assert verdict(checkpoint).loads == library_accepts(path)


def test_duplicate_tensor_name_is_noted(tmp_path: Path) -> None:
    path = tmp_path / "dup.safetensors"
    path.write_bytes(SAFETENSORS_CASES["same_key_twice_same_entry"])
    assert any("twice" in note for note in open_checkpoint(path).notes)


def test_refused_safetensors_say_which_rule(tmp_path: Path) -> None:
    path = tmp_path / "overlap.safetensors"
    path.write_bytes(SAFETENSORS_CASES["overlapping_ranges"])
    problems = open_checkpoint(path).loader_problems
    assert problems and "overlaps" in problems[0]
    path.write_bytes(SAFETENSORS_CASES["trailing_bytes"])
    assert "follow the last tensor" in open_checkpoint(path).loader_problems[0]
    path.write_bytes(SAFETENSORS_CASES["lone_surrogate_name"])
    with pytest.raises(ReadError, match="surrogate"):
        open_checkpoint(path)


def test_int_record_key_names_the_record_as_torch_does(tmp_path: Path) -> None:
    path = zip_file(tmp_path / "int.pth", members(data__pkl=base_pickle(StorageRef(key=0))))
    tensor = open_checkpoint(path).root["w"]
    assert tensor.storage is not None and tensor.storage.key == "0"


def test_a_legacy_view_listed_with_the_storages_is_never_shown_or_written_with_other_values(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """torch's legacy_load reads a listed view's own blob into its root's bytes: the root's tensors then hold
    values from two blobs, which are not read here. They are unreadable (stats exit 1, convert writes nothing)
    and the verdict is 'cannot tell', never a "verified" copy of other values (adv12a F1)."""
    view = View(StorageRef(key="0", numel=4, extra=(("v", 2, 2),)), 0, (2,), (1,))
    obj = pickle_with_pids({"a": view, "r": legacy_view("0", 4, 0, (4,), (1,))})
    path = tmp_path / "listed.pth"
    path.write_bytes(legacy_bytes(obj, ["0", "v"], [(4, FOUR), (2, struct.pack("<2f", 10.0, 20.0))]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loaded = torch.load(path, weights_only=True)
    assert loaded["r"].tolist() == [0.0, 1.0, 10.0, 20.0]
    assert main(["stats", str(path)]) == 1
    assert "written in part by the legacy view 'v'" in capsys.readouterr().out
    assert main(["convert", str(path), "-o", str(tmp_path / "out.pth")]) == 2
    assert not (tmp_path / "out.pth").exists()
    capsys.readouterr()
    assert main(["check", "--json", str(path)]) == 1
    assert '"answer":"cannot_tell"' in capsys.readouterr().out.replace(" ", "")


@pytest.mark.parametrize("legacy", [False, True])
def test_an_empty_storage_reused_under_other_types_gives_each_tensor_its_own_dtype(
    tmp_path: Path, legacy: bool
) -> None:
    """torch keeps no storage of no bytes for its key's later uses (the zip loader caches only storages with data,
    the legacy one makes a new storage of the use's type): three empty tensors on one key load as float32, int64
    and bool, and are shown so (were all float32, and convert rewrote them) (adv12a F8)."""
    kinds = {"a": torch.FloatStorage, "b": torch.LongStorage, "c": torch.BoolStorage}
    extra = (None,) if legacy else ()
    obj = {
        name: View(StorageRef(numel=0, storage_type=kind, extra=extra), 0, (0,), (1,)) for name, kind in kinds.items()
    }
    path = tmp_path / "empty.pth"
    if legacy:
        path.write_bytes(legacy_bytes(pickle_with_pids(obj), ["0"], [(0, b"")]))
    else:
        write_zip(path, torch_zip_members(pickle_with_pids(obj), {"0": b""}))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loaded = torch.load(path, weights_only=True)
    expected = {name: str(tensor.dtype).removeprefix("torch.") for name, tensor in loaded.items()}
    assert expected == {"a": "float32", "b": "int64", "c": "bool"}
    root = open_checkpoint(path).root
    assert {name: root[name].dtype for name in kinds} == expected

"""Members written past 4 GiB get zip64 offsets in their local headers and central records, as zipfile reads them."""

from __future__ import annotations

import zipfile
import zlib
from pathlib import Path

from ckpt_tui.core.writers.output import Output
from ckpt_tui.core.writers.zip_writer import ZipWriter

FAR = 5 << 30


def test_members_past_4_gib_are_found_by_zipfile(tmp_path: Path) -> None:
    path = tmp_path / "far.zip"
    records = [(bytes([i]) * (64 + i), zlib.crc32(bytes([i]) * (64 + i))) for i in range(5)]
    with open(path, "wb") as file:
        file.seek(FAR)  # a sparse file: nothing is written before the archive
        with Output(file) as out:
            writer = ZipWriter(out)
            writer.add_bytes("far/data.pkl", b"pickle")
            writer.add_numbered("far/data/", 0, records)
            writer.close()
    with zipfile.ZipFile(path) as archive:
        infos = archive.infolist()
        assert [info.filename for info in infos] == ["far/data.pkl"] + [f"far/data/{i}" for i in range(5)]
        assert all(info.header_offset >= FAR for info in infos)
        assert archive.read("far/data.pkl") == b"pickle"
        assert [archive.read(f"far/data/{i}") for i in range(5)] == [data for data, _ in records]
    assert all(entry.data_offset % 64 == 0 for entry in writer.entries[1:])

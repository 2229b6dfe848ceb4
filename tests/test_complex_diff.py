"""``diff`` and ``diff --stats`` compare complex tensors as complex values, both parts, as torch loads them.

They compared magnitudes: ``b = -a`` or a conjugated copy was "max |a-b| 0, within allclose", "relative change 0,
cosine 1". The oracle is torch on the loaded tensors (widened to complex128): ``(a-b).abs().max()``,
``torch.isclose(a, b, equal_nan=True).all()`` (diff leaves out positions NaN on both sides, as for floats),
``‖a−b‖/‖a‖`` and the cosine ``Re(torch.vdot(a, b)) / (‖a‖‖b‖)`` over the positions finite on both sides.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch

from ckpt_tui.cli import main

COMPLEX = [torch.complex64, torch.complex128]


def _random(generator: torch.Generator, size: int, dtype: torch.dtype) -> torch.Tensor:
    parts = torch.randn(2, size, generator=generator, dtype=torch.float64)
    return torch.complex(parts[0], parts[1]).to(dtype)


def _pairs(dtype: torch.dtype, seed: int) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Keys of file A and file B: unrelated, close, negated, conjugated, phase-turned, scaled, with NaN parts."""
    generator = torch.Generator().manual_seed(seed)
    a = _random(generator, 64, dtype)
    noise = _random(generator, 64, torch.complex128) * 1e-7
    nan = torch.tensor([complex(float("nan"), 1.0), complex(2.0, 3.0), complex(4.0, -1.0)], dtype=dtype)
    nan_im = torch.tensor([complex(1.0, float("nan")), complex(2.0, 3.0), complex(4.0, 5.0)], dtype=dtype)
    return {
        "unrelated": (a, _random(generator, 64, dtype)),
        "close": (a, (a.to(torch.complex128) + noise).to(dtype)),
        "negated": (a, -a),
        "conjugated": (a, a.conj().resolve_conj()),
        "turned": (a, a * 1j),
        "scaled": (a, a * 3),
        "nan in a real part, b's in an imaginary part": (nan, nan_im),
        "nan on one side only": (nan, nan_im.nan_to_num()),
        "nan parts at the same element, the rest equal": (nan, torch.cat([nan_im[:1], nan[1:]])),
    }


def _save_pair(tmp_path: Path, pairs: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> tuple[str, str]:
    path_a, path_b = tmp_path / "a.pth", tmp_path / "b.pth"
    torch.save({key: a for key, (a, _) in pairs.items()}, path_a)
    torch.save({key: b for key, (_, b) in pairs.items()}, path_b)
    return str(path_a), str(path_b)


def _loaded(path: str) -> dict[str, torch.Tensor]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (complex32: "ComplexHalf support is experimental")
        loaded = torch.load(path, weights_only=True)
    return {key: value.resolve_neg().resolve_conj().to(torch.complex128) for key, value in loaded.items()}


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, object]:
    main([*args, "--json"])
    document: dict[str, object] = json.loads(capsys.readouterr().out)
    return document


def _check_diff(capsys: pytest.CaptureFixture[str], path_a: str, path_b: str) -> int:
    """diff --json against torch on every key; how many keys differ."""
    changes = {row["key"]: row for row in _run(capsys, "diff", path_a, path_b)["value_changes"]}  # type: ignore[attr-defined]
    loaded_a, loaded_b = _loaded(path_a), _loaded(path_b)
    for key, a in loaded_a.items():
        b = loaded_b[key]
        if torch.equal(torch.view_as_real(a).view(torch.int64), torch.view_as_real(b).view(torch.int64)):
            assert key not in changes, key
            continue
        both = ~(a.isnan() | b.isnan())
        row = changes[key]
        assert row["max_abs_diff"] == pytest.approx(float((a[both] - b[both]).abs().max()), rel=1e-12), key
        assert row["allclose"] == bool(torch.isclose(a, b, equal_nan=True).all()), key
        assert row["nan_mismatch"] == bool((a.isnan() != b.isnan()).any()), key
    return len(changes)


def _check_stats(capsys: pytest.CaptureFixture[str], path_a: str, path_b: str) -> None:
    """diff --stats --json against torch's norms and Re(vdot) on every key."""
    rows = {row["path"][-1]: row for row in _run(capsys, "diff", "--stats", path_a, path_b)["layers"]}  # type: ignore[attr-defined]
    loaded_a, loaded_b = _loaded(path_a), _loaded(path_b)
    for key, a in loaded_a.items():
        b, row = loaded_b[key], rows[key]
        finite = a.isfinite() & b.isfinite()
        a, b = a[finite], b[finite]
        norm_a, norm_b = torch.linalg.vector_norm(a), torch.linalg.vector_norm(b)
        assert row["nonfinite"] == int((~finite).sum()), key
        assert row["norm_a"] == pytest.approx(float(norm_a), rel=1e-12), key
        assert row["norm_b"] == pytest.approx(float(norm_b), rel=1e-12), key
        change = float(torch.linalg.vector_norm(a - b) / norm_a)
        assert row["relative_change"] == pytest.approx(change, rel=1e-9, abs=1e-12), key
        cosine = float(torch.vdot(a, b).real / (norm_a * norm_b))
        assert row["cosine"] == pytest.approx(max(-1.0, min(1.0, cosine)), rel=1e-9, abs=1e-12), key


@pytest.mark.parametrize("dtype", COMPLEX, ids=str)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_diff_of_complex_tensors_agrees_with_torch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], dtype: torch.dtype, seed: int
) -> None:
    path_a, path_b = _save_pair(tmp_path, _pairs(dtype, seed))
    # every pair but differs in value
    assert _check_diff(capsys, path_a, path_b) == 9


@pytest.mark.parametrize("dtype", COMPLEX, ids=str)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_diff_stats_of_complex_tensors_agrees_with_torch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], dtype: torch.dtype, seed: int
) -> None:
    _check_stats(capsys, *_save_pair(tmp_path, _pairs(dtype, seed)))


def test_a_negated_complex_tensor_is_reported_changed_with_cosine_minus_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = torch.tensor([1 + 2j, 3 - 4j])
    path_a, path_b = _save_pair(tmp_path, {"c": (a, -a)})
    assert main(["diff", path_a, path_b]) == 1
    said = capsys.readouterr().out
    assert "c: max |a-b| 10" in said and "allclose" not in said
    row = _run(capsys, "diff", "--stats", path_a, path_b)["layers"][0]  # type: ignore[index]
    assert (row["relative_change"], row["cosine"]) == (2.0, -1.0)


@pytest.mark.parametrize("dtype", COMPLEX, ids=str)
@pytest.mark.parametrize("bit", ["neg", "conj", "both"])
def test_complex_view_bits_saved_by_torch_are_compared_as_loaded(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], dtype: torch.dtype, bit: str
) -> None:
    a = _random(torch.Generator().manual_seed(5), 16, dtype)
    viewed = {"neg": a._neg_view(), "conj": a.conj(), "both": a.conj()._neg_view()}[bit]
    assert viewed.is_neg() or viewed.is_conj()
    pairs = {
        "viewed vs stored bytes": (viewed, a),
        "stored bytes vs viewed": (a, viewed),
        "viewed vs itself": (viewed, viewed),
        "viewed vs scaled": (viewed, a * 2),
    }
    path_a, path_b = _save_pair(tmp_path, pairs)
    assert _check_diff(capsys, path_a, path_b) == 3
    _check_stats(capsys, path_a, path_b)


def test_complex32_is_compared_with_both_parts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a = _random(torch.Generator().manual_seed(7), 32, torch.complex64).to(torch.complex32)
        pairs = {
            "negated": (a, a._neg_view()),
            "conjugated": (a, a.conj()),
            "scaled": (a, (a.to(torch.complex64) * 2).to(torch.complex32)),
        }
        path_a, path_b = _save_pair(tmp_path, pairs)
    assert _check_diff(capsys, path_a, path_b) == 3
    _check_stats(capsys, path_a, path_b)


def test_expanded_and_large_complex_tensors_agree_with_torch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    generator = torch.Generator().manual_seed(9)
    small = _random(generator, 3, torch.complex64)
    # a stride-0 view (read as its storage, each element counted as often as the view holds it) and a tensor
    # of more than one chunk (summed on the statistics threads)
    large = _random(generator, (1 << 21) + 5, torch.complex64)
    pairs = {"expanded": (small.expand(5, 3), (-small).expand(5, 3)), "large": (large, large.conj().resolve_conj())}
    path_a, path_b = _save_pair(tmp_path, pairs)
    assert _check_diff(capsys, path_a, path_b) == 2
    _check_stats(capsys, path_a, path_b)


def test_diff_stats_of_a_complex_tensor_against_a_real_one_takes_the_real_one_as_imaginary_zero(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    real = torch.tensor([1.0, -2.0, 3.0])
    path_a, path_b = _save_pair(tmp_path, {"w": (real.to(torch.complex64) * 1j, real)})
    row = _run(capsys, "diff", "--stats", path_a, path_b)["layers"][0]  # type: ignore[index]
    # i·x against x: orthogonal in the R^2n view, and ‖a−b‖/‖a‖ = √2
    assert row["cosine"] == 0.0
    assert row["relative_change"] == pytest.approx(2**0.5, rel=1e-12)


def test_diff_of_rank_files_measures_a_complex_difference_by_its_modulus(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = _random(torch.Generator().manual_seed(11), 8, torch.complex64)
    # the last rank: the same bytes as rank 0 with torch's conj bit set (loads conjugated; was "agree bit for bit")
    ranks = [a, a.clone(), -a, a.conj().resolve_conj(), a.conj()]
    paths = []
    for rank, value in enumerate(ranks):
        paths.append(str(tmp_path / f"rank{rank}.pt"))
        torch.save({"w": value}, paths[-1])
    assert main(["diff", *paths, "--json"]) == 1
    (difference,) = json.loads(capsys.readouterr().out)["differences"]
    first = a.to(torch.complex128)
    expected = [float((first - value.resolve_conj().to(torch.complex128)).abs().max()) for value in ranks]
    assert difference["max_abs_diff_from_first"] == pytest.approx(expected, rel=1e-12)
    assert min(expected[2:]) > 0

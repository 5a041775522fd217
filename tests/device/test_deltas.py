"""Binary deltas between builds of a variant (``epfleet.deltas``), on the compiled fleet's
real QNN EPContext files: made only under half the full file, applied to the very bytes
of the new build, and a corrupted, truncated or forged delta refused with nothing
written."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
import zstandard

from epfleet.deltas import apply_delta, apply_delta_to_file, make_delta
from epfleet.errors import IntegrityError
from epfleet.fleet.publishing.publish import read_in_force
from epfleet.stores import open_store

pytestmark = pytest.mark.fast


def _htp_builds(fleet_store: Path) -> tuple[bytes, bytes]:
    """tiny-det's HTP variants for two Snapdragon targets: two compiles of one model."""
    manifest = read_in_force(open_store(str(fleet_store))).manifest
    assert manifest is not None
    variants = manifest.models["tiny-det"].variants
    files = []
    for target in ("sd8g2-htp", "sd8g3-htp"):
        artifact = variants[target].artifact
        assert artifact is not None
        files.append((fleet_store / artifact.uri).read_bytes())
    return files[0], files[1]


def test_a_delta_between_two_compiles_is_small_and_makes_the_same_bytes(
    fleet_store: Path,
) -> None:
    base, new = _htp_builds(fleet_store)
    assert base != new
    delta = make_delta(base, new)
    assert delta is not None and len(delta) < len(new) / 10, len(delta or b"")
    made = apply_delta(base, delta, hashlib.sha256(new).hexdigest(), len(new))
    assert made == new


def test_no_delta_when_it_would_not_be_under_the_bound() -> None:
    unrelated = os.urandom(64 * 1024), os.urandom(64 * 1024)
    assert make_delta(*unrelated) is None


def test_a_corrupted_truncated_or_forged_delta_is_refused_and_nothing_written(
    fleet_store: Path, tmp_path: Path
) -> None:
    base, new = _htp_builds(fleet_store)
    delta = make_delta(base, new)
    assert delta is not None
    sha256, size = hashlib.sha256(new).hexdigest(), len(new)
    base_file, dest = tmp_path / "base.onnx", tmp_path / "model.onnx"
    base_file.write_bytes(base)
    dest.write_bytes(b"the active variant")
    middle = len(delta) // 2
    corrupted = delta[:middle] + bytes([delta[middle] ^ 0xFF]) + delta[middle + 1 :]
    other = bytearray(new)
    other[len(other) // 2] ^= 0x01
    forged = make_delta(base, bytes(other))  # a delta to other bytes of the same size
    assert forged is not None
    for bad in (corrupted, delta[: len(delta) // 2], forged, b"not a zstd frame"):
        with pytest.raises(IntegrityError):
            apply_delta_to_file(base_file, bad, sha256, size, dest)
        assert dest.read_bytes() == b"the active variant"
        assert sorted(p.name for p in tmp_path.iterdir()) == ["base.onnx", "model.onnx"]
    apply_delta_to_file(base_file, delta, sha256, size, dest)
    assert dest.read_bytes() == new


def test_a_delta_claiming_more_than_the_signed_size_is_read_no_further() -> None:
    bomb = zstandard.ZstdCompressor().compress(b"\0" * 200_000_000)  # 6 KB that expand to 200 MB
    with pytest.raises(IntegrityError, match="not the 1,000 signed"):
        apply_delta(b"base", bomb, "0" * 64, 1000)

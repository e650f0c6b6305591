"""Hostile data files are bounded before they are read: zip bombs, forged array headers, pixel bombs, bad flags.

Each is one line and exit 2 (config) or 3 (input), never a traceback, never gigabytes of memory.
"""

from __future__ import annotations

import shutil
import struct
import tracemalloc
import zipfile
import zlib
from pathlib import Path

import numpy as np
import pytest

from edgedeploy.cli import main
from edgedeploy.config import config_from_dict
from edgedeploy.errors import InputError
from edgedeploy.precision.data import load_calibration, preprocess_image

MIB = 1 << 20


def _cfg(tmp_path: Path, calib: str, samples: int = 8):
    raw = {
        "model": {"factory": "m:build"},
        "inputs": [{"name": "image", "shape": ["batch", 3, 16, 16]}],
        "dims": {"batch": {"min": 1, "opt": 2, "max": 4}},
        "outputs": ["logits"],
        "precision": {"mode": "int8", "calib": calib, "calib_samples": samples},
    }
    return config_from_dict(raw, source="deploy.toml", base_dir=tmp_path)


def _npy_header(shape: tuple[int, ...], dtype: str = "<f4", fortran: bool = False) -> bytes:
    text = f"{{'descr': '{dtype}', 'fortran_order': {fortran}, 'shape': {shape}, }}"
    text += " " * (63 - (10 + len(text)) % 64) + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(text)) + text.encode()


def _zip_bomb(path: Path, members: dict[str, tuple[int, ...]], fortran: bool = False) -> None:
    """A .npz whose members are arrays of zeros of these shapes, deflated while written (a few MB on disk)."""
    chunk = bytes(8 * MIB)
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name, shape in members.items():
            with zf.open(f"{name}.npy", "w", force_zip64=True) as fh:
                fh.write(_npy_header(shape, fortran=fortran))
                left = int(np.prod(shape)) * 4
                while left:
                    fh.write(chunk[: min(left, len(chunk))])
                    left -= min(left, len(chunk))


def test_a_npz_zip_bomb_reads_only_the_samples_used(tmp_path):
    bomb = tmp_path / "bomb.npz"
    rows = 512 * MIB // (3 * 16 * 16 * 4)  # 512 MiB of samples shaped like the input
    _zip_bomb(bomb, {"image": (rows, 3, 16, 16), "junk": (128 * MIB,)})
    assert bomb.stat().st_size < 4 * MIB
    tracemalloc.start()
    try:
        # the bomb's samples are zeros: the 8 read are refused as one sample repeated, after reading only them
        with pytest.raises(InputError, match=r"bomb.npz: all 8 samples are the same"):
            load_calibration(_cfg(tmp_path, "bomb.npz"))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 * MIB, f"peak {peak / MIB:.0f} MiB"


def test_a_fortran_order_zip_bomb_is_refused_before_it_is_read_whole(tmp_path):
    """Column-major, the first samples are spread over the whole array: reading 8 of them means inflating all
    512 MiB. Refused from the header (exit 3, naming the fix); the same array of only the samples used reads."""
    bomb = tmp_path / "bombF.npz"
    rows = 512 * MIB // (3 * 16 * 16 * 4)
    _zip_bomb(bomb, {"image": (rows, 3, 16, 16)}, fortran=True)
    assert bomb.stat().st_size < 4 * MIB
    tracemalloc.start()
    try:
        refused = r"bombF.npz.*a Fortran-order array of 174,762 samples of which 8 are used"
        with pytest.raises(InputError, match=refused) as exc:
            load_calibration(_cfg(tmp_path, "bombF.npz"))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 * MIB, f"peak {peak / MIB:.0f} MiB"
    assert exc.value.exit_code == 3 and "ascontiguousarray" in str(exc.value.hint)
    used = np.asfortranarray(np.random.default_rng(0).uniform(-1, 1, (8, 3, 16, 16)).astype(np.float32))
    np.savez(tmp_path / "small.npz", image=used)
    calib = load_calibration(_cfg(tmp_path, "small.npz"))
    np.testing.assert_array_equal(np.concatenate([b["image"] for b in calib.batches]), used)


def test_a_npz_member_with_absurd_rows_is_refused_before_reading(tmp_path):
    bomb = tmp_path / "rows.npz"
    _zip_bomb(bomb, {"image": (1, 256 * MIB)})  # one 'sample' of 1 GiB
    with pytest.raises(InputError, match=r"one sample of shape \[268435456\] float32 takes") as exc:
        load_calibration(_cfg(tmp_path, "rows.npz"))
    assert exc.value.exit_code == 3


def test_a_npy_header_declaring_a_petabyte_is_one_line(tmp_path):
    forged = tmp_path / "huge.npy"
    forged.write_bytes(_npy_header((10**12, 3, 16, 16)) + bytes(4096))
    with pytest.raises(InputError, match="header declares shape .* truncated or forged") as exc:
        load_calibration(_cfg(tmp_path, "huge.npy"))
    assert exc.value.exit_code == 3


def test_object_arrays_stay_refused(tmp_path):
    np.save(tmp_path / "obj.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(InputError, match="Python objects|Object arrays cannot be loaded"):
        load_calibration(_cfg(tmp_path, "obj.npy"))


def _png_header_only(path: Path, width: int, height: int) -> None:
    """A PNG that declares ``width`` x ``height`` pixels and holds none (what a pixel bomb's header says)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    path.write_bytes(
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b"")
    )


def test_a_200_mpixel_png_is_refused_from_its_header(tmp_path, monkeypatch):
    pytest.importorskip("PIL")
    from PIL import Image

    bomb = tmp_path / "calib" / "bomb.png"
    bomb.parent.mkdir()
    _png_header_only(bomb, 20000, 10000)
    with pytest.raises(InputError, match=r"200000000 pixels.*not decoded") as exc:
        preprocess_image(bomb, size=(16, 16), channels=3, mean=None, std=None, layout="NCHW")
    assert exc.value.exit_code == 3
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", None)  # PIL's bound switched off: edgedeploy's still holds
    with pytest.raises(InputError, match=r"20000x10000 \(200 Mpixel\).*not decoded"):
        preprocess_image(bomb, size=(16, 16), channels=3, mean=None, std=None, layout="NCHW")
    monkeypatch.undo()
    with pytest.raises(InputError, match="not decoded"):
        load_calibration(_cfg(tmp_path, "calib"))


def test_a_negative_seed_is_a_config_error(tiny_project: Path, capsys):
    assert main(["build", "-c", str(tiny_project), "--seed", "-1"]) == 2
    err = capsys.readouterr().err
    assert "validate.seed" in err and "Traceback" not in err
    assert not (tiny_project.parent / "out").exists()


def test_a_file_that_is_no_checkpoint_is_one_line(tiny_project: Path, tmp_path, capsys):
    passwd = tmp_path / "passwd"
    passwd.write_text("root:x:0:0:root:/root:/bin/bash\n")
    code = main(["build", "-c", str(tiny_project), "--checkpoint", str(passwd)])
    err = capsys.readouterr().err
    assert code == 3 and "is not a checkpoint" in err and "Traceback" not in err, err
    assert not (tiny_project.parent / "out" / "model.onnx").exists()


def test_a_real_photo_folder_still_calibrates(tmp_path):
    pytest.importorskip("PIL")
    from PIL import Image

    folder = tmp_path / "photos"
    folder.mkdir()
    for i in range(3):
        Image.fromarray(np.full((40, 30, 3), 40 * i, np.uint8)).save(folder / f"{i}.png")
    shutil.copy(folder / "0.png", folder / "3.png")
    cs = load_calibration(_cfg(tmp_path, "photos"))
    assert cs.samples == 4


def test_validation_data_is_read_no_further_than_a_batch(tiny_project: Path, tmp_path):
    import edgedeploy

    bomb = tmp_path / "val.npz"
    rows = 256 * MIB // (3 * 16 * 16 * 4)
    _zip_bomb(bomb, {"image": (rows, 3, 16, 16)})
    with pytest.raises(InputError, match=rf"dim 'batch' \(axis 0\) = {rows} is outside \[1, 4\]"):
        edgedeploy.build(tiny_project, log=lambda _: None, validate__data=str(bomb))

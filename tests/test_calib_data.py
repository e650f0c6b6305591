"""Calibration data readers: image folders (real skimage photos), .npy / .npz, module:callable; hashing."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import numpy as np
import pytest

from edgedeploy.config import config_from_dict
from edgedeploy.errors import ConfigError, InputError
from edgedeploy.precision.data import (
    OrtCalibrationReader,
    calibration_fingerprint,
    hash_directory,
    load_calibration,
)


def photo_folder(folder: Path, count: int = 6, size: int = 48) -> Path:
    """Write ``count`` real photo crops (skimage.data) as PNG files into ``folder``."""
    import skimage.data
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    photos = [skimage.data.astronaut(), skimage.data.chelsea(), skimage.data.coffee()]
    rng = np.random.default_rng(0)
    for i in range(count):
        img = photos[i % len(photos)]
        y = int(rng.integers(0, img.shape[0] - size))
        x = int(rng.integers(0, img.shape[1] - size))
        Image.fromarray(img[y : y + size, x : x + size]).save(folder / f"img{i:03d}.png")
    return folder


def make_cfg(
    tmp_path: Path, *, precision: dict | None = None, shape=("batch", 3, 16, 16), normalization=None, dims=None
):
    raw = {
        "outputs": ["logits"],
        "model": {"factory": "m:build", "normalization": normalization or {}},
        "inputs": [{"name": "image", "shape": list(shape), "range": [-1.0, 1.0]}],
        "dims": {"batch": {"min": 1, "opt": 4, "max": 8}, **(dims or {})},
        "precision": {"mode": "int8", **(precision or {})},
    }
    return config_from_dict(raw, source="deploy.toml", base_dir=tmp_path)


def test_image_folder_is_resized_normalized_and_batched(tmp_path: Path) -> None:
    folder = photo_folder(tmp_path / "calib", count=10)
    (folder / "notes.txt").write_text("not an image")
    cfg = make_cfg(
        tmp_path,
        precision={"calib": str(folder), "calib_samples": 9},
        normalization={"mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5]},
    )
    cs = load_calibration(cfg)
    assert cs.kind == "images" and cs.samples == 9 and cs.available == 9
    assert [b["image"].shape for b in cs.batches] == [(4, 3, 16, 16), (4, 3, 16, 16), (1, 3, 16, 16)]
    x = np.concatenate([b["image"] for b in cs.batches])
    assert x.dtype == np.float32 and x.min() >= -1.0 and x.max() <= 1.0 and x.std() > 0.1
    # channels come out in RGB order: the astronaut crop (img000) matches PIL's own resize of that file
    from PIL import Image

    with Image.open(folder / "img000.png") as im:
        want = np.asarray(im.convert("RGB").resize((16, 16), Image.Resampling.BILINEAR), dtype=np.float32) / 127.5 - 1.0
    np.testing.assert_allclose(x[0], want.transpose(2, 0, 1), atol=1e-5)
    prov = cs.provenance()
    assert prov["source_sha256"] == hash_directory(folder, 9) and prov["samples_used"] == 9
    assert hash_directory(folder, 9) != hash_directory(folder)  # the 10th image is not read, so not hashed
    reader = OrtCalibrationReader(cs.batches)
    assert sum(1 for _ in iter(reader.get_next, None)) == 3
    reader.rewind()
    assert reader.get_next() is cs.batches[0]


def test_nhwc_layout_and_explicit_resize(tmp_path: Path) -> None:
    folder = photo_folder(tmp_path / "calib", count=2)
    cfg = make_cfg(
        tmp_path,
        shape=("batch", "h", "w", 3),
        precision={"calib": str(folder), "calib_layout": "NHWC", "calib_resize": [12, 20]},
        dims={"h": {"min": 8, "opt": 12, "max": 32}, "w": {"min": 8, "opt": 20, "max": 32}},
        normalization={"mean": [123.7, 116.3, 103.5], "std": [58.4, 57.1, 57.4]},  # 0..255 units
    )
    cs = load_calibration(cfg)
    x = cs.batches[0]["image"]
    assert x.shape == (2, 12, 20, 3)
    assert -2.5 < x.min() < 0 < x.max() < 2.8  # ImageNet-style normalization of 0..255 pixels


def test_dynamic_spatial_size_needs_resize(tmp_path: Path) -> None:
    folder = photo_folder(tmp_path / "calib", count=1)
    cfg = make_cfg(
        tmp_path,
        shape=("batch", 3, "h", 16),
        precision={"calib": str(folder)},
        dims={"h": {"min": 8, "opt": 16, "max": 32}},
    )
    with pytest.raises(ConfigError, match="dynamic height/width") as info:
        load_calibration(cfg)
    assert "precision.calib_resize" in info.value.one_line()


def test_a_calibration_folder_is_hashed_for_the_images_it_gives_and_nothing_else(tmp_path: Path, monkeypatch) -> None:
    from edgedeploy.precision import data

    folder = photo_folder(tmp_path / "calib", count=3)
    (folder / "dump.bin").write_bytes(b"x")  # stands for a huge file beside the photos: never opened
    hashed: list[str] = []
    real = data.sha256_file
    monkeypatch.setattr(data, "sha256_file", lambda p: hashed.append(Path(p).name) or real(p))
    cfg = make_cfg(tmp_path, precision={"calib": str(folder), "calib_samples": 2})
    calibration_fingerprint(cfg)
    assert hashed == ["img000.png", "img001.png"]  # the two a 2-sample calibration reads


def test_directory_hash_follows_content_not_mtime(tmp_path: Path) -> None:
    folder = photo_folder(tmp_path / "calib", count=3)
    before = hash_directory(folder)
    os.utime(folder / "img000.png", (1, 1))
    assert hash_directory(folder) == before
    (folder / "img001.png").write_bytes((folder / "img002.png").read_bytes())
    assert hash_directory(folder) != before
    cfg = make_cfg(tmp_path, precision={"calib": str(folder)})
    want = hash_directory(folder, cfg.precision.calib_samples)
    assert calibration_fingerprint(cfg) == {"kind": "images", "location": str(folder), "sha256": want}


def test_npy_npz_and_shape_errors(tmp_path: Path) -> None:
    from sklearn.datasets import load_sample_images

    photo = load_sample_images().images[0][:64, :64].astype(np.float32) / 127.5 - 1.0
    arr = np.stack([photo[i : i + 16, i : i + 16].transpose(2, 0, 1) for i in range(12)])
    np.save(tmp_path / "c.npy", arr)
    cs = load_calibration(make_cfg(tmp_path, precision={"calib": "c.npy"}))
    assert cs.kind == "npy" and cs.samples == 12 and len(cs.batches) == 3
    np.testing.assert_array_equal(np.concatenate([b["image"] for b in cs.batches]), arr)
    np.savez(tmp_path / "c.npz", image=arr.astype(np.float64))
    cs2 = load_calibration(make_cfg(tmp_path, precision={"calib": "c.npz", "calib_samples": 5}))
    assert cs2.samples == 5 and cs2.available == 12 and cs2.batches[0]["image"].dtype == np.float32
    assert cs2.data_sha256 != cs.data_sha256
    np.savez(tmp_path / "wrong.npz", pixels=arr, other=arr)
    with pytest.raises(InputError, match="no array for input"):
        load_calibration(make_cfg(tmp_path, precision={"calib": "wrong.npz"}))
    np.save(tmp_path / "bad.npy", arr[:, :, :8])
    with pytest.raises(InputError, match=r"bad.npy.*axis 2 is 8"):
        load_calibration(make_cfg(tmp_path, precision={"calib": "bad.npy"}))
    (tmp_path / "c.csv").write_text("1,2\n")
    with pytest.raises(InputError, match="unsupported file type"):
        load_calibration(make_cfg(tmp_path, precision={"calib": "c.csv"}))
    with pytest.raises(InputError, match="not found"):
        load_calibration(make_cfg(tmp_path, precision={"calib": "nope"}))
    with pytest.raises(InputError, match="needs calibration data"):
        load_calibration(make_cfg(tmp_path))


def test_nan_in_any_calibration_sample_is_refused_with_where_it_sits(tmp_path: Path) -> None:
    arr = np.random.default_rng(0).uniform(-1, 1, (12, 3, 16, 16)).astype(np.float32)
    arr[5, 0, 2, 3] = np.nan  # a middle batch: neither the first nor the last
    np.save(tmp_path / "c.npy", arr)
    with pytest.raises(InputError, match=r"c.npy, samples 4-7: .*1 NaN/Inf value") as caught:
        load_calibration(make_cfg(tmp_path, precision={"calib": "c.npy"}))
    assert "drop or repair the samples of image holding NaN/Inf" in (caught.value.hint or "")


def test_callable_source(tmp_path: Path) -> None:
    mod = f"calibsrc_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{mod}.py").write_text(
        textwrap.dedent(
            """
            import numpy as np
            from sklearn.datasets import load_digits

            def batches():
                d = load_digits().images[:10].astype("float32") / 8.0 - 1.0
                for i in range(0, 10, 3):
                    x = np.repeat(np.kron(d[i:i + 3], np.ones((2, 2), "float32"))[:, None], 3, axis=1)
                    yield {"image": x}

            def broken():
                yield np.zeros((2, 3, 16, 16), "float32")
                raise RuntimeError("camera unplugged")
            """
        )
    )
    cfg = make_cfg(tmp_path, precision={"calib_callable": f"{mod}:batches"})
    cs = load_calibration(cfg)
    assert cs.kind == "callable" and cs.samples == 10 and cs.batches[0]["image"].shape == (4, 3, 16, 16)
    fp = calibration_fingerprint(cfg)
    (tmp_path / f"{mod}.py").write_text((tmp_path / f"{mod}.py").read_text() + "\n# changed\n")
    assert calibration_fingerprint(cfg)["sha256"] != fp["sha256"]
    with pytest.raises(InputError, match="camera unplugged"):
        load_calibration(make_cfg(tmp_path, precision={"calib_callable": f"{mod}:broken"}))
    with pytest.raises(ConfigError, match="cannot find module"):
        calibration_fingerprint(make_cfg(tmp_path, precision={"calib_callable": "no_such_mod_xyz:f"}))


def test_calibration_data_whose_samples_are_all_the_same_is_refused(tmp_path: Path) -> None:
    np.save(tmp_path / "c.npy", np.zeros((32, 3, 16, 16), np.float32))
    with pytest.raises(InputError, match=r"c.npy: all 32 samples are the same") as caught:
        load_calibration(make_cfg(tmp_path, precision={"calib": "c.npy"}))
    assert "varied real samples" in (caught.value.hint or "")

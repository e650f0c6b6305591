"""[data] sources: npz layouts/labels, image folders (calibration's preprocessing + v2 augmentations),
WebDataset shards, text files with a tokenizer, user callables; num_workers."""

from __future__ import annotations

import io
import json
import tarfile

import numpy as np
import pytest
import torch

from edgedeploy.errors import ConfigError, InputError
from edgedeploy.train.config import train_config_from_dict
from edgedeploy.train.data import load_splits
from edgedeploy.train.runner import run_training

QUIET = lambda _l: None  # noqa: E731
CLASSES = ("c0_zero", "c1_one", "c2_two")  # sorted: folder order is class order


def _cfg(tmp_path, data, model=None, lr=0.01, **run):
    raw = {
        "model": model or {"factory": "edgedeploy.train.models:mlp", "kwargs": {"in_features": 64, "num_classes": 3}},
        "data": data,
        "optim": {"lr": lr},
        "monitor": {"memory": False},
        "run": {"epochs": 2, "device": "cpu", "threads": 1, **run},
    }
    return train_config_from_dict(raw, source=str(tmp_path / "train.toml"), base_dir=tmp_path)


def _digit_images(n_per_class: int = 30):
    from sklearn.datasets import load_digits

    d = load_digits()
    for label in range(3):
        for k, img in enumerate(d.images[d.target == label][:n_per_class]):
            yield label, k, (img * (255 / 16)).astype(np.uint8)


def _png(arr: np.ndarray) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(arr).resize((16, 16), Image.Resampling.NEAREST).save(buf, format="PNG")
    return buf.getvalue()


def make_image_folder(root, n_per_class: int = 30):
    for label, k, img in _digit_images(n_per_class):
        folder = root / CLASSES[label]
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{k:03d}.png").write_bytes(_png(img))
    return root


def make_shards(root, n_per_class: int = 30, shards: int = 4, test_every: int = 5):
    root.mkdir(parents=True, exist_ok=True)
    train = [tarfile.open(root / f"train-{i:02d}.tar", "w") for i in range(shards)]
    test = tarfile.open(root / "test-00.tar", "w")
    for n, (label, k, img) in enumerate(_digit_images(n_per_class)):
        tar = test if n % test_every == 0 else train[n % shards]
        for ext, payload in (("png", _png(img)), ("cls", str(label).encode())):
            info = tarfile.TarInfo(f"s{label}_{k:03d}.{ext}")
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))
    for t in (*train, test):
        t.close()
    return root


# ---- npz ------------------------------------------------------------------------------------


def test_npz_channel_last_is_refused_in_one_line_and_transposed_on_request(tmp_path):
    x = np.random.default_rng(0).random((20, 8, 8, 3), dtype=np.float32)
    np.savez(tmp_path / "d.npz", x=x, y=np.arange(20) % 2)
    with pytest.raises(InputError, match=r"looks channel-last \(N, H, W, C\)") as exc:
        load_splits(_cfg(tmp_path, {"dataset": "npz", "path": "d.npz"}))
    assert "data.layout = 'NHWC'" in exc.value.one_line()
    splits = load_splits(_cfg(tmp_path, {"dataset": "npz", "path": "d.npz", "layout": "NHWC", "normalize": False}))
    assert splits.sample_shape == (3, 8, 8)
    first = splits.train[0][0]
    assert any(torch.allclose(first, torch.from_numpy(x[i].transpose(2, 0, 1))) for i in range(20))


def test_npz_string_labels_become_classes_and_objects_are_refused(tmp_path):
    x = np.random.default_rng(0).random((30, 4), dtype=np.float32)
    y = np.array(["cat", "dog", "emu"] * 10)
    np.savez(tmp_path / "s.npz", x=x, y=y)
    splits = load_splits(_cfg(tmp_path, {"dataset": "npz", "path": "s.npz"}))
    assert splits.class_names == ["cat", "dog", "emu"] and splits.num_classes == 3
    assert {int(splits.train[i][1]) for i in range(len(splits.train))} == {0, 1, 2}
    np.savez(tmp_path / "o.npz", x=x, y=np.array([{"a": 1}] * 30, dtype=object))
    with pytest.raises(InputError, match="Python-object arrays, which are never unpickled"):
        load_splits(_cfg(tmp_path, {"dataset": "npz", "path": "o.npz"}))
    np.savez(tmp_path / "f.npz", x=x, y=np.linspace(0, 1, 30))
    with pytest.raises(InputError, match="non-integer floats"):
        load_splits(_cfg(tmp_path, {"dataset": "npz", "path": "f.npz"}))
    np.savez(tmp_path / "t.npz", x=np.array(["a"] * 30), y=np.arange(30) % 2)
    with pytest.raises(InputError, match="x has dtype <U1, not numbers"):
        load_splits(_cfg(tmp_path, {"dataset": "npz", "path": "t.npz"}))


# ---- image folder ---------------------------------------------------------------------------


def test_folder_uses_calibrations_preprocessing_and_v2_augmentations(tmp_path):
    from edgedeploy.precision.data import preprocess_image

    root = make_image_folder(tmp_path / "imgs", 6)
    data = {"dataset": "folder", "path": "imgs", "image_size": [12, 12], "channels": 1, "mean": [0.5], "std": [0.25]}
    splits = load_splits(_cfg(tmp_path, data))
    assert splits.class_names == list(CLASSES) and splits.sample_shape == (1, 12, 12)
    assert splits.normalization == {"mean": [0.5], "std": [0.25]}
    assert splits.value_range == (-2.0, 2.0)
    x, y = splits.test[0]
    f = splits.test.files[0]
    expected = preprocess_image(f, size=(12, 12), channels=1, mean=[0.5], std=[0.25], layout="NCHW")
    assert torch.equal(x, torch.from_numpy(expected)) and CLASSES[y] == f.parent.name
    flipped = load_splits(_cfg(tmp_path, {**data, "augment": {"hflip": 1.0}}))
    i = 0
    assert torch.equal(flipped.train[i][0], torch.flip(splits.train[i][0], dims=[-1]))  # train split augmented
    assert torch.equal(flipped.test[0][0], x)  # held-out split never augmented
    (tmp_path / "loose").mkdir()
    (tmp_path / "loose" / "a.png").write_bytes((root / "c1_one" / "000.png").read_bytes())
    with pytest.raises(InputError, match="has no class subfolders .*1 loose images"):
        load_splits(_cfg(tmp_path, {**data, "path": "loose"}))
    with pytest.raises(ConfigError, match="data.image_size"):
        _cfg(tmp_path, {"dataset": "folder", "path": "imgs"})


def test_three_class_folder_trains_from_config_alone_and_deploys(tmp_path):
    import edgedeploy
    from edgedeploy.config import config_from_dict
    from edgedeploy.precision.data import load_calibration

    make_image_folder(tmp_path / "imgs", 30)
    data = {"dataset": "folder", "path": "imgs", "image_size": [16, 16], "channels": 1, "mean": [0.3], "std": [0.4]}
    data |= {"batch_size": 8, "num_workers": 2}
    model = {"factory": "edgedeploy.train.models:digits_cnn", "kwargs": {"channels": 8, "num_classes": 3}}
    cfg = _cfg(tmp_path, data, model, lr=0.01, epochs=8)
    result = run_training(cfg, tmp_path / "ckpt", log=QUIET)
    assert result.metrics["test_accuracy"] >= 0.9, result.metrics
    meta = json.loads((tmp_path / "ckpt" / "model.meta.json").read_text())
    assert meta["class_names"] == list(CLASSES) and meta["inputs"][0]["shape"] == ["batch", 1, 16, 16]
    assert meta["python_path"] == [str(tmp_path)]
    # the deploy side calibrates on the folder with the sidecar's normalisation: the training tensors exactly
    deploy_raw = {"model": {"checkpoint": "ckpt/model.safetensors"}, "precision": {"calib": "imgs"}}
    deploy_cfg = config_from_dict({**deploy_raw, "build": {"target": "cpu"}}, base_dir=tmp_path)
    calib = load_calibration(deploy_cfg)
    first = calib.batches[0][deploy_cfg.inputs[0].name][0]
    files = sorted(p for p in (tmp_path / "imgs").rglob("*.png"))
    from edgedeploy.train.sources import ImageGeometry

    assert np.array_equal(first, ImageGeometry(cfg).load(files[0]).numpy())
    (tmp_path / "deploy.toml").write_text(
        '[model]\ncheckpoint = "ckpt/model.safetensors"\n[validate]\nclassifier_outputs = ["logits"]\n'
        '[build]\ntarget = "cpu"\nout = "cpu"\n'
    )
    built = edgedeploy.build(tmp_path / "deploy.toml", log=QUIET)
    assert built.ok and built.report["status"] == "passed"


# ---- webdataset -----------------------------------------------------------------------------


def test_webdataset_streams_shuffled_per_epoch_and_split_by_worker(tmp_path):
    make_shards(tmp_path / "shards", 10, shards=4)
    data = {"dataset": "webdataset", "path": "shards/train-{00..03}.tar", "test_path": "shards/test-00.tar"}
    data |= {"image_size": [16, 16], "channels": 1, "shuffle_buffer": 8}
    splits = load_splits(_cfg(tmp_path, data))
    assert splits.train_samples == 24 and len(list(splits.test)) == 6

    def epoch_keys(e: int, workers: int = 0) -> list[float]:
        splits.train.set_epoch(e)
        loader = torch.utils.data.DataLoader(splits.train, batch_size=4, num_workers=workers)
        import itertools

        return [round(float(x.sum()), 3) for xb, _ in itertools.islice(loader, 6) for x in xb]

    e0, e0_again, e1 = epoch_keys(0), epoch_keys(0), epoch_keys(1)
    assert e0 == e0_again  # seeded: a resumed epoch sees the same order
    assert e0 != e1 and sorted(e0) == sorted(e1)  # reshuffled per epoch, same 24 samples
    with_workers = epoch_keys(0, workers=2)
    assert sorted(with_workers) == sorted(e0)  # two workers split the shards: no sample twice, none lost
    model = {"factory": "edgedeploy.train.models:mlp", "kwargs": {"in_features": 256, "num_classes": 3}}
    result = run_training(_cfg(tmp_path, {**data, "batch_size": 8}, model, epochs=1), tmp_path / "run", log=QUIET)
    assert result.state.step == 24 // 8


# ---- text -----------------------------------------------------------------------------------


def test_text_records_from_csv_jsonl_and_tsv(tmp_path):
    from edgedeploy.train.sources import read_text_records

    (tmp_path / "a.csv").write_text('text,label\n"hello, world",pos\nbad day,neg\n')
    (tmp_path / "a.jsonl").write_text('{"text": "hello", "label": 1}\n\n{"text": "bye", "label": 0}\n')
    (tmp_path / "a.txt").write_text("pos\thello there\nneg\tgo away\n")
    assert read_text_records(tmp_path / "a.csv", "text", "label") == (["hello, world", "bad day"], ["pos", "neg"])
    assert read_text_records(tmp_path / "a.jsonl", "text", "label") == (["hello", "bye"], ["1", "0"])
    assert read_text_records(tmp_path / "a.txt", "text", "label")[1] == ["pos", "neg"]
    with pytest.raises(InputError, match="lacks 'text' or 'y'"):
        read_text_records(tmp_path / "a.csv", "text", "y")


# ---- callable -------------------------------------------------------------------------------


def test_callable_returns_datasets(tmp_path):
    (tmp_path / "mydata.py").write_text(
        "import torch\nfrom torch.utils.data import TensorDataset\n"
        "def sets():\n"
        "    g = torch.Generator().manual_seed(0)\n"
        "    x = torch.rand(40, 64, generator=g)\n"
        "    y = (x[:, 0] > 0.5).long()\n"
        "    return TensorDataset(x[:30], y[:30]), TensorDataset(x[30:], y[30:]), {'class_names': ['lo', 'hi']}\n"
        "def broken():\n    return [1, 2]\n"
    )
    model = {"factory": "edgedeploy.train.models:mlp", "kwargs": {"in_features": 64, "num_classes": 2}}
    result = run_training(
        _cfg(tmp_path, {"dataset": "callable", "callable": "mydata:sets"}, model), tmp_path / "r", log=QUIET
    )
    meta = json.loads(result.checkpoint.with_suffix(".meta.json").read_text())
    assert meta["class_names"] == ["lo", "hi"] and meta["inputs"][0]["shape"] == ["batch", 64]
    assert result.state.step == 2 * 1  # 30 samples, batch 64: one step per epoch
    with pytest.raises(InputError, match=r"must return \(train_dataset, test_dataset"):
        load_splits(_cfg(tmp_path, {"dataset": "callable", "callable": "mydata:broken"}, model))


def test_a_model_that_does_not_fit_the_data_fails_in_one_line(tmp_path):
    x = np.random.default_rng(0).random((30, 4), dtype=np.float32)
    np.savez(tmp_path / "d.npz", x=x, y=np.arange(30) % 3)
    wrong_size = {"factory": "edgedeploy.train.models:mlp", "kwargs": {"in_features": 5, "num_classes": 3}}
    with pytest.raises(ConfigError, match=r"does not fit the data \(inputs \[\(2, 4\)\]\): mat1 and mat2") as exc:
        run_training(_cfg(tmp_path, {"dataset": "npz", "path": "d.npz"}, wrong_size), tmp_path / "a", log=QUIET)
    assert "model.kwargs" in exc.value.one_line()
    too_few = {"factory": "edgedeploy.train.models:mlp", "kwargs": {"in_features": 4, "num_classes": 2}}
    with pytest.raises(ConfigError, match=r"returns shape \(2, 2\) for 3 classes"):
        run_training(_cfg(tmp_path, {"dataset": "npz", "path": "d.npz"}, too_few), tmp_path / "b", log=QUIET)
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()

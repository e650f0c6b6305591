"""Training data beyond arrays: image folders, WebDataset tar shards, text files + a tokenizer, and
user callables. Each returns :class:`~edgedeploy.train.data.Splits`.

Images are decoded with :func:`edgedeploy.precision.data.preprocess_image`, the function INT8
calibration uses, and the sidecar records the same mean/std, so ``deploy build`` calibrates on
exactly what training saw. transformers and webdataset are imported lazily.
"""

from __future__ import annotations

import importlib
import io
import random
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info

from edgedeploy.errors import ConfigError, InputError
from edgedeploy.precision.data import IMAGE_SUFFIXES, preprocess_image
from edgedeploy.train.config import TrainConfig
from edgedeploy.train.splits import Splits, encode_labels, outward_range, stratified_test_indices


def load(cfg: TrainConfig) -> Splits:
    """Dispatch on ``data.dataset`` (folder, webdataset, hf_text, callable)."""
    kind = cfg.data.dataset
    if kind == "folder":
        return _folder(cfg)
    if kind == "webdataset":
        return _webdataset(cfg)
    if kind == "hf_text":
        return _hf_text(cfg)
    return _callable(cfg)


# ---- images ---------------------------------------------------------------------------------


class ImageGeometry:
    """Size, channels and normalisation of image inputs, shared by folders and shards."""

    def __init__(self, cfg: TrainConfig) -> None:
        d = cfg.data
        self.size = (int(d.image_size[0]), int(d.image_size[1]))
        self.channels = d.channels
        self.mean = list(d.mean) * (d.channels if len(d.mean) == 1 else 1) or None
        self.std = list(d.std) * (d.channels if len(d.std) == 1 else 1) or None

    def load(self, source: Path | io.BytesIO) -> torch.Tensor:
        arr = preprocess_image(
            source,  # type: ignore[arg-type]  # PIL opens paths and file objects alike
            size=self.size,
            channels=self.channels,
            mean=self.mean,
            std=self.std,
            layout="NCHW",
        )
        return torch.from_numpy(np.ascontiguousarray(arr))

    def normalization(self) -> dict[str, Any]:
        return {"mean": self.mean, "std": self.std} if self.mean is not None else {}

    def value_range(self) -> tuple[float, float]:
        m = np.asarray(self.mean or [0.0] * self.channels, dtype=np.float64)
        s = np.asarray(self.std or [1.0] * self.channels, dtype=np.float64)
        lo, hi = (0.0 - m) / s, (1.0 - m) / s
        return outward_range(float(np.minimum(lo, hi).min()), float(np.maximum(lo, hi).max()))

    def sample_shape(self) -> tuple[int, ...]:
        return (self.channels, *self.size)


def augmentation(cfg: TrainConfig) -> Any:
    """torchvision.transforms.v2 pipeline for ``[data.augment]`` (None when nothing is enabled)."""
    a = cfg.data.augment
    if not (a.hflip or a.vflip or a.rotate or a.crop_scale or a.erase):
        return None
    from torchvision.transforms import v2

    steps: list[Any] = []
    if a.crop_scale:
        steps.append(v2.RandomResizedCrop(tuple(cfg.data.image_size), scale=tuple(a.crop_scale), antialias=True))
    if a.hflip:
        steps.append(v2.RandomHorizontalFlip(p=a.hflip))
    if a.vflip:
        steps.append(v2.RandomVerticalFlip(p=a.vflip))
    if a.rotate:
        steps.append(v2.RandomRotation(a.rotate))
    if a.erase:
        steps.append(v2.RandomErasing(p=a.erase))
    return v2.Compose(steps)


class ImageFiles(Dataset):
    """Image files with integer labels, decoded on access (so ``num_workers`` parallelises decoding)."""

    def __init__(self, files: list[Path], labels: list[int], geometry: ImageGeometry, transform: Any = None) -> None:
        self.files, self.labels, self.geometry, self.transform = files, labels, geometry, transform

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        x = self.geometry.load(self.files[i])
        if self.transform is not None:
            x = self.transform(x)
        return x, self.labels[i]


def _class_folders(root: Path) -> tuple[list[str], list[Path], list[int]]:
    if not root.is_dir():
        raise InputError(f"training data folder not found: {root}", hint="fix data.path in the train config")
    classes = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    loose = [p.name for p in root.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES]
    if not classes:
        raise InputError(
            f"training folder {root} has no class subfolders"
            + (f" (it holds {len(loose)} loose images)" if loose else ""),
            hint="put each class's images in its own subfolder: ROOT/<class>/<image>",
        )
    files, labels = [], []
    for index, name in enumerate(classes):
        found = sorted(p for p in (root / name).rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
        if not found:
            raise InputError(
                f"training folder {root}: class folder {name!r} holds no images ({', '.join(IMAGE_SUFFIXES)})"
            )
        files += found
        labels += [index] * len(found)
    return classes, files, labels


def _folder(cfg: TrainConfig) -> Splits:
    root = cfg.path(cfg.data.path)
    assert root is not None
    classes, files, labels = _class_folders(root)
    geometry = ImageGeometry(cfg)
    if cfg.data.test_path:
        test_root = cfg.path(cfg.data.test_path)
        assert test_root is not None
        test_classes, test_files, test_labels = _class_folders(test_root)
        if test_classes != classes:
            raise InputError(f"held-out folder {test_root} has classes {test_classes}, training has {classes}")
        train = (files, labels)
    else:
        held = set(stratified_test_indices(np.asarray(labels), cfg.data.test_fraction, cfg.data.split_seed))
        test_files = [f for i, f in enumerate(files) if i in held]
        test_labels = [y for i, y in enumerate(labels) if i in held]
        train = ([f for i, f in enumerate(files) if i not in held], [y for i, y in enumerate(labels) if i not in held])
    return Splits(
        train=ImageFiles(*train, geometry, augmentation(cfg)),
        test=ImageFiles(test_files, test_labels, geometry),
        sample_shape=geometry.sample_shape(),
        num_classes=len(classes),
        class_names=list(cfg.deploy.class_names) or classes,
        normalization=geometry.normalization(),
        value_range=geometry.value_range(),
        provenance={"kind": "folder", "location": str(root), "train_samples": len(train[0])},
    )


# ---- WebDataset shards ----------------------------------------------------------------------


def _shard_list(cfg: TrainConfig, pattern: str) -> list[str]:
    """Shard paths from ``data.path``: brace notation (``train-{000..003}.tar``) or a glob, config-relative."""
    import glob

    from webdataset.shardlists import expand_urls

    base = cfg.path(".")
    assert base is not None
    urls = []
    for url in expand_urls(pattern):
        path = Path(url) if Path(url).is_absolute() else base / url
        urls += sorted(glob.glob(str(path))) if any(c in url for c in "*?[") else [str(path)]
    missing = [u for u in urls if not Path(u).is_file()]
    if not urls or missing:
        raise InputError(
            f"webdataset shards not found: {missing[0] if missing else pattern}",
            hint="data.path is a shard pattern like 'shards/train-{000000..000003}.tar'",
        )
    return urls


class ShardStream(IterableDataset):
    """Samples streamed from tar shards (WebDataset layout: ``key.png`` + ``key.cls`` per sample).

    Each epoch the shard order is shuffled with ``seed + epoch``, shards are split across ranks and
    then across loader workers (webdataset's ``split_by_node`` / ``split_by_worker`` rule: every
    ``n``-th shard), and samples pass a seeded shuffle buffer. The stream cycles through its shards,
    so every rank can draw the same number of batches; the loader cuts an epoch to size.
    """

    def __init__(
        self, shards: list[str], geometry: ImageGeometry, image_keys: list[str], label_key: str, *,
        shuffle: int, seed: int, transform: Any = None, cycle: bool = True,
    ) -> None:  # fmt: skip
        self.shards, self.geometry, self.image_keys, self.label_key = shards, geometry, image_keys, label_key
        self.shuffle, self.seed, self.transform, self.cycle = shuffle, seed, transform, cycle
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _my_shards(self, epoch: int) -> list[str]:
        from webdataset.shardlists import split_by_node, split_by_worker
        from webdataset.utils import pytorch_worker_info

        shards = list(self.shards)
        if not self.cycle:  # held-out shards: every rank reads all of them, workers split them
            return list(split_by_worker(shards))
        random.Random(self.seed * 1_000_003 + epoch).shuffle(shards)
        _, world, _, workers = pytorch_worker_info()
        if len(shards) < world * workers:
            raise InputError(
                f"webdataset: {len(shards)} shards cannot feed {world} ranks x {workers} loader workers",
                hint="write at least world_size * num_workers shards, or lower data.num_workers",
            )
        return list(split_by_worker(split_by_node(shards)))

    def _samples(self, shards: list[str]) -> Iterator[tuple[torch.Tensor, int]]:
        from webdataset.tariterators import tarfile_samples

        for sample in tarfile_samples({"url": s} for s in shards):
            image = next((sample[k] for k in self.image_keys if k in sample), None)
            if image is None or self.label_key not in sample:
                raise InputError(
                    f"webdataset sample {sample.get('__key__')!r} in {sample.get('__url__')} lacks "
                    f"{'/'.join(self.image_keys)} or {self.label_key}",
                    hint="set data.image_key / data.label_key to the member extensions",
                )
            try:
                label = int(sample[self.label_key].decode().strip())
            except ValueError:
                raise InputError(
                    f"webdataset sample {sample['__key__']!r}: {self.label_key} is not an integer class id"
                ) from None
            x = self.geometry.load(io.BytesIO(image))
            yield (self.transform(x) if self.transform is not None else x), label

    def __iter__(self) -> Iterator[tuple[torch.Tensor, int]]:
        epoch = self.epoch
        worker = get_worker_info()
        rng = random.Random(hash((self.seed, self.epoch, worker.id if worker else 0)) & 0xFFFFFFFF)
        while True:
            mine = self._my_shards(epoch)
            if not self.cycle:
                yield from self._samples(mine)
                return
            buffer: list[tuple[torch.Tensor, int]] = []
            for sample in self._samples(mine):
                buffer.append(sample)
                if len(buffer) >= self.shuffle:
                    yield buffer.pop(rng.randrange(len(buffer)))
            rng.shuffle(buffer)
            yield from buffer
            epoch += 1_000  # keep going past this rank's shards with a fresh order


def count_samples(shards: list[str], label_key: str) -> int:
    """Samples in ``shards``, counted from tar headers (no decoding)."""
    import tarfile

    n = 0
    for shard in shards:
        with tarfile.open(shard) as tar:
            n += sum(1 for m in tar.getmembers() if m.isfile() and m.name.endswith("." + label_key))
    return n


def _webdataset(cfg: TrainConfig) -> Splits:
    try:
        importlib.import_module("webdataset")
    except ImportError:
        raise ConfigError(
            "data.dataset = 'webdataset' needs the webdataset package", hint="pip install 'edgedeploy[data]'"
        ) from None
    d = cfg.data
    if not d.test_path:
        raise ConfigError(f"{cfg.source}: key 'data.test_path' (held-out shards) is required for webdataset")
    geometry = ImageGeometry(cfg)
    keys = [k.strip() for k in d.image_key.split(";") if k.strip()]
    train_shards, test_shards = _shard_list(cfg, d.path or ""), _shard_list(cfg, d.test_path)
    train = ShardStream(
        train_shards, geometry, keys, d.label_key, shuffle=d.shuffle_buffer, seed=cfg.run.seed,
        transform=augmentation(cfg),
    )  # fmt: skip
    test = ShardStream(test_shards, geometry, keys, d.label_key, shuffle=1, seed=0, cycle=False)
    labels = sorted({y for _, y in test})  # held-out sets are small: read once for classes
    samples = d.train_samples or count_samples(train_shards, d.label_key)
    num_classes = max(len(cfg.deploy.class_names), max(labels) + 1 if labels else 0)
    return Splits(
        train=train,
        test=test,
        sample_shape=geometry.sample_shape(),
        num_classes=num_classes,
        class_names=list(cfg.deploy.class_names) or [str(i) for i in range(num_classes)],
        normalization=geometry.normalization(),
        value_range=geometry.value_range(),
        train_samples=samples,
        provenance={"kind": "webdataset", "shards": len(train_shards), "train_samples": samples},
    )


# ---- text -----------------------------------------------------------------------------------


def read_text_records(path: Path, text_column: str, label_column: str) -> tuple[list[str], list[str]]:
    """``(texts, labels)`` from a CSV/TSV (header row), JSON-lines, or ``label<TAB>text`` .txt file.

    Raises:
        InputError: unreadable file, missing columns, or no records.
    """
    import csv
    import json

    if not path.is_file():
        raise InputError(f"training text not found: {path}", hint="fix data.path in the train config")
    suffix = path.suffix.lower()
    texts: list[str] = []
    labels: list[str] = []
    try:
        with path.open(encoding="utf-8", newline="") as fh:
            if suffix in (".jsonl", ".json"):
                for n, line in enumerate(fh, 1):
                    if line.strip():
                        rec = json.loads(line)
                        if text_column not in rec or label_column not in rec:
                            raise InputError(f"{path}:{n}: record lacks {text_column!r} or {label_column!r}")
                        texts.append(str(rec[text_column]))
                        labels.append(str(rec[label_column]))
            elif suffix in (".csv", ".tsv"):
                reader = csv.DictReader(fh, delimiter="\t" if suffix == ".tsv" else ",")
                if not reader.fieldnames or not {text_column, label_column} <= set(reader.fieldnames):
                    raise InputError(
                        f"{path}: header {reader.fieldnames} lacks {text_column!r} or {label_column!r}",
                        hint="set data.text_column / data.label_column",
                    )
                for row in reader:
                    texts.append(row[text_column])
                    labels.append(row[label_column])
            else:
                for n, line in enumerate(fh, 1):
                    if line.strip():
                        label, sep, text = line.rstrip("\n").partition("\t")
                        if not sep:
                            raise InputError(f"{path}:{n}: expected 'label<TAB>text'", hint="or use .csv / .jsonl")
                        texts.append(text)
                        labels.append(label)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"training text {path} unreadable ({type(exc).__name__}: {exc})") from None
    if not texts:
        raise InputError(f"training text {path} holds no records")
    return texts, labels


def load_tokenizer(folder: Path) -> Any:
    """A Hugging Face tokenizer from a local folder (never downloads).

    Raises:
        ConfigError: transformers missing, or the folder is not a tokenizer.
    """
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise ConfigError("data.dataset = 'hf_text' needs transformers", hint="pip install 'edgedeploy[hf]'") from None
    if not folder.is_dir():
        raise InputError(f"tokenizer folder not found: {folder}", hint="fix data.tokenizer in the train config")
    try:
        return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except Exception as exc:  # transformers raises many types for a bad folder
        raise InputError(
            f"tokenizer folder {folder} unusable ({type(exc).__name__}: {str(exc).splitlines()[0]})"
        ) from None


def _encode(tokenizer: Any, texts: list[str], max_length: int) -> tuple[torch.Tensor, torch.Tensor]:
    enc = tokenizer(texts, padding="max_length", truncation=True, max_length=max_length, return_tensors="np")
    ids = torch.from_numpy(np.asarray(enc["input_ids"], dtype=np.int64))
    mask = torch.from_numpy(np.asarray(enc["attention_mask"], dtype=np.int64))
    return ids, mask


class TokenizedText(Dataset):
    """``((input_ids, attention_mask), label)`` rows of pre-tokenised text."""

    def __init__(self, ids: torch.Tensor, mask: torch.Tensor, labels: torch.Tensor) -> None:
        self.ids, self.mask, self.labels = ids, mask, labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor]:
        return (self.ids[i], self.mask[i]), self.labels[i]


def _hf_text(cfg: TrainConfig) -> Splits:
    d = cfg.data
    path = cfg.path(d.path)
    tok_dir = cfg.path(d.tokenizer)
    assert path is not None and tok_dir is not None
    tokenizer = load_tokenizer(tok_dir)
    texts, raw_labels = read_text_records(path, d.text_column, d.label_column)
    test_texts: list[str] | None = None
    raw_test: list[str] | None = None
    if d.test_path:
        test_file = cfg.path(d.test_path)
        assert test_file is not None
        test_texts, raw_test = read_text_records(test_file, d.text_column, d.label_column)
    y_raw = np.asarray(raw_labels)
    yt_raw = None if raw_test is None else np.asarray(raw_test)
    if all(v.lstrip("-").isdigit() for v in raw_labels + (raw_test or [])):
        y_raw, yt_raw = y_raw.astype(np.int64), (None if yt_raw is None else yt_raw.astype(np.int64))
    y, yt, names = encode_labels(y_raw, yt_raw, str(path))
    if test_texts is None:
        held = set(stratified_test_indices(y, d.test_fraction, d.split_seed))
        test_texts = [t for i, t in enumerate(texts) if i in held]
        yt = y[sorted(held)]
        keep = [i for i in range(len(texts)) if i not in held]
        texts, y = [texts[i] for i in keep], y[keep]
    assert yt is not None
    ids, mask = _encode(tokenizer, texts, d.max_length)
    tids, tmask = _encode(tokenizer, test_texts, d.max_length)
    num_classes = max(int(max(y.max(), yt.max())) + 1, len(names))
    vocab = int(len(tokenizer))
    length = d.max_length
    return Splits(
        train=TokenizedText(ids, mask, torch.from_numpy(y)),
        test=TokenizedText(tids, tmask, torch.from_numpy(yt)),
        sample_shape=(length,),
        num_classes=num_classes,
        class_names=list(cfg.deploy.class_names) or names or [str(i) for i in range(num_classes)],
        inputs=[
            {"name": "input_ids", "shape": ["batch", length], "dtype": "int64", "range": [0, vocab - 1]},
            {"name": "attention_mask", "shape": ["batch", length], "dtype": "int64", "range": [0, 1]},
        ],
        calibration={"input_ids": ids[:128].numpy(), "attention_mask": mask[:128].numpy()},
        validation={"input_ids": tids.numpy(), "attention_mask": tmask.numpy()},
        provenance={"kind": "hf_text", "location": str(path), "train_samples": len(texts), "vocab_size": vocab},
    )


# ---- callable -------------------------------------------------------------------------------


def _callable(cfg: TrainConfig) -> Splits:
    """``data.callable = "module:function"``: ``function()`` returns ``(train, test)`` Datasets, or
    ``(train, test, info)`` with ``info`` keys ``num_classes``, ``class_names``, ``normalization``,
    ``inputs`` (sidecar input specs) — whatever the first sample cannot tell."""
    spec = cfg.data.callable or ""
    module_name, _, attr = spec.partition(":")
    for p in reversed(cfg.model.python_path):
        resolved = str(cfg.path(p))
        if resolved not in sys.path:
            sys.path.insert(0, resolved)
    try:
        fn = getattr(importlib.import_module(module_name), attr)
    except Exception as exc:  # user code: any import-time failure is theirs
        raise ConfigError(
            f"{cfg.source}: key 'data.callable': cannot load {spec!r} ({type(exc).__name__}: {exc})",
            hint="check the module name and model.python_path",
        ) from None
    try:
        result = fn()
    except Exception as exc:  # user code
        raise InputError(f"data callable {spec} raised {type(exc).__name__}: {exc}") from None
    if not isinstance(result, tuple) or len(result) not in (2, 3):
        raise InputError(f"data callable {spec} must return (train_dataset, test_dataset[, info])")
    train, test = result[0], result[1]
    info: dict[str, Any] = dict(result[2]) if len(result) == 3 else {}
    for name, ds in (("train", train), ("test", test)):
        if not isinstance(ds, Dataset):
            raise InputError(f"data callable {spec}: the {name} set is a {type(ds).__name__}, not a torch Dataset")
    x0, _ = test[0]
    if not isinstance(x0, torch.Tensor) and not info.get("inputs"):
        raise InputError(
            f"data callable {spec}: samples are not (tensor, label); describe the inputs with info['inputs']"
        )
    labels = [int(test[i][1]) for i in range(len(test))]
    num_classes = int(info.get("num_classes") or max(labels) + 1)
    return Splits(
        train=train,
        test=test,
        sample_shape=tuple(x0.shape) if isinstance(x0, torch.Tensor) else (),
        num_classes=num_classes,
        class_names=list(info.get("class_names") or cfg.deploy.class_names) or [str(i) for i in range(num_classes)],
        normalization=dict(info.get("normalization") or {}),
        value_range=tuple(info.get("value_range") or _scanned_range((test, train))),  # type: ignore[arg-type]
        inputs=list(info.get("inputs") or []),
        provenance={"kind": "callable", "location": spec},
    )


RANGE_SCAN_SAMPLES = 256  # samples of each set the input range of a data callable is taken over


def _scanned_range(datasets: tuple[Dataset, ...]) -> tuple[float, float]:
    """The inputs' least and greatest values over up to :data:`RANGE_SCAN_SAMPLES` samples of each set, spread
    evenly (the sidecar's ``inputs.range``, which deploy's spec-random goldens and calibration checks use).
    Reading a sample may draw from the global generators (a dataset's augmentation): their states are put back."""
    from edgedeploy.train.rng import capture_rng, restore_rng

    lo, hi = np.inf, -np.inf
    generators = capture_rng(torch.device("cpu"))
    try:
        for ds in datasets:
            n = len(ds)  # type: ignore[arg-type]
            for i in sorted({int(k) for k in np.linspace(0, n - 1, min(n, RANGE_SCAN_SAMPLES))}) if n else ():
                x = ds[i][0]
                if isinstance(x, torch.Tensor) and x.numel() and x.is_floating_point():
                    lo, hi = min(lo, float(x.min())), max(hi, float(x.max()))
    finally:
        restore_rng(generators, torch.device("cpu"))
    return outward_range(lo, hi) if lo <= hi else (0.0, 1.0)

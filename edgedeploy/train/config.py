"""``train.toml`` schema: frozen dataclasses validated by edgedeploy's generic config loader.

Errors name the file and the dotted key, like deploy.toml's.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from edgedeploy.errors import ConfigError
from edgedeploy.schema import dataclass_from_dict, read_toml, resolve_path


@dataclass(frozen=True)
class TrainModelSection:
    factory: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    python_path: tuple[str, ...] = (".",)
    init: Literal["factory", "policy"] = "factory"  # "policy": edgedeploy.train.blocks.init_weights


@dataclass(frozen=True)
class AugmentSection:
    """torchvision.transforms.v2 augmentations for image training data (train split only)."""

    hflip: float = 0.0  # probability of a horizontal flip
    vflip: float = 0.0
    rotate: float = 0.0  # max degrees, uniform in [-rotate, rotate]
    crop_scale: tuple[float, ...] = ()  # [min, max] area fraction of a RandomResizedCrop back to image_size
    erase: float = 0.0  # probability of RandomErasing


@dataclass(frozen=True)
class DataSection:
    dataset: Literal["digits", "npz", "folder", "webdataset", "hf_text", "callable"] = "digits"
    path: str | None = None  # npz file, image folder, shard pattern, or text/CSV/JSON-lines file
    test_path: str | None = None  # held-out set in the same form (else a stratified split of path)
    test_fraction: float = 0.2
    val_fraction: float = 0.0  # of the train split, held out for model selection (val_* metrics); 0: none
    batch_size: int = 64  # per rank: under DDP the effective batch is batch_size * world_size
    eval_batch_size: int = 512
    normalize: bool = True
    split_seed: int = 0
    layout: Literal["auto", "NCHW", "NHWC"] = "auto"  # npz images: NHWC is transposed to NCHW
    # folder / webdataset images: preprocessing identical to calibration's (precision/data.py)
    image_size: tuple[int, ...] = ()  # [height, width]
    channels: int = 3
    mean: tuple[float, ...] = ()  # per channel, in [0, 1] units; empty: plain [0, 1] pixels
    std: tuple[float, ...] = ()
    augment: AugmentSection = field(default_factory=AugmentSection)
    image_key: str = "png;jpg;jpeg"  # webdataset member extensions holding the image
    label_key: str = "cls"  # webdataset member holding the integer class
    shuffle_buffer: int = 256  # webdataset sample shuffle buffer
    train_samples: int | None = None  # webdataset: samples in the train shards (counted when unset)
    # hf_text
    tokenizer: str | None = None  # a tokenizer folder (tokenizer.json ...), loaded offline
    text_column: str = "text"
    label_column: str = "label"
    max_length: int = 64
    # callable: "module:function" returning (train_dataset, test_dataset[, info dict])
    callable: str | None = None
    num_workers: int = 0
    pin_memory: bool = False


@dataclass(frozen=True)
class OptimSection:
    name: Literal["adamw", "adam", "sgd"] = "adamw"
    lr: float = 1e-3
    weight_decay: float = 0.0
    momentum: float = 0.9
    schedule: Literal["constant", "cosine", "onecycle"] = "constant"
    warmup_steps: int = 0  # linear warm-up over this many optimizer steps (constant, cosine)
    norm_bias_decay: bool = False  # false: no weight decay on normalisation weights and biases
    find_lr: bool = False  # run the LR range test first and train with its suggestion (not on --resume)
    find_lr_iters: int = 100  # batches the range test sweeps over


@dataclass(frozen=True)
class LossSection:
    kind: Literal["cross_entropy", "temperature_ce"] = "cross_entropy"
    temperature: float = 1.0
    learn_temperature: bool = True
    temperature_lr: float = 1e-3
    class_weights: tuple[float, ...] = ()
    label_smoothing: float = 0.0
    # how a learned temperature reaches the deployed model: "fold" divides the last Linear layer by T
    # (logits become logits / T), "output" passes temperature= to the factory (it adds a second
    # output), "none" leaves the raw logits.
    export_temperature: Literal["fold", "output", "none"] = "fold"


@dataclass(frozen=True)
class ClipSection:
    mode: Literal["none", "norm", "value"] = "none"
    max_norm: float = 1.0
    clip_value: float = 0.5


@dataclass(frozen=True)
class MonitorSection:
    gradients: bool = True
    every: int = 50
    vanishing: float = 1e-7
    exploding: float = 1e3
    anomaly_detection: bool = False
    profile: bool = False  # Chrome trace of a few steps into OUT/profile
    memory: bool = True
    tensorboard: bool = False  # OUT/tensorboard: losses, lr, grad norms (+ histograms every `every` steps)
    histograms: bool = True
    csv: bool = False  # OUT/<name>.metrics.csv: one row per epoch, beside TensorBoard


@dataclass(frozen=True)
class DDPSection:
    find_unused_parameters: bool = False
    static_graph: bool = False
    gradient_as_bucket_view: bool = False


@dataclass(frozen=True)
class RunSection:
    epochs: int = 10
    seed: int = 0
    device: Literal["auto", "cpu", "cuda"] = "auto"
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "fp32"
    backend: Literal["auto", "gloo", "nccl"] = "auto"
    threads: int | None = None
    compile: bool = False  # torch.compile the training model (eager with a message if it cannot)
    compile_backend: str = "inductor"
    accumulate: int = 1  # batches per optimizer step
    strategy: Literal["ddp", "fsdp"] = "ddp"  # under torchrun; fsdp = FSDP2 fully_shard
    freeze: tuple[str, ...] = ()  # fnmatch patterns of parameter names kept fixed ("encoder.*")
    ddp: DDPSection = field(default_factory=DDPSection)
    graph: bool = False  # OUT/<name>.dot: the autograd graph (torchviz), rendered when graphviz is present
    ema: float = 0.0  # decay of an exponential moving average of the weights (0: off); deployed when on
    early_stop_patience: int = 0  # stop after this many epochs without improving checkpoint.monitor (0: off)
    early_stop_min_delta: float = 0.0  # smallest change that counts as an improvement
    channels_last: bool = False  # 4-d inputs and the model in torch.channels_last memory format
    freeze_bn_stats: bool = True  # BatchNorm layers whose parameters run.freeze froze keep their statistics
    sync_batchnorm: bool = False  # under DDP: nn.SyncBatchNorm (batch statistics over all ranks; CUDA)
    # deterministic kernels, so a resume on CUDA is bit-exact: auto (where torch has them), strict, off
    deterministic: Literal["auto", "strict", "off"] = "auto"


@dataclass(frozen=True)
class CheckpointSection:
    name: str = "model"
    every_epochs: int = 1
    every_steps: int = 0  # also checkpoint every N optimizer steps (0: off); --resume continues mid-epoch
    monitor: str = "val_loss"  # the metric best / top-k checkpoints and early stopping watch
    mode: Literal["auto", "min", "max"] = "auto"  # auto: min for a loss, max otherwise
    save_best: bool = False  # OUT/<name>.best.safetensors: the best epoch by `monitor`
    top_k: int = 0  # keep OUT/<name>.epoch<E>.safetensors for the k best epochs (0: none)
    resume: bool = False


@dataclass(frozen=True)
class DeployMetaSection:
    """What the checkpoint metadata tells ``deploy build`` about the model's interface."""

    input_name: str = "input"
    outputs: tuple[str, ...] = ("logits",)
    batch: tuple[int, int, int] = (1, 8, 64)  # min, opt, max of the dynamic batch dim
    class_names: tuple[str, ...] = ()


@dataclass(frozen=True)
class TrainConfig:
    model: TrainModelSection
    data: DataSection = field(default_factory=DataSection)
    optim: OptimSection = field(default_factory=OptimSection)
    loss: LossSection = field(default_factory=LossSection)
    clip: ClipSection = field(default_factory=ClipSection)
    monitor: MonitorSection = field(default_factory=MonitorSection)
    run: RunSection = field(default_factory=RunSection)
    checkpoint: CheckpointSection = field(default_factory=CheckpointSection)
    deploy: DeployMetaSection = field(default_factory=DeployMetaSection)
    source: str = "<dict>"
    base_dir: str = "."

    def path(self, value: str | None) -> Path | None:
        """Resolve a path from the config relative to the config file's folder."""
        return resolve_path(self.base_dir, value)


def train_config_from_dict(raw: dict[str, Any], *, source: str = "<dict>", base_dir: str | Path = ".") -> TrainConfig:
    """Validate a parsed ``train.toml``.

    Raises:
        ConfigError: unknown/misspelled key, wrong type, or an out-of-range value (the key is named).
    """
    cfg: TrainConfig = dataclass_from_dict(TrainConfig, raw, source)
    cfg = dataclasses.replace(cfg, source=str(source), base_dir=str(base_dir))
    _check(cfg)
    _check_keys_apply(cfg, raw)
    return cfg


def load_train_config(path: str | Path) -> TrainConfig:
    """Read and validate a ``train.toml``.

    Raises:
        ConfigError: missing file, invalid TOML, or validation failure naming the key.
    """
    path = Path(path)
    raw = read_toml(path, what="train config", hint="pass --config PATH to a train.toml")
    return train_config_from_dict(raw, source=str(path), base_dir=path.resolve().parent)


def _check(cfg: TrainConfig) -> None:
    where = cfg.source
    rules: list[tuple[str, Any, bool, str]] = [
        ("model.factory", cfg.model.factory, ":" in cfg.model.factory, "must be 'module:callable'"),
        ("data.test_fraction", cfg.data.test_fraction, 0 < cfg.data.test_fraction < 1, "must be in (0, 1)"),
        ("data.batch_size", cfg.data.batch_size, cfg.data.batch_size >= 1, "must be >= 1"),
        ("data.eval_batch_size", cfg.data.eval_batch_size, cfg.data.eval_batch_size >= 1, "must be >= 1"),
        ("optim.lr", cfg.optim.lr, cfg.optim.lr > 0, "must be > 0"),
        ("optim.weight_decay", cfg.optim.weight_decay, cfg.optim.weight_decay >= 0, "must be >= 0"),
        ("loss.temperature", cfg.loss.temperature, cfg.loss.temperature > 0, "must be > 0"),
        ("loss.label_smoothing", cfg.loss.label_smoothing, 0 <= cfg.loss.label_smoothing < 1, "must be in [0, 1)"),
        ("clip.max_norm", cfg.clip.max_norm, cfg.clip.max_norm > 0, "must be > 0"),
        ("clip.clip_value", cfg.clip.clip_value, cfg.clip.clip_value > 0, "must be > 0"),
        ("monitor.every", cfg.monitor.every, cfg.monitor.every >= 1, "must be >= 1"),
        ("run.epochs", cfg.run.epochs, cfg.run.epochs >= 1, "must be >= 1"),
        ("run.threads", cfg.run.threads, cfg.run.threads is None or cfg.run.threads >= 1, "must be >= 1"),
        ("run.accumulate", cfg.run.accumulate, cfg.run.accumulate >= 1, "must be >= 1"),
        ("data.num_workers", cfg.data.num_workers, cfg.data.num_workers >= 0, "must be >= 0"),
        ("data.max_length", cfg.data.max_length, cfg.data.max_length >= 2, "must be >= 2"),
        ("data.shuffle_buffer", cfg.data.shuffle_buffer, cfg.data.shuffle_buffer >= 1, "must be >= 1"),
        ("data.channels", cfg.data.channels, cfg.data.channels in (1, 3), "must be 1 or 3"),
        ("data.image_size", list(cfg.data.image_size), len(cfg.data.image_size) in (0, 2)
         and all(v >= 1 for v in cfg.data.image_size), "must be [height, width]"),
        ("data.augment.crop_scale", list(cfg.data.augment.crop_scale), len(cfg.data.augment.crop_scale) in (0, 2)
         and all(0 < v <= 1 for v in cfg.data.augment.crop_scale), "must be [min, max] in (0, 1]"),
        ("checkpoint.every_epochs", cfg.checkpoint.every_epochs, cfg.checkpoint.every_epochs >= 1, "must be >= 1"),
        ("checkpoint.every_steps", cfg.checkpoint.every_steps, cfg.checkpoint.every_steps >= 0, "must be >= 0"),
        ("checkpoint.top_k", cfg.checkpoint.top_k, cfg.checkpoint.top_k >= 0, "must be >= 0"),
        ("data.val_fraction", cfg.data.val_fraction, 0 <= cfg.data.val_fraction < 1, "must be in [0, 1)"),
        ("run.early_stop_patience", cfg.run.early_stop_patience, cfg.run.early_stop_patience >= 0, "must be >= 0"),
        ("run.early_stop_min_delta", cfg.run.early_stop_min_delta, cfg.run.early_stop_min_delta >= 0,
         "must be >= 0"),
        ("optim.find_lr_iters", cfg.optim.find_lr_iters, cfg.optim.find_lr_iters >= 3, "must be >= 3"),
        ("optim.warmup_steps", cfg.optim.warmup_steps, cfg.optim.warmup_steps >= 0, "must be >= 0"),
        ("run.ema", cfg.run.ema, 0 <= cfg.run.ema < 1, "must be in [0, 1) (0: off; e.g. 0.999)"),
        ("checkpoint.name", cfg.checkpoint.name, _plain_name(cfg.checkpoint.name), "must be a plain file stem"),
        ("deploy.batch", list(cfg.deploy.batch), 1 <= cfg.deploy.batch[0] <= cfg.deploy.batch[1] <= cfg.deploy.batch[2],
         "must be [min, opt, max] with 1 <= min <= opt <= max"),
        ("deploy.outputs", list(cfg.deploy.outputs), len(cfg.deploy.outputs) >= 1, "must name at least one output"),
    ]  # fmt: skip
    for key, value, ok, why in rules:
        if not ok:
            raise ConfigError(f"{where}: key '{key}' = {value!r} {why}")
    augment = {k: v for k, v in dataclasses.asdict(cfg.data.augment).items() if v}
    if augment and cfg.data.dataset not in ("folder", "webdataset"):
        raise ConfigError(
            f"{where}: [data.augment] ({', '.join(sorted(augment))}) applies to image files (data.dataset = "
            f"'folder' or 'webdataset'), not to data.dataset = '{cfg.data.dataset}': it would be ignored",
            hint="remove [data.augment], or augment in your dataset (data.dataset = 'callable')",
        )
    if cfg.optim.warmup_steps and cfg.optim.schedule == "onecycle":
        raise ConfigError(
            f"{where}: key 'optim.warmup_steps' does not apply to optim.schedule = 'onecycle' (it warms up itself)",
            hint="remove warmup_steps, or use schedule = 'cosine'",
        )
    selecting = cfg.checkpoint.save_best or cfg.checkpoint.top_k or cfg.run.early_stop_patience
    watched = cfg.checkpoint.monitor
    allowed = ("val_loss", "val_accuracy", "train_loss")  # never test_*: the test split stays unseen
    if selecting and watched not in allowed:
        raise ConfigError(
            f"{where}: key 'checkpoint.monitor' = {watched!r} is not a metric", hint=f"use one of {allowed}"
        )
    if selecting and watched.startswith("val_") and not cfg.data.val_fraction:
        raise ConfigError(
            f"{where}: key 'checkpoint.monitor' = {watched!r} needs a validation split",
            hint="set data.val_fraction (e.g. 0.1); the test split is never used for selection",
        )
    d = cfg.data
    if d.dataset in ("npz", "folder", "webdataset", "hf_text") and not d.path:
        raise ConfigError(f"{where}: key 'data.path' is required when data.dataset = '{d.dataset}'")
    if d.dataset in ("folder", "webdataset") and not d.image_size:
        raise ConfigError(
            f"{where}: key 'data.image_size' = [height, width] is required for data.dataset = '{d.dataset}'"
        )
    if d.dataset == "hf_text" and not d.tokenizer:
        raise ConfigError(
            f"{where}: key 'data.tokenizer' (a tokenizer folder) is required for data.dataset = 'hf_text'"
        )
    if d.dataset == "callable" and not (d.callable and ":" in d.callable):
        raise ConfigError(f"{where}: key 'data.callable' = 'module:function' is required for data.dataset = 'callable'")
    for key in ("mean", "std"):
        values = getattr(d, key)
        if values and len(values) not in (1, d.channels):
            raise ConfigError(f"{where}: key 'data.{key}' has {len(values)} values for {d.channels} channels")
    if cfg.data.dataset == "digits" and cfg.data.path:
        raise ConfigError(f"{where}: key 'data.path' is not used with data.dataset = 'digits'", hint="remove it")


# keys that only mean something beside another key's value: (section, keys, the setting they need, its value)
_DEPENDENT_KEYS = (
    ("clip", ("max_norm",), "clip.mode", "norm"),
    ("clip", ("clip_value",), "clip.mode", "value"),
    (
        "loss",
        ("temperature", "learn_temperature", "temperature_lr", "export_temperature"),
        "loss.kind",
        "temperature_ce",
    ),
)


def _check_keys_apply(cfg: TrainConfig, raw: dict[str, Any]) -> None:
    """A key set where the setting it depends on makes it do nothing is refused, as [data.augment] is: a
    ``clip.max_norm`` with ``clip.mode = 'none'`` would train unclipped, and ``checkpoint.mode = 'min'`` on an
    accuracy would keep the worst epoch.

    Raises:
        ConfigError: the key, the setting it needs, and the fix.
    """
    for section, keys, needs, value in _DEPENDENT_KEYS:
        table = raw.get(section) or {}
        given = [k for k in keys if isinstance(table, dict) and k in table]
        have = getattr(getattr(cfg, section), needs.split(".")[1])
        if given and have != value:
            raise ConfigError(
                f"{cfg.source}: key '{section}.{given[0]}' applies to {needs} = '{value}', not '{have}': it would "
                "be ignored",
                hint=f"set {needs} = '{value}', or remove {section}.{given[0]}",
            )
    c = cfg.checkpoint
    wrong = {"min": ("accuracy",), "max": ("loss",)}.get(c.mode, ())
    if any(c.monitor.endswith(word) for word in wrong):
        best = "max" if c.mode == "min" else "min"
        raise ConfigError(
            f"{cfg.source}: key 'checkpoint.mode' = '{c.mode}' would keep the worst epoch by {c.monitor}",
            hint=f"set checkpoint.mode = '{best}' (or 'auto')",
        )


def _plain_name(name: str) -> bool:
    return bool(name) and "/" not in name and "\\" not in name and not name.startswith(".")

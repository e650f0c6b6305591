"""Bundled example: torchvision ResNet-18 (10 classes, 64x64 inputs) with seeded random weights."""

from __future__ import annotations

from pathlib import Path


def build(num_classes: int = 10):
    """The model factory named in deploy.toml (``model:build``)."""
    from torchvision.models import resnet18

    return resnet18(weights=None, num_classes=num_classes)


def make_checkpoint(path: str | Path = Path(__file__).with_name("resnet18.safetensors"), seed: int = 0) -> Path:
    """Write the example checkpoint (seeded, so every machine gets the same bytes) unless it exists."""
    import torch
    from safetensors.torch import save_file

    path = Path(path)
    if path.is_file():
        return path
    torch.manual_seed(seed)
    model = build()
    tmp = path.with_suffix(".tmp")
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(tmp))
    tmp.replace(path)
    return path


if __name__ == "__main__":
    print(make_checkpoint())

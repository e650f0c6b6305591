"""Write a 3-class image folder to stand in for your own (offline, seconds):

    python examples/folder/prepare.py          # -> examples/folder/images/{zero,one,two}/*.png

Real handwritten digits (scikit-learn's bundled set, classes 0-2) saved as 16x16 grayscale PNGs,
one subfolder per class: the layout `data.dataset = "folder"` reads.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from PIL import Image
from sklearn.datasets import load_digits

NAMES = ("zero", "one", "two")


def main(out: Path) -> None:
    d = load_digits()
    for label, name in enumerate(NAMES):
        folder = out / name
        folder.mkdir(parents=True, exist_ok=True)
        for k, img in enumerate(d.images[d.target == label]):
            pixels = (img * (255 / 16)).astype(np.uint8)
            Image.fromarray(pixels).resize((16, 16), Image.Resampling.BILINEAR).save(folder / f"{k:03d}.png")
    print(f"{sum(1 for _ in out.rglob('*.png'))} images in {len(NAMES)} class folders under {out}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent / "images")

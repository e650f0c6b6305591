"""Typed input generators (ids, mask, image, float; inclusive ranges) and vacuous parity rows."""

from __future__ import annotations

import numpy as np

from edgedeploy.config import InputSpec
from edgedeploy.modelio.generators import generate, prefix_mask
from edgedeploy.validate.parity import compare_output


def test_ids_cover_both_ends_of_the_inclusive_range() -> None:
    spec = InputSpec("ids", ("b", "s"), dtype="int64", range=(0, 3), kind="ids")
    arr = generate(spec, (64, 32), np.random.default_rng(0))
    assert arr.dtype == np.int64
    assert set(np.unique(arr)) == {0, 1, 2, 3}


def test_masks_are_prefix_masks_never_fully_masked() -> None:
    spec = InputSpec("attention_mask", ("b", "s"), dtype="int64", range=(0, 1), kind="mask")
    rng = np.random.default_rng(1)
    for length in (1, 2, 7, 33):
        mask = generate(spec, (16, length), rng)
        assert mask.dtype == np.int64
        lengths = mask.sum(1)
        assert lengths.min() >= 1
        for row, n in zip(mask, lengths):
            assert row[:n].all() and not row[n:].any()
    assert (generate(spec, (64, 16), rng).sum(1) < 16).any(), "padding is exercised"
    # some batches hold a full-length row and some do not (where a model trimming padding returns less)
    longest = {int(generate(spec, (2, 12), rng).sum(1).max()) for _ in range(40)}
    assert 12 in longest and min(longest) < 12
    assert prefix_mask((2, 3, 5), rng, np.float32).shape == (2, 3, 5)


def test_float_and_image_kinds_stay_in_range_and_default_kind_follows_dtype() -> None:
    rng = np.random.default_rng(2)
    image = generate(InputSpec("x", (2, 3, 4, 4), range=(-1.0, 1.0), kind="image"), (2, 3, 4, 4), rng)
    assert image.dtype == np.float32 and -1.0 <= image.min() and image.max() <= 1.0
    legacy = generate(InputSpec("t", (8,), dtype="int32", range=(5, 6)), (1000,), rng)
    assert legacy.dtype == np.int32 and set(np.unique(legacy)) == {5, 6}


def test_constant_reference_and_candidate_is_vacuous_not_ok() -> None:
    zeros = np.zeros((2, 8), np.float32)
    row = compare_output(zeros, zeros.copy(), atol=1e-4, rtol=1e-3)
    assert row["passed"] and row["vacuous"]
    real = np.random.default_rng(3).normal(size=(2, 8)).astype(np.float32)
    assert not compare_output(real, real.copy(), atol=1e-4)["vacuous"]
    from edgedeploy.pipeline.report import _verdict
    from edgedeploy.reportview import CheckRow, _Reader

    assert _verdict(CheckRow._read(_Reader(row, "row", "test"))) == "vacuous"

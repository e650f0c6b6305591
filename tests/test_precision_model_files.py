"""The quantizer's rewrites share one parse of a model and write it once (precision/model_files.py), and the
model they write is the one they wrote file by file, to the byte."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper
from test_calib_cache import export_onnx
from test_precision import photo_batches
from test_precision_float_subset import residual_net

from edgedeploy.precision import model_files
from edgedeploy.precision.quantize import Quantizer, flavour_for, preprocess


@pytest.fixture(scope="module")
def float_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("model_files")
    x = photo_batches(samples=8, batch=8)[0]["image"]
    return preprocess(export_onnx(residual_net(), x, folder / "raw.onnx"), folder / "float.onnx")


def _quantized(float_model: Path, work: Path, runtime: str, exclude: list[str]) -> bytes:
    """The bytes of one fallback try's model (derived from the first, bias-corrected, every rewrite run)."""
    work.mkdir()
    q = Quantizer(float_model, work, flavour_for(runtime), reduce_range=False)
    q.output_bias_correction = True
    batches = photo_batches(samples=8, batch=2)
    q.quantize(work / "first.onnx", batches)
    return q.quantize(work / "try.onnx", batches, exclude=exclude).read_bytes()


@pytest.mark.parametrize("runtime", ["onnxruntime", "tensorrt"])
def test_the_model_written_once_is_the_model_written_by_each_rewrite(
    float_model: Path, tmp_path: Path, runtime: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    first_conv = next(n.name for n in onnx.load(str(float_model)).graph.node if n.op_type == "Conv")
    held = _quantized(float_model, tmp_path / "held", runtime, [first_conv])
    saves: list[str] = []
    real_save = onnx.save

    def counting_save(model: onnx.ModelProto, path: str, *args: object, **kwargs: object) -> None:
        saves.append(Path(path).name)
        real_save(model, path, *args, **kwargs)

    # each rewrite on its own: it parses the file and writes it again
    monkeypatch.setattr(model_files, "held", lambda path, cache=None: contextlib.nullcontext())
    monkeypatch.setattr(onnx, "save", counting_save)
    one_by_one = _quantized(float_model, tmp_path / "one_by_one", runtime, [first_conv])
    assert saves.count("try.onnx") >= 3  # the float node's surgery, the float outputs, the bias shifts, ...
    assert held == one_by_one


def test_a_quantized_model_is_written_once_after_its_rewrites(
    float_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    q = Quantizer(float_model, tmp_path, flavour_for("tensorrt"), reduce_range=False)
    q.output_bias_correction = True
    batches = photo_batches(samples=8, batch=2)
    q.quantize(tmp_path / "first.onnx", batches)
    saves: list[str] = []
    real_save = onnx.save

    def counting_save(model: onnx.ModelProto, path: str, *args: object, **kwargs: object) -> None:
        saves.append(Path(path).name)
        real_save(model, path, *args, **kwargs)

    monkeypatch.setattr(onnx, "save", counting_save)
    first_conv = next(n.name for n in onnx.load(str(float_model)).graph.node if n.op_type == "Conv")
    q.quantize(tmp_path / "try.onnx", batches, exclude=[first_conv])
    assert saves.count("try.onnx") == 1


def _scaled(path: Path, factor: float) -> None:
    """Multiply the model's first initializer by ``factor`` (a rewrite: load, change, save)."""
    model = model_files.load(path)
    init = model.graph.initializer[0]
    init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) * np.float32(factor), init.name))
    model_files.save(model, path)


def _first_value(path: Path) -> float:
    return float(numpy_helper.to_array(onnx.load(str(path)).graph.initializer[0]).ravel()[0])


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "w"], ["y"])],
        "tiny",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2])],
        [numpy_helper.from_array(np.array([1.0, 2.0], np.float32), "w")],
    )
    path = tmp_path / "tiny.onnx"
    onnx.save(helper.make_model(graph), str(path))
    return path


def test_rewrites_in_a_block_see_each_other_and_land_when_it_ends(tiny: Path) -> None:
    with model_files.held(tiny):
        _scaled(tiny, 3.0)
        _scaled(tiny, 5.0)
        assert _first_value(tiny) == 1.0  # not written yet
        assert float(numpy_helper.to_array(model_files.copy_of(tiny).graph.initializer[0])[0]) == 15.0
    assert _first_value(tiny) == 15.0


def test_a_block_that_raises_leaves_the_file_as_it_was(tiny: Path) -> None:
    before = tiny.read_bytes()
    with pytest.raises(RuntimeError), model_files.held(tiny):
        _scaled(tiny, 3.0)
        raise RuntimeError("the try failed")
    assert tiny.read_bytes() == before


def test_a_copy_changed_by_a_measurement_does_not_change_the_held_model(tiny: Path) -> None:
    with model_files.held(tiny):
        _scaled(tiny, 2.0)
        copy = model_files.copy_of(tiny)
        copy.graph.initializer[0].CopyFrom(numpy_helper.from_array(np.zeros(2, np.float32), "w"))
    assert _first_value(tiny) == 2.0


def test_other_files_are_read_and_written_as_usual_inside_a_block(tiny: Path, tmp_path: Path) -> None:
    other = tmp_path / "other.onnx"
    other.write_bytes(tiny.read_bytes())
    with model_files.held(tiny):
        _scaled(other, 7.0)
        assert _first_value(other) == 7.0  # written at once: the block holds tiny.onnx only
    assert _first_value(tiny) == 1.0


def test_a_shared_read_cache_parses_a_changed_file_again(tiny: Path) -> None:
    cache: dict[object, object] = {}
    with model_files.held(tiny.with_name("out.onnx"), cache):
        assert float(numpy_helper.to_array(model_files.read_only(tiny).graph.initializer[0])[0]) == 1.0
    _scaled(tiny, 4.0)  # outside any block: written now, a new size or modification time
    stat = os.stat(tiny)
    os.utime(tiny, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    with model_files.held(tiny.with_name("out.onnx"), cache):
        assert float(numpy_helper.to_array(model_files.read_only(tiny).graph.initializer[0])[0]) == 4.0

"""TensorRT Q/DQ models run in ONNX Runtime as their operators define them, wherever ONNX Runtime stands in.

ONNX Runtime's own INT8 kernels are not TensorRT's, and most convs of a TensorRT-placed graph (no Q/DQ pair
between a conv and its activation) fall outside ONNX Runtime's Q/DQ fusions, where they dequantized their
weights on every run. So every session on a TensorRT-flavour Q/DQ model (the search's judge, bias correction,
ranking, goldens veto, the bundle's dry run) runs the graph as written; a cpu model, whose artifact runs on
ONNX Runtime's kernels, is judged on exactly those kernels.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from test_calib_data import photo_folder
from test_precision_build import _normalized_project

import edgedeploy
from edgedeploy.onnxtools.ort import DISABLE_QDQ_FUSION, ort_session
from edgedeploy.precision.quantize import Quantizer, flavour_for


def _as_written(session: Any) -> bool:
    try:
        return session.get_session_options().get_session_config_entry(DISABLE_QDQ_FUSION) == "1"
    except RuntimeError:  # the key was never set
        return False


def _residual_cnn(path: Path) -> Path:
    """conv 3x3 -> ReLU6 -> conv 1x1 -> + skip -> global pool -> Gemm: TensorRT's fusion patterns, tiny."""
    rng = np.random.default_rng(0)

    def init(name: str, *shape: int) -> Any:
        return numpy_helper.from_array(rng.normal(0, 0.5, shape).astype(np.float32), name)

    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Clip", ["c1", "lo", "hi"], ["a1"], name="relu6"),
        helper.make_node("Conv", ["a1", "w2", "b2"], ["c2"], name="conv2"),
        helper.make_node("Add", ["c2", "a1"], ["r"], name="residual"),
        helper.make_node("GlobalAveragePool", ["r"], ["p"], name="pool"),
        helper.make_node("Flatten", ["p"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "wg", "bg"], ["logits"], name="head", transB=1),
    ]
    inits = [init("w1", 8, 3, 3, 3), init("b1", 8), init("w2", 8, 8, 1, 1), init("b2", 8), init("wg", 5, 8)]
    inits += [init("bg", 5), numpy_helper.from_array(np.float32(0), "lo"), numpy_helper.from_array(np.float32(6), "hi")]
    graph = helper.make_graph(
        nodes,
        "residual",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, 12, 12])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["n", 5])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    model.ir_version = 9
    onnx.save(model, str(path))
    return path


def _batches() -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(1)
    return [{"x": rng.uniform(-1, 1, (4, 3, 12, 12)).astype(np.float32)} for _ in range(4)]


def test_a_tensorrt_qdq_model_runs_in_onnxruntime_as_its_operators_define_it(tmp_path: Path) -> None:
    float_model = _residual_cnn(tmp_path / "float.onnx")
    batches = _batches()
    q = Quantizer(float_model, tmp_path, flavour_for("tensorrt"))
    qdq = q.quantize(tmp_path / "model.int8.onnx", batches)
    ops = {n.op_type for n in onnx.load(str(qdq)).graph.node}
    assert {"QuantizeLinear", "DequantizeLinear"} <= ops
    session = ort_session(qdq, qdq_as_written=True)
    assert _as_written(session) and not _as_written(ort_session(qdq))
    from onnx.reference import ReferenceEvaluator

    literal = ReferenceEvaluator(str(qdq))  # the ONNX operators' definitions, computed in numpy
    for feeds in batches:
        got = session.run(["logits"], feeds)[0]
        want = literal.run(["logits"], feeds)[0]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))


@pytest.fixture
def recorded_sessions(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, bool, bool]]:
    """(model, holds Q/DQ, run as written) for every ONNX Runtime session opened on a file while it is active."""
    opened: list[tuple[str, bool, bool]] = []
    real = ort.InferenceSession

    class Recording(real):  # type: ignore[misc,valid-type]
        def __init__(self, path_or_bytes: Any, *args: Any, **kwargs: Any) -> None:
            qdq = False
            if isinstance(path_or_bytes, (str, Path)):
                graph = onnx.load(str(path_or_bytes), load_external_data=False).graph
                qdq = any(n.op_type == "QuantizeLinear" for n in graph.node)
            super().__init__(path_or_bytes, *args, **kwargs)
            name = Path(path_or_bytes).name if isinstance(path_or_bytes, (str, Path)) else "<bytes>"
            opened.append((name, qdq, _as_written(self)))

    monkeypatch.setattr(ort, "InferenceSession", Recording)
    return opened


@pytest.mark.parametrize("runtime", ["tensorrt", "onnxruntime"])
def test_bias_correction_and_ranking_measure_a_model_as_its_target_is_judged(
    runtime: str, tmp_path: Path, recorded_sessions: list[tuple[str, bool, bool]]
) -> None:
    from edgedeploy.precision.analysis import run_model
    from edgedeploy.precision.fallback import layer_sensitivity
    from edgedeploy.precision.layer_error import layer_errors

    float_model = _residual_cnn(tmp_path / "float.onnx")
    batches = _batches()
    q = Quantizer(float_model, tmp_path, flavour_for(runtime), output_bias_correction=True)
    qdq = q.quantize(tmp_path / "model.int8.onnx", batches)
    assert q.output_shifts  # the convs' output means were measured
    layer_sensitivity(q, batches[:2], run_model(float_model, batches[:2]), ["conv1", "conv2"])
    # the one-pass ranking of large graphs, asked as the precision stage asks it
    rows = layer_errors(
        qdq, float_model, batches, tmp_path, ["conv1", "conv2"], qdq_as_written=q.flavour.qdq_as_written
    )
    assert {r["node"] for r in rows} == {"conv1", "conv2"}
    written = {w for _, has_qdq, w in recorded_sessions if has_qdq}
    assert written == {runtime == "tensorrt"}  # every Q/DQ session: as written for TensorRT, ORT's kernels for cpu


def _qdq_sessions_of_int8_build(
    tiny_project: Path, tmp_path: Path, target: str, opened: list[tuple[str, bool, bool]]
) -> list[tuple[str, bool]]:
    """(model, run as written) of every session a passing INT8 build of the tiny project opened on a Q/DQ model."""
    photos = photo_folder(tmp_path / "photos", count=16, size=40)
    result = edgedeploy.build(
        _normalized_project(tiny_project),
        log=lambda _: None,
        build__target=target,
        build__out=str(tmp_path / target),
        precision__mode="int8",
        precision__calib=str(photos),
    )
    assert result.report["status"] == "passed"
    return [(name, written) for name, has_qdq, written in opened if has_qdq]


def test_every_session_of_a_tensorrt_int8_build_and_its_dry_run_runs_qdq_as_written(
    tiny_project: Path, tmp_path: Path, recorded_sessions: list[tuple[str, bool, bool]]
) -> None:
    qdq = _qdq_sessions_of_int8_build(tiny_project, tmp_path, "jetson-orin", recorded_sessions)
    assert len(qdq) >= 2  # the judge and the search's timing at least
    assert [name for name, written in qdq if not written] == []
    from edgedeploy.device.complete_bundle import OrtRunner

    bundle = tmp_path / "jetson-orin" / "bundle"
    assert _as_written(OrtRunner(str(bundle / "model.int8.onnx")).session)  # the dry run: as the build judged it


def test_a_cpu_int8_build_judges_its_model_on_onnxruntimes_own_int8_kernels(
    tiny_project: Path, tmp_path: Path, recorded_sessions: list[tuple[str, bool, bool]]
) -> None:
    qdq = _qdq_sessions_of_int8_build(tiny_project, tmp_path, "cpu", recorded_sessions)
    assert qdq and not any(written for _, written in qdq)  # the artifact ships to these very kernels

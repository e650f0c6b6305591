"""Operator preflight: TensorRT op tables (no TensorRT), ONNX Runtime sessions, DLA, dtypes, deploy check."""

from __future__ import annotations

import json
import re
from importlib import resources
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper
from test_capture import make_config, quiet

from edgedeploy.cli import main
from edgedeploy.errors import UnsupportedOpsError
from edgedeploy.onnxtools.opsupport import check_model, table_for, tensorrt_findings, trt_table_versions
from edgedeploy.pipeline.runner import run_build
from edgedeploy.stages.check import PREFLIGHT, PreflightFromOnnx
from edgedeploy.stages.export import OnnxFromTorch
from edgedeploy.targets import get_target

NONZERO_MODEL = """
import torch
from torch import nn


class Picker(nn.Module):
    def forward(self, x):
        # never true for inputs in [-1, 1]: the output stays per-sample, the NonZero node stays in the graph
        return x + torch.nonzero(x > 5.0).sum()


def build():
    return Picker()
"""

# torch.fmod exports as ONNX Mod(fmod=1): the TensorRT 8.2 parser registers no Mod importer (8.5 added it).
# (Reciprocal, used here before, is imported by 8.2 although its operators.md says "N".)
MOD_MODEL = """
import torch
from torch import nn


class Inv(nn.Module):
    def forward(self, x):
        return torch.fmod(x, 3.0)


def build():
    return Inv()
"""


def _findings(exc: UnsupportedOpsError, severity: str) -> list[dict[str, str]]:
    return [f for f in exc.findings if f["severity"] == severity]


def test_tables_cover_every_shipped_trt_version_and_cite_their_source() -> None:
    assert trt_table_versions() == ("8.2", "8.5", "10.3", "10.13", "10.15")
    for version in trt_table_versions():
        data = json.loads(resources.files("edgedeploy.targets").joinpath("data", f"trt-{version}.json").read_text())
        assert data["source"]["repo"] == "onnx/onnx-tensorrt" and data["source"]["ref"]
        assert data["source"]["commit"] is None or re.fullmatch(r"[0-9a-f]{40}", data["source"]["commit"])
        assert "Conv" in data["supported"] and data["unsupported"]
    for name in ("jetson-nano", "jetson-xavier", "jetson-orin", "desktop"):
        table, note = table_for(get_target(name).trt_version)
        assert table is not None and table["trt_version"] == get_target(name).trt_version and not note


def test_table_choice_for_versions_without_an_exact_table() -> None:
    assert table_for("8.6")[0]["trt_version"] == "8.5"
    table, note = table_for(get_target("desktop-trt11").trt_version)
    assert table["trt_version"] == "10.15" and "newest table" in note
    assert table_for("7.1")[0] is None


def test_data_dependent_op_is_an_error_on_old_trt_a_warning_on_new_and_fine_on_cpu(tmp_path: Path) -> None:
    import edgedeploy

    cfg = make_config(tmp_path / "nano", NONZERO_MODEL, outputs=("y",), build={"target": "jetson-nano"})
    with pytest.raises(UnsupportedOpsError) as err:
        run_build(cfg, stages=[OnnxFromTorch(), PreflightFromOnnx()], log=quiet)
    assert err.value.exit_code == 5
    errors = _findings(err.value, "error")
    assert [f["op"] for f in errors] == ["NonZero"]
    assert "TensorRT 8.2" in errors[0]["message"] and errors[0]["fix"]
    failed = json.loads((tmp_path / "nano" / "out" / ".last-failed" / PREFLIGHT).read_text())
    assert failed["findings"][0]["op"] == "NonZero"

    cfg = make_config(tmp_path / "desk", NONZERO_MODEL, build={"target": "desktop"})
    result = run_build(cfg, stages=[OnnxFromTorch(), PreflightFromOnnx()], log=quiet)
    check = result.report["metrics"]["check"]
    assert check["error"] == 0 and check["warning"] >= 1
    assert any("data-dependent" in w and "NonZero" in w for w in result.report["warnings"])
    nonzero = next(f for f in check["findings"] if f["op"] == "NonZero")
    assert next(tmp_path.glob("desk/m_*.py")).name in nonzero["source"]  # dynamo records the user's line

    cfg = make_config(tmp_path / "cpu", NONZERO_MODEL)
    result = edgedeploy.build(cfg, log=quiet)
    assert result.ok and result.report["metrics"]["check"]["findings"] == []


def test_op_added_after_trt82_fails_only_the_old_target(tmp_path: Path) -> None:
    cfg = make_config(tmp_path / "nano", MOD_MODEL, build={"target": "jetson-nano"})
    with pytest.raises(UnsupportedOpsError) as err:
        run_build(cfg, stages=[OnnxFromTorch(), PreflightFromOnnx()], log=quiet)
    assert [f["op"] for f in _findings(err.value, "error")] == ["Mod"]
    cfg = make_config(tmp_path / "orin", MOD_MODEL, build={"target": "jetson-orin"})
    result = run_build(cfg, stages=[OnnxFromTorch(), PreflightFromOnnx()], log=quiet)
    assert result.report["metrics"]["check"]["error"] == 0


def _onnx_file(path: Path, nodes: list, inputs: list, outputs: list, inits: list | None = None) -> Path:
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=inits or [])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def _nonzero_onnx(tmp_path: Path) -> Path:
    return _onnx_file(
        tmp_path / "nz.onnx",
        [helper.make_node("NonZero", ["x"], ["y"], name="pick")],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
        [helper.make_tensor_value_info("y", TensorProto.INT64, [2, "k"])],
    )


def test_deploy_check_on_an_onnx_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _nonzero_onnx(tmp_path)
    assert main(["check", "--onnx", str(path), "--target", "jetson-nano"]) == 5
    out = capsys.readouterr()
    assert "NonZero" in out.out and "pick" in out.out and "error" in out.out
    assert "unsupported operators" in out.err
    assert main(["check", "--onnx", str(path), "--target", "cpu"]) == 0
    assert "no findings" in capsys.readouterr().out
    assert main(["check", "--onnx", str(path), "--target", "jetson-orin", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["target"] == "jetson-orin" and any(f["op"] == "NonZero" for f in report["findings"])
    assert main(["check", "--onnx", str(tmp_path / "missing.onnx"), "--target", "cpu"]) == 3


def test_the_fix_for_an_op_tensorrt_cannot_parse_names_a_release_that_can_or_says_none_can(tmp_path: Path) -> None:
    det = onnx.load(
        str(
            _onnx_file(
                tmp_path / "det.onnx",
                [helper.make_node("Det", ["x"], ["y"], name="det")],
                [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 2, 2])],
                [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])],
            )
        )
    )
    (found,) = [f for f in tensorrt_findings(det, trt_version="10.3") if f.severity == "error"]
    newest = trt_table_versions()[-1]
    assert f"no TensorRT up to {newest} does" in found.fix and "cpu target" in found.fix  # no device to move to
    nonzero = onnx.load(str(_nonzero_onnx(tmp_path)))
    (found,) = [f for f in tensorrt_findings(nonzero, trt_version="8.2") if f.severity == "error"]
    assert "with TensorRT 8.5 or newer, which parses it" in found.fix  # the first release whose table has it


def test_deploy_check_with_a_config(tiny_project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--config", str(tiny_project), "--target", "jetson-orin"]) == 0
    out = capsys.readouterr().out
    assert "operator preflight for target 'jetson-orin'" in out


def test_inputs_that_must_be_constant_are_checked(tmp_path: Path) -> None:
    # TopK with K fed at run time: TensorRT 8.2 needs K to be an initializer
    model = onnx.load(
        str(
            _onnx_file(
                tmp_path / "topk.onnx",
                [helper.make_node("TopK", ["x", "k"], ["v", "i"], name="topk", axis=1)],
                [
                    helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8]),
                    helper.make_tensor_value_info("k", TensorProto.INT64, [1]),
                ],
                [
                    helper.make_tensor_value_info("v", TensorProto.FLOAT, [2, "k"]),
                    helper.make_tensor_value_info("i", TensorProto.INT64, [2, "k"]),
                ],
            )
        )
    )
    old = [f for f in tensorrt_findings(model, trt_version="8.2") if f.severity == "error"]
    assert [(f.node, f.op) for f in old] == [("topk", "TopK")] and "`K`" in old[0].message
    assert not [f for f in tensorrt_findings(model, trt_version="10.3") if f.severity == "error"]


def test_attribute_restrictions_and_custom_domains(tmp_path: Path) -> None:
    model = onnx.load(
        str(
            _onnx_file(
                tmp_path / "resize.onnx",
                [
                    helper.make_node("Resize", ["x", "", "scales"], ["y"], name="up", mode="cubic"),
                ],
                [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 4, 4])],
                [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, 8, 8])],
                [helper.make_tensor("scales", TensorProto.FLOAT, [4], [1, 1, 2, 2])],
            )
        )
    )
    # bicubic: the 8.2 importer refuses it (ASSERT mode != "cubic"); 8.5+ import it (ResizeMode::kCUBIC)
    errors = [f for f in tensorrt_findings(model, trt_version="8.2") if f.severity == "error"]
    assert len(errors) == 1 and "mode" in errors[0].message and "'cubic'" in errors[0].message
    assert [f for f in tensorrt_findings(model, trt_version="10.3") if f.severity == "error"] == []
    custom = helper.make_model(
        helper.make_graph(
            [helper.make_node("Gelu", ["x"], ["y"], name="g", domain="com.microsoft")],
            "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
        ),
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)],
    )
    assert any("custom-domain" in f.message for f in tensorrt_findings(custom, trt_version="10.13"))


def test_int64_io_is_a_warning_before_trt9_only(tmp_path: Path) -> None:
    model = onnx.load(
        str(
            _onnx_file(
                tmp_path / "ids.onnx",
                [helper.make_node("Identity", ["ids"], ["out"], name="id")],
                [helper.make_tensor_value_info("ids", TensorProto.INT64, ["n"])],
                [helper.make_tensor_value_info("out", TensorProto.INT64, ["n"])],
            )
        )
    )
    old = tensorrt_findings(model, trt_version="8.5")
    assert [f.severity for f in old] == ["warning"] and "INT64" in old[0].message and "ids" in old[0].node
    assert tensorrt_findings(model, trt_version="10.3") == []


def test_dla_request_flags_what_dla_cannot_run(tmp_path: Path) -> None:
    path = _onnx_file(
        tmp_path / "dla.onnx",
        [
            helper.make_node("Relu", ["x"], ["r"], name="relu"),
            helper.make_node("Erf", ["r"], ["y"], name="erf"),
        ],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])],
    )
    orin = get_target("jetson-orin")
    assert check_model(path, orin) == []
    findings = check_model(path, orin, dla_core=0, precision="fp16")
    assert {f.severity for f in findings} == {"warning"}
    assert any(f.op == "Erf" and "DLA cannot run" in f.message for f in findings)
    assert any("dynamic dims" in f.message for f in findings)
    assert not any(f.op == "Relu" for f in findings)


def test_cpu_target_names_the_node_onnxruntime_refuses(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = helper.make_model(
        helper.make_graph(
            [helper.make_node("Frobnicate", ["x"], ["y"], name="mystery", domain="com.example")],
            "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
        ),
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)],
    )
    path = tmp_path / "custom.onnx"
    onnx.save(model, str(path))
    findings = check_model(path, get_target("cpu"))
    assert [(f.severity, f.node) for f in findings] == [("error", "mystery")]
    assert "ONNX Runtime" in findings[0].message
    assert main(["check", "--onnx", str(path)]) == 5


def _graph_model(nodes, inputs, outputs, inits=(), opset=17):  # type: ignore[no-untyped-def]
    graph = helper.make_graph(list(nodes), "g", list(inputs), list(outputs), initializer=list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def _errors(model, version: str) -> list[str]:  # type: ignore[no-untyped-def]
    return [f.message for f in tensorrt_findings(model, trt_version=version) if f.severity == "error"]


def _x(name: str = "x", shape=(2, 5000), dtype=TensorProto.FLOAT):  # type: ignore[no-untyped-def]
    return helper.make_tensor_value_info(name, dtype, list(shape))


def test_ops_inside_if_and_loop_bodies_are_checked_like_the_main_graphs() -> None:
    """The parser imports If / Loop bodies too: IsInf in a then-branch is refused on TensorRT 8.2 (operators.md
    release/8.2-GA: `IsInf | N`), as it is at top level."""
    then = helper.make_graph(
        [helper.make_node("IsInf", ["x"], ["inf"]), helper.make_node("Cast", ["inf"], ["y1"], to=TensorProto.FLOAT)],
        "then", [], [_x("y1", (2, 8))],
    )  # fmt: skip
    other = helper.make_graph([helper.make_node("Identity", ["x"], ["y2"])], "else", [], [_x("y2", (2, 8))])
    cond = helper.make_tensor("c", TensorProto.BOOL, [], [True])
    node = helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)
    model = _graph_model([node], [_x("x", (2, 8))], [_x("y", (2, 8))], [cond], opset=13)
    assert any("cannot parse IsInf" in m for m in _errors(model, "8.2")), _errors(model, "8.2")


def test_table_restrictions_the_parser_enforces_are_errors_not_notes() -> None:
    """onnx-tensorrt docs/operators.md (release/10.1-GA): TopK `K` < 3840, MaxPool without `Indices`, Resize
    without antialiasing, Q/DQ zero points of 0, ScatterND without `reduction`."""
    k = helper.make_tensor("k", TensorProto.INT64, [1], [4000])
    topk = _graph_model(
        [helper.make_node("TopK", ["x", "k"], ["v", "i"])], [_x()],
        [_x("v", (2, 4000)), _x("i", (2, 4000), TensorProto.INT64)], [k],
    )  # fmt: skip
    assert any("TopK K = 4000" in m for m in _errors(topk, "10.3"))
    pool = _graph_model(
        [helper.make_node("MaxPool", ["x"], ["y", "idx"], kernel_shape=[2, 2])], [_x("x", (1, 1, 4, 4))],
        [_x("y", (1, 1, 2, 2)), _x("idx", (1, 1, 2, 2), TensorProto.INT64)],
    )  # fmt: skip
    assert any("indices output" in m for m in _errors(pool, "10.3"))
    scales = helper.make_tensor("s", TensorProto.FLOAT, [4], [1, 1, 0.5, 0.5])
    resize = _graph_model(
        [helper.make_node("Resize", ["x", "", "s"], ["y"], mode="linear", antialias=1)], [_x("x", (1, 1, 8, 8))],
        [_x("y", (1, 1, 4, 4))], [scales], opset=18,
    )  # fmt: skip
    assert any("antialias" in m for m in _errors(resize, "10.3"))
    scale = helper.make_tensor("sc", TensorProto.FLOAT, [], [0.1])
    zp = helper.make_tensor("zp", TensorProto.INT8, [], [5])
    qdq = _graph_model(
        [helper.make_node("QuantizeLinear", ["x", "sc", "zp"], ["q"]),
         helper.make_node("DequantizeLinear", ["q", "sc", "zp"], ["y"])],
        [_x("x", (2, 8))], [_x("y", (2, 8))], [scale, zp], opset=13,
    )  # fmt: skip
    assert sum("zero point [5]: TensorRT needs 0" in m for m in _errors(qdq, "10.3")) == 2
    idx = helper.make_tensor("ix", TensorProto.INT64, [1, 1], [0])
    upd = helper.make_tensor("up", TensorProto.FLOAT, [1, 8], [1.0] * 8)
    scatter = _graph_model(
        [helper.make_node("ScatterND", ["x", "ix", "up"], ["y"], reduction="add")], [_x("x", (2, 8))],
        [_x("y", (2, 8))], [idx, upd], opset=16,
    )  # fmt: skip
    for version in ("8.5", "10.3"):  # an error on 10.x, silently wrong values on 8.x
        assert any("ScatterND reduction = 'add'" in m for m in _errors(scatter, version))
    plain = _graph_model([helper.make_node("Relu", ["x"], ["y"])], [_x("x", (2, 8))], [_x("y", (2, 8))], opset=8)
    assert any("opset 8 is below" in m for m in _errors(plain, "10.3"))


def test_a_slice_to_the_end_is_no_int64_warning_on_tensorrt_8() -> None:
    starts = helper.make_tensor("st", TensorProto.INT64, [1], [1])
    ends = helper.make_tensor("en", TensorProto.INT64, [1], [2**63 - 1])
    axes = helper.make_tensor("ax", TensorProto.INT64, [1], [1])
    model = _graph_model(
        [helper.make_node("Slice", ["x", "st", "en", "ax"], ["y"])], [_x("x", (2, 8))], [_x("y", (2, 7))],
        [starts, ends, axes], opset=13,
    )  # fmt: skip
    warnings = [f.message for f in tensorrt_findings(model, trt_version="8.2") if f.severity == "warning"]
    assert not any("INT64 constant" in w for w in warnings), warnings
    big = helper.make_tensor("big", TensorProto.INT64, [1], [2**40])
    model.graph.initializer.append(big)
    model.graph.node.append(helper.make_node("Add", ["big", "big"], ["z"]))
    warnings = [f.message for f in tensorrt_findings(model, trt_version="8.2") if f.severity == "warning"]
    assert any("INT64 constant" in w for w in warnings)

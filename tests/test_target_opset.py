"""Each TensorRT target exports an opset its parser handles: a LayerNorm model passes jetson-xavier's preflight."""

from __future__ import annotations

import onnx
import pytest
from test_trt_plan import _cfg

from edgedeploy.onnxtools.export import choose_opset
from edgedeploy.onnxtools.opsupport import table_for, tensorrt_findings
from edgedeploy.targets import all_targets, get_target


def test_layernorm_model_passes_preflight_for_jetson_xavier_by_default(tmp_path):
    torch = pytest.importorskip("torch")
    target = get_target("jetson-xavier")
    opset = choose_opset(_cfg("fp16"), target, "torchscript")
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.LayerNorm(8)).eval()
    path = tmp_path / "ln.onnx"
    torch.onnx.export(model, (torch.randn(2, 8),), str(path), opset_version=opset, dynamo=False)
    errors = [
        f for f in tensorrt_findings(onnx.load(str(path)), trt_version=target.trt_version) if f.severity == "error"
    ]
    assert opset == 16 and errors == []


# ops torch's exporters emit natively from this opset and decompose below it (torch/onnx symbolic_opset17
# layer_norm, symbolic_opset20 gelu); a parser without the op is served by the opset below
TORCH_NATIVE_FROM = {"LayerNormalization": 17, "Gelu": 20}


@pytest.mark.parametrize("name", [n for n, t in all_targets().items() if t.runtime == "tensorrt"])
def test_default_opset_is_the_highest_whose_torch_native_ops_the_parser_imports(name):
    target = get_target(name)
    table, _ = table_for(target.trt_version)
    missing = {op: o for op, o in TORCH_NATIVE_FROM.items() if op not in table["supported"] and o <= target.max_opset}
    want = min([target.max_opset] + [o - 1 for o in missing.values()])
    assert target.export_opset == want, f"{name}: its parser lacks {missing}"

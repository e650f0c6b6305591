"""A model whose own code freezes a tensor size (``b = int(y.shape[0])`` in forward) fails in one line naming that
``file:line`` and the rewrite that fixes it, instead of both exporters' symptoms (ONNX Runtime's GEMM mismatch)."""

from __future__ import annotations

import json
import textwrap
import uuid
from pathlib import Path

import pytest

from edgedeploy.cli import main

BAKED = textwrap.dedent(
    """
    import torch
    from torch import nn


    class Baked(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3, padding=1)
            self.fc = nn.Linear(4 * 8 * 8, 5)

        def forward(self, image):
            y = torch.relu(self.conv(image))
            b = int(y.shape[0])
            return self.fc(y.reshape(b, -1))


    def build():
        return Baked()
    """
)


def _project(tmp_path: Path) -> tuple[Path, str, int]:
    name = f"baked_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(BAKED)
    line = BAKED.splitlines().index("        b = int(y.shape[0])") + 1
    return tmp_path / f"{name}.py", name, line


def _argv(tmp_path: Path, name: str, *extra: str) -> list[str]:
    return ["build", "--factory", f"{name}:build", "--input", "image:batchx3x8x8", "--dim", "batch=1:2:4",
            "--output", "logits", "--samples", "1", "--latency-iters", "1", "--out", str(tmp_path / "out"),
            *extra]  # fmt: skip


def _one_line(capsys) -> str:
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("deploy: ")]
    assert len(err) == 1
    return err[0]


def test_frozen_batch_names_the_users_line_and_the_rewrite(tmp_path: Path, monkeypatch, capsys) -> None:
    path, name, line = _project(tmp_path)
    monkeypatch.chdir(tmp_path)
    assert main(_argv(tmp_path, name, "--exporter", "torchscript", "--capture", "script")) == 6
    err = _one_line(capsys)
    assert f"{path}:{line} freezes a tensor size" in err and "(`b = int(y.shape[0])`)" in err
    assert f"fix: write `y.shape[0]` instead of `int(y.shape[0])` at {path.name}:{line}" in err
    assert "GEMM" not in err and len(err) < 400  # the exporters' symptoms stay in the report


@pytest.mark.slow
def test_default_route_names_the_line_and_its_fix_builds(tmp_path: Path, monkeypatch, capsys) -> None:
    """Default capture and both exporters; then the fix the message names, applied as written, builds."""
    path, name, line = _project(tmp_path)
    monkeypatch.chdir(tmp_path)
    assert main(_argv(tmp_path, name)) == 6
    err = _one_line(capsys)
    assert f"{path}:{line}" in err and "write `y.shape[0]` instead of `int(y.shape[0])`" in err
    path.write_text(path.read_text().replace("int(y.shape[0])", "y.shape[0]"))
    assert main(_argv(tmp_path, name)) == 0


BRANCHY = textwrap.dedent(
    """
    import torch
    from torch import nn


    class Branchy(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 4)

        def forward(self, x):
            if x.abs().amax() > 100:
                x = x / 100
            return self.fc(x)


    def build():
        return Branchy()
    """
)


def test_a_branch_on_tensor_values_fails_export_and_its_fix_builds(tmp_path: Path, monkeypatch, capsys) -> None:
    """The traced graph would take the example's branch for every input (no probe input reaches 100): the
    exporter that traced it fails naming the line, and the rewrite its fix names builds a graph with both paths."""
    import numpy as np
    import onnxruntime as ort

    name = f"branchy_{uuid.uuid4().hex[:8]}"
    path = tmp_path / f"{name}.py"
    path.write_text(BRANCHY)
    line = BRANCHY.splitlines().index("        if x.abs().amax() > 100:") + 1
    monkeypatch.chdir(tmp_path)
    argv = ["build", "--factory", f"{name}:build", "--input", "x:batchx8", "--dim", "batch=1:2:4", "--output", "y",
            "--samples", "1", "--latency-iters", "1", "--out", str(tmp_path / "out")]  # fmt: skip
    assert main(argv) == 6
    err = _one_line(capsys)
    assert f"{path}:{line} freezes a Python value into the graph (`if x.abs().amax() > 100:`" in err
    assert f"fix: at {path.name}:{line} decide with tensor ops (torch.where(cond, a, b)" in err
    assert not (tmp_path / "out" / "model.onnx").exists()  # the failure report only
    path.write_text(BRANCHY.replace("if x.abs().amax() > 100:\n            x = x / 100",
                                    "x = torch.where(x.abs().amax() > 100, x / 100, x)"))  # fmt: skip
    assert main(argv) == 0
    sess = ort.InferenceSession(str(tmp_path / "out" / "model.onnx"), providers=["CPUExecutionProvider"])
    big = np.full((2, 8), 500.0, np.float32)  # scaled down by the model: its output is that of 5.0
    assert np.allclose(sess.run(None, {"x": big})[0], sess.run(None, {"x": big / 100})[0], atol=1e-5)


def test_accepting_tracer_warnings_warns_per_line(tmp_path: Path, monkeypatch) -> None:
    name = f"branchy_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(BRANCHY)
    monkeypatch.chdir(tmp_path)
    argv = ["build", "--factory", f"{name}:build", "--input", "x:batchx8", "--dim", "batch=1:2:4", "--output", "y",
            "--samples", "1", "--latency-iters", "1", "--out", str(tmp_path / "out"), "--no-fail-on-tracer-warnings",
            "--exporter", "torchscript", "--capture", "script"]  # fmt: skip
    assert main(argv) == 0
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    where = f"{tmp_path / name}.py:{BRANCHY.splitlines().index('        if x.abs().amax() > 100:') + 1}"
    assert f"export: the torchscript exporter froze a Python value at {where}" in " ".join(report["warnings"])
    assert report["metrics"]["export"]["tracer_warnings"][0].startswith(where)


QUIET = BRANCHY.replace(
    "        if x.abs().amax() > 100:\n            x = x / 100\n",
    "        with warnings.catch_warnings():\n"
    '            warnings.simplefilter("ignore")  # the model silences warnings around its own code\n'
    "            big = bool(x.abs().amax() > 100)\n"
    "        if big:\n            x = x / 100\n",
).replace("import torch\n", "import warnings\n\nimport torch\n", 1)


def test_a_model_that_silences_warnings_still_has_its_frozen_branch_named(tmp_path: Path, monkeypatch, capsys) -> None:
    """A TracerWarning the model's own filters hide is seen all the same: the conversion itself is watched."""
    name = f"quiet_{uuid.uuid4().hex[:8]}"
    path = tmp_path / f"{name}.py"
    path.write_text(QUIET)
    line = QUIET.splitlines().index("            big = bool(x.abs().amax() > 100)") + 1
    monkeypatch.chdir(tmp_path)
    argv = ["build", "--factory", f"{name}:build", "--input", "x:batchx8", "--dim", "batch=1:2:4", "--output", "y",
            "--samples", "1", "--latency-iters", "1", "--out", str(tmp_path / "out")]  # fmt: skip
    assert main(argv) == 6  # no capture route is left: the trace froze the branch, torch.export refuses it
    err = _one_line(capsys)
    assert f"trace: tracing froze Python values into the graph (1 TracerWarning(s) in your code): {path}:{line}: " \
        "Converting a tensor to a Python boolean" in err, err  # fmt: skip
    assert not (tmp_path / "out" / "model.onnx").exists()


COUNTED = BAKED.replace("b = int(y.shape[0])", "b = int((y > 0).sum())").replace(
    "return self.fc(y.reshape(b, -1))", "return self.fc(y.reshape(y.shape[0], -1)) * b"
)


def test_a_frozen_count_is_named_with_the_fix_for_values(tmp_path: Path, monkeypatch, capsys) -> None:
    name = f"counted_{uuid.uuid4().hex[:8]}"
    path = tmp_path / f"{name}.py"
    path.write_text(COUNTED)
    line = COUNTED.splitlines().index("        b = int((y > 0).sum())") + 1
    monkeypatch.chdir(tmp_path)
    assert main(_argv(tmp_path, name, "--exporter", "torchscript", "--capture", "script")) == 6
    err = _one_line(capsys)
    # wrong at every probe input, the example's own sizes too: the line, not a dim, is named
    assert f"{path}:{line} freezes a Python value into the graph (`b = int((y > 0).sum())`: " in err, err
    assert "values computed from tensors (a count, a maximum) as tensors" in err and "failed too" not in err


THIRDS = textwrap.dedent(
    """
    from torch import nn


    class Thirds(nn.Module):
        def forward(self, x):
            return x // 3  # floor division; the TorchScript exporter's Div truncates negatives toward zero


    def build():
        return Thirds()
    """
)


def test_values_wrong_at_the_examples_own_sizes_blame_an_op_not_a_dim(tmp_path: Path, monkeypatch, capsys) -> None:
    name = f"thirds_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(THIRDS)
    (tmp_path / "deploy.toml").write_text(
        f'outputs = ["y"]\n[model]\nfactory = "{name}:build"\n'
        '[[inputs]]\nname = "x"\nshape = ["batch", 8]\ndtype = "int64"\nrange = [-10, 10]\n'
        "[dims.batch]\nmin = 1\nopt = 2\nmax = 4\n[validate]\nsamples = 1\nlatency_iters = 1\n"
    )
    monkeypatch.chdir(tmp_path)
    argv = ["build", "-c", str(tmp_path / "deploy.toml"), "--out", str(tmp_path / "out")]
    code = main([*argv, "--exporter", "torchscript"])
    err = _one_line(capsys)
    assert code == 6, err
    assert "computes other values than PyTorch at the example's own sizes (opt), so no dynamic dim is at fault" in err
    assert "across dynamic dim" not in err and "try export.exporter = 'dynamo'" in err
    assert main([*argv, "--exporter", "dynamo"]) == 0  # the fix it names


SCALED = textwrap.dedent(
    """
    import math

    from torch import nn


    class Scaled(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 8)

        def forward(self, x):
            return self.fc(x) / math.sqrt(x.size(DIM))
    """
)


def _scaled_project(tmp_path: Path, dim: int) -> Path:
    name = f"scaled_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(SCALED.replace("DIM", str(dim)) + "\n\ndef build():\n    return Scaled()\n")
    (tmp_path / "deploy.toml").write_text(
        f'outputs = ["y"]\n[model]\nfactory = "{name}:build"\n[export]\nexporter = "torchscript"\n'
        '[[inputs]]\nname = "x"\nshape = ["batch", "seq", 8]\n[dims.batch]\nmin = 1\nopt = 2\nmax = 3\n'
        "[dims.seq]\nmin = 4\nopt = 8\nmax = 16\n[validate]\nsamples = 1\nlatency_iters = 1\n"
    )
    return tmp_path / "deploy.toml"


def test_a_frozen_static_size_passes_with_a_warning(tmp_path: Path, monkeypatch) -> None:
    """The attention scaling idiom on a static dim freezes a number the probes check everywhere: not a failure."""
    monkeypatch.chdir(tmp_path)
    cfg = _scaled_project(tmp_path, -1)
    assert main(["build", "-c", str(cfg), "--out", str(tmp_path / "out")]) == 0
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert any("froze a Python value at" in w and "(a number)" in w for w in report["warnings"]), report["warnings"]


def test_a_frozen_dynamic_size_names_the_dim_with_the_edge_probe_on(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    cfg = _scaled_project(tmp_path, 1)
    assert main(["build", "-c", str(cfg), "--out", str(tmp_path / "out")]) == 6
    err = _one_line(capsys)
    assert "freezes a tensor size into the graph as a Python number" in err, err
    assert "works only at the example's size of dim(s) 'seq'" in err and "fail_on_tracer_warnings" not in err
    assert "fix: write `x.size(1) ** 0.5` instead of `math.sqrt(x.size(1))`" in err
    source = (tmp_path / "deploy.toml").read_text().split('factory = "')[1].split(":")[0] + ".py"
    (tmp_path / source).write_text((tmp_path / source).read_text().replace("math.sqrt(x.size(1))", "x.size(1) ** 0.5"))
    assert main(["build", "-c", str(cfg), "--out", str(tmp_path / "out")]) == 0  # the fix, as written

"""Every module imports with the optional heavy dependencies absent (they are imported lazily)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

BLOCKED = (
    "tensorrt", "onnxruntime", "torch2trt", "torch_tensorrt", "pycuda", "lightning", "pytorch_lightning",
    "transformers", "tokenizers", "webdataset", "tensorboard", "torchviz", "paramiko",
)  # fmt: skip


def test_every_module_imports_without_optional_dependencies():
    script = textwrap.dedent(
        f"""
        import importlib, importlib.abc, pkgutil, sys

        BLOCKED = {BLOCKED!r}

        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in BLOCKED:
                    raise ImportError(f"blocked optional dependency {{name}}")
                return None

        sys.meta_path.insert(0, Block())
        import edgedeploy
        names = [m.name for m in pkgutil.walk_packages(edgedeploy.__path__, "edgedeploy.")
                 if not m.name.endswith("__main__")]
        for name in names:
            importlib.import_module(name)
        leaked = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
        assert not leaked, leaked
        print(len(names))
        """
    )
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert int(res.stdout.strip().splitlines()[-1]) >= 20


def test_cli_parser_builds_without_optional_dependencies():
    script = "import sys; sys.modules['onnxruntime'] = None; sys.modules['tensorrt'] = None\n" + (
        "from edgedeploy.cli import build_parser; build_parser().parse_args(['targets'])"
    )
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]

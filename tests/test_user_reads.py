"""Files the user's code reads while it runs (a factory loading its own weights, a calibration callable reading its
samples) key the stage cache like its source files: a retrained ``weights.pt`` is exported, never the old one."""

from __future__ import annotations

import json
import textwrap
import uuid
from pathlib import Path

import numpy as np
import pytest

from edgedeploy.cli import main
from edgedeploy.modelio import reads

WEIGHTS_MODEL = textwrap.dedent(
    """
    import torch
    from torch import nn


    def build():
        net = nn.Linear(8, 4)
        net.load_state_dict(torch.load("weights.pt"))
        return net
    """
)


@pytest.fixture
def cache(test_cache: Path) -> Path:
    return test_cache


def _stages(out: Path) -> dict[str, str]:
    return {s["name"]: s["status"] for s in json.loads((out / "report.json").read_text())["stages"]}


def _save_weights(folder: Path, seed: int) -> np.ndarray:
    import torch

    torch.manual_seed(seed)
    state = torch.nn.Linear(8, 4).state_dict()
    torch.save(state, folder / "weights.pt")
    return state["weight"].numpy()


def _exported_weight(out: Path) -> np.ndarray:
    import onnx
    from onnx import numpy_helper

    arrays = [numpy_helper.to_array(t) for t in onnx.load(str(out / "model.onnx")).graph.initializer]
    return next(a for a in arrays if a.size == 32)


def test_weights_the_factory_loads_itself_key_the_cache(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    name = f"wnet_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(WEIGHTS_MODEL)
    monkeypatch.chdir(tmp_path)
    first = _save_weights(tmp_path, 0)
    out = tmp_path / "out"
    argv = ["build", "--factory", f"{name}:build", "--input", "x:batchx8", "--dim", "batch=1:2:4", "--output", "y",
            "--samples", "1", "--latency-iters", "1", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    assert "read files the cache keys did not hold yet (weights.pt)" in capsys.readouterr().err
    assert main(argv) == 0 and _stages(out)["export"] == "ran"  # the first build's key lacked weights.pt: not stored
    assert main(argv) == 0 and _stages(out)["export"] == "cached"
    exported = _exported_weight(out)
    assert np.allclose(exported.reshape(first.shape), first) or np.allclose(exported.T, first)
    retrained = _save_weights(tmp_path, 1)  # the same file, new weights
    for memo in cache.rglob("reads-*.json"):  # a lost memo: the key misses weights.pt, and no such entry exists
        memo.unlink()
    assert main(argv) == 0
    assert {_stages(out)[s] for s in ("reference", "capture", "export", "validate")} == {"ran"}
    exported = _exported_weight(out)
    assert np.allclose(exported.reshape(retrained.shape), retrained) or np.allclose(exported.T, retrained)
    model_code = json.loads((out / "manifest.json").read_text())["inputs"]["model_code"]
    assert model_code["reads"] == [{"path": str(tmp_path / "weights.pt"), "state": model_code["reads"][0]["state"]}]
    assert model_code["reads"][0]["state"].startswith("file:")


CALIB_FROM_FILE = textwrap.dedent(
    """
    import numpy as np


    def batches():
        data = np.load("samples.npy")
        for i in range(0, len(data), 2):
            yield {"image": data[i : i + 2]}
    """
)


def test_samples_a_calibration_callable_reads_key_precision(tmp_path: Path, cache: Path, monkeypatch) -> None:
    from conftest import TINY_TOML, write_tiny_project

    calib = f"calib_{uuid.uuid4().hex[:8]}"
    model = f"tinynet_{uuid.uuid4().hex[:8]}"
    toml = TINY_TOML.replace("tinynet:build", f"{model}:build")
    cfg = write_tiny_project(
        tmp_path, toml=toml + f'\n[precision]\nmode = "int8"\ncalib_callable = "{calib}:batches"\n'
    )
    (tmp_path / "tinynet.py").rename(tmp_path / f"{model}.py")
    (tmp_path / f"{calib}.py").write_text(CALIB_FROM_FILE)
    monkeypatch.chdir(tmp_path)
    rng = np.random.default_rng(0)
    np.save(tmp_path / "samples.npy", rng.uniform(-1, 1, (8, 3, 16, 16)).astype(np.float32))
    build = ["build", "--config", str(cfg)]
    out = tmp_path / "out"
    assert main(build) == 0 and main(build) == 0
    for _ in range(3):  # a cached build imports the callable's module but does not run it: what it read stays keyed
        assert main(build) == 0 and _stages(out)["precision"] == "cached" and _stages(out)["reference"] == "cached"
    first = json.loads((out / "precision.json").read_text())["calibration"]["data_sha256"]
    np.save(tmp_path / "samples.npy", rng.uniform(-0.5, 0.5, (8, 3, 16, 16)).astype(np.float32))
    assert main(build) == 0
    assert _stages(out)["precision"] == "ran" and _stages(out)["export"] == "cached"  # the model did not change
    assert json.loads((out / "precision.json").read_text())["calibration"]["data_sha256"] != first


def test_what_user_code_reads_is_recorded_and_what_imports_or_it_writes_is_not(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "config.yaml").write_text("width: 8\n")
    (tmp_path / "ckpts").mkdir()
    log = reads.ReadLog()
    with reads.building(log):
        with reads.recording("model_code", runs=True):
            Path("config.yaml").read_text()
            sorted((tmp_path / "ckpts").glob("*.pt"))  # the newest checkpoint: the listing is what was read
            try:
                open("optional.json").close()  # absent: what the code saw
            except FileNotFoundError:
                pass
            Path("scratch.bin").write_bytes(b"x")  # its own product, read back: not an input
            Path("scratch.bin").read_bytes()
            import json as _json  # noqa: F401  (the import system's own reads are not the code's)
        Path("after.txt").write_text("not recorded")
        Path("after.txt").read_text()  # outside the user code's run
    got = [p.name for p in log.of("model_code")]
    assert got == ["config.yaml", "ckpts", "optional.json"], got
    assert log.ran == {"model_code"}
    assert reads.path_state(tmp_path / "optional.json") == "absent"
    before = reads.path_state(tmp_path / "ckpts")
    (tmp_path / "ckpts" / "epoch9.pt").write_bytes(b"")
    assert reads.path_state(tmp_path / "ckpts") != before and before.startswith("folder:")


THREADED_AND_SAFETENSORS = textwrap.dedent(
    """
    from concurrent.futures import ThreadPoolExecutor

    import torch
    from safetensors.torch import load_file
    from torch import nn


    def build():
        net = nn.Linear(8, 4)
        with ThreadPoolExecutor(2) as pool:  # a loader pool: no frame of this file on the worker's stack
            state = pool.submit(torch.load, "weights.pt").result()
        net.load_state_dict(state)
        net.bias.data += load_file("extra.safetensors")["bias"]  # opened by native code, no audit event
        return net
    """
)


def _built_three_times(folder: Path, source: str) -> tuple[list[str], Path, set[str]]:
    """Build the factory in ``source`` (written to ``folder``, the cwd) three times: the first records what its code
    read, the second stores the entry, the third is cached. Returns the argv, the output folder and the names of the
    files the code read (manifest.json)."""
    name = f"rnet_{uuid.uuid4().hex[:8]}"
    (folder / f"{name}.py").write_text(source)
    out = folder / "out"
    argv = ["build", "--factory", f"{name}:build", "--input", "x:batchx8", "--dim", "batch=1:2:4", "--output", "y",
            "--samples", "1", "--latency-iters", "1", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0 and main(argv) == 0 and main(argv) == 0
    assert _stages(out)["export"] == "cached"
    reads_ = json.loads((out / "manifest.json").read_text())["inputs"]["model_code"]["reads"]
    return argv, out, {Path(r["path"]).name for r in reads_}


def test_reads_by_a_loader_thread_and_by_safetensors_key_the_cache(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch
    from safetensors.torch import save_file

    monkeypatch.chdir(tmp_path)
    _save_weights(tmp_path, 0)
    save_file({"bias": torch.zeros(4)}, str(tmp_path / "extra.safetensors"))
    argv, out, read = _built_three_times(tmp_path, THREADED_AND_SAFETENSORS)
    assert {"weights.pt", "extra.safetensors"} <= read
    _save_weights(tmp_path, 1)
    assert main(argv) == 0 and _stages(out)["export"] == "ran"
    assert main(argv) == 0 and _stages(out)["export"] == "cached"
    save_file({"bias": torch.ones(4)}, str(tmp_path / "extra.safetensors"))
    assert main(argv) == 0 and _stages(out)["export"] == "ran"


def test_the_hook_never_fails_an_open_in_another_thread(tmp_path: Path) -> None:
    """Recording starts and ends while another thread opens files: that thread's open() never sees an error."""
    import threading

    (tmp_path / "f.txt").write_text("x")
    errors: list[BaseException] = []
    stop = threading.Event()

    def reader() -> None:
        while not stop.is_set():
            try:
                (tmp_path / "f.txt").read_text()
            except BaseException as exc:  # any error is the defect
                errors.append(exc)

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for _ in range(2000):
            with reads.building(reads.ReadLog()), reads.recording("model_code", runs=True):
                pass
    finally:
        stop.set()
        thread.join()
    assert errors == []


NATIVE_READS = textwrap.dedent(
    """
    import torch
    from torch import nn


    def build():
        import torchvision.io  # imported as the factory runs: its reader is watched from its import on

        net = nn.Linear(8, 4)
        net.load_state_dict(torch.jit.load("weights.ts").state_dict())  # TorchScript's C++ reader
        net.bias.data += torchvision.io.read_image("bias.png")[0, 0, :4].float()  # torchvision's C++ reader
        return net
    """
)


def _write_native_inputs(folder: Path, seed: int) -> None:
    import torch
    from PIL import Image

    torch.manual_seed(seed)
    torch.jit.script(torch.nn.Linear(8, 4)).save(str(folder / "weights.ts"))
    pixels = np.full((2, 4, 3), seed, dtype=np.uint8)
    Image.fromarray(pixels).save(folder / "bias.png")


def test_files_read_by_native_readers_key_the_cache(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    _write_native_inputs(tmp_path, 0)
    argv, out, read = _built_three_times(tmp_path, NATIVE_READS)
    assert {"weights.ts", "bias.png"} <= read
    bias = _exported_bias(out)
    (tmp_path / "bias.png").unlink()
    _write_native_inputs(tmp_path, 3)  # new weights and a bias image 3 higher
    assert main(argv) == 0 and _stages(out)["export"] == "ran"
    assert not np.allclose(_exported_bias(out), bias)
    assert main(argv) == 0 and _stages(out)["export"] == "cached"


def _exported_bias(out: Path) -> np.ndarray:
    import onnx
    from onnx import numpy_helper

    arrays = [numpy_helper.to_array(t) for t in onnx.load(str(out / "model.onnx")).graph.initializer]
    return next(a for a in arrays if a.shape == (4,))


NATIVE_PROBE = textwrap.dedent(
    """
    import json, sys
    from edgedeploy.modelio import reads

    image, weights = sys.argv[1], sys.argv[2]
    loaded_before = "torchvision" in sys.modules or "torch" in sys.modules
    log = reads.ReadLog()
    with reads.building(log):
        with reads.recording("calib_code", runs=True):
            import torch  # not loaded before: its readers are wrapped once it has run
            import torchvision.io

            torchvision.io.read_image(image)
            torch.jit.load(weights)
        outside = torchvision.io.read_image(image)  # after the recording: read as before, recorded nowhere
    print(json.dumps({"read": [str(p) for p in log.of("calib_code")], "outside_ok": outside.shape[0] == 3,
                      "loaded_before": loaded_before}))
    """
)


def test_a_native_reader_imported_while_user_code_runs_is_recorded_and_stays_transparent(tmp_path: Path) -> None:
    import subprocess
    import sys

    import torch
    from PIL import Image

    Image.fromarray(np.zeros((2, 2, 3), dtype=np.uint8)).save(tmp_path / "a.png")
    torch.jit.script(torch.nn.Linear(2, 2)).save(str(tmp_path / "w.ts"))
    proc = subprocess.run(
        [sys.executable, "-c", NATIVE_PROBE, str(tmp_path / "a.png"), str(tmp_path / "w.ts")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not got["loaded_before"]
    assert got["read"] == [str(tmp_path / "a.png"), str(tmp_path / "w.ts")]
    assert got["outside_ok"]

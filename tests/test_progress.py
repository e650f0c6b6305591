"""What a build shows while it runs: a live line on terminals, plain lines in logs, native chatter in build.log,
the INT8 search as "try k of N, best so far, why still searching", and the global -q / -v / --log-file."""

from __future__ import annotations

import io
import re
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from edgedeploy.cli import main
from edgedeploy.pipeline.progress import BuildConsole
from edgedeploy.pipeline.quiet import StageNoise
from edgedeploy.precision.search_progress import SearchProgress

ANSI = re.compile(r"\x1b\[")


def test_plain_console_prints_status_as_lines_and_heartbeats() -> None:
    stream = io.StringIO()
    console = BuildConsole(stream, live=False, heartbeat_s=0.2)
    with console.stage(2, 7, "export"):
        console.status("exporting with dynamo")
        time.sleep(0.7)  # silent past the heartbeat interval: a "still running" line, not silence
    console.line("[2/7] export     ran")
    console.close()
    text = stream.getvalue()
    assert not ANSI.search(text)  # CI logs get plain lines
    lines = text.splitlines()
    assert lines[0] == "  exporting with dynamo"
    assert any(re.fullmatch(r"  export still running \(\d+s\)", line) for line in lines)
    assert lines[-1] == "[2/7] export     ran"


def test_live_console_draws_the_stage_and_its_status_then_only_the_result_stays() -> None:
    stream = io.StringIO()
    console = BuildConsole(stream, live=True)
    with console.stage(5, 7, "precision"):
        console.status("INT8 search: try 3 of at most 17")
        console.line("  a line the stage logs")
        time.sleep(0.3)
    console.line("[5/7] precision  ran")
    console.close()
    text = stream.getvalue()
    assert ANSI.search(text)  # redrawn in place
    assert "[5/7] precision" in text and "INT8 search: try 3 of at most 17" in text
    assert "  a line the stage logs" in text and text.rstrip().endswith("[5/7] precision  ran")


def test_quiet_console_keeps_warnings_and_the_log_file_keeps_everything(tmp_path: Path) -> None:
    stream = io.StringIO()
    log = tmp_path / "logs" / "build.txt"
    console = BuildConsole(stream, quiet=True, live=False, log_file=log)
    with console.stage(1, 1, "reference"):
        console.status("running PyTorch on 12 batches")
    console.line("[1/1] reference  ran")
    console.line("  warning: no model.checkpoint")
    console.record("[reference] \x1b[0;93mnative message\x1b[m")
    console.close()
    assert stream.getvalue() == "  warning: no model.checkpoint\n"
    assert log.read_text().splitlines() == [
        "  running PyTorch on 12 batches",
        "[1/1] reference  ran",
        "  warning: no model.checkpoint",
        "[reference] native message",
    ]


def _model_with_unused_initializer(path: Path) -> Path:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    unused = numpy_helper.from_array(np.ones(4, np.float32), "left_over_weight")
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y], [unused])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def test_native_onnxruntime_warnings_go_to_build_log_not_the_console(tmp_path: Path, capfd) -> None:
    import onnxruntime as ort

    model = _model_with_unused_initializer(tmp_path / "m.onnx")
    heard = StageNoise("precision")
    opts = ort.SessionOptions()
    opts.log_severity_level = 2  # warnings, whatever another library set as the process default (onnxslim: 3)
    with heard:
        ort.InferenceSession(str(model), opts, providers=["CPUExecutionProvider"])
    out, err = capfd.readouterr()
    assert "left_over_weight" not in out + err  # written by C++ to fd 2, still not on the console
    native = [line for line in heard.lines if "left_over_weight" in line]
    assert native and "Removing initializer" in native[0]
    assert not any(ANSI.search(line) for line in heard.lines)  # ONNX Runtime colours it; build.log gets text


def test_search_progress_says_try_k_of_n_best_so_far_and_why() -> None:
    said: list[str] = []
    progress = SearchProgress(max_tries=4, target=0.95, status=said.append)
    rows = [
        {"try": 0, "float_nodes": 0, "score": 0.90, "metric": "top1_agreement", "met": False},
        {"try": 1, "float_nodes": 1, "score": 0.93, "metric": "top1_agreement", "met": False, "family": "sensitivity"},
        {"try": 2, "float_nodes": 2, "score": 0.97, "metric": "top1_agreement", "met": True, "family": "sensitivity"},
        {"try": 3, "float_nodes": 1, "score": 0.96, "metric": "top1_agreement", "met": False, "family": "prefix",
         "vetoed": "golden opt logits fails tolerance.int8"},
        {"try": 4, "float_nodes": 3, "score": 0.98, "metric": "top1_agreement", "met": True, "family": "prefix"},
    ]  # fmt: skip
    for row in rows:
        progress(row, Path("unused.onnx"))
    # numbered as precision.json's rows: try 0 is everything INT8, then fallback tries 1 .. max_tries
    assert said[0].startswith("INT8 search: try 0 (everything INT8), 0 float nodes: top1_agreement 0.9000 misses")
    assert said[0].endswith("best so far 0.9000 (0 float); still searching: below 0.95, more layers to float")
    assert "try 1 of at most 4" in said[1] and "best so far 0.9300 (1 float)" in said[1]
    assert said[2].endswith("meets; best so far 2 float (0.9700); looking for fewer or faster float nodes")
    assert "vetoed by the goldens" in said[3]
    assert said[4].endswith("best so far 2 float (0.9700); try budget spent")
    shipped = progress.summary(rows[2])
    assert shipped == (
        "INT8 search: 5 tries, 2 meeting the target 0.95; ships try 2: 2 float nodes (sensitivity), "
        "top1_agreement 0.9700"
    )


def test_quiet_build_prints_the_verdict_and_log_file_gets_the_stage_lines(
    tiny_project: Path, tmp_path: Path, capsys
) -> None:
    log = tmp_path / "build.txt"
    out = tmp_path / "out"
    assert main(["-q", "build", "--config", str(tiny_project), "--out", str(out), "--log-file", str(log)]) == 0
    captured = capsys.readouterr()
    assert "[1/" not in captured.err and "backend" not in captured.out  # no stage lines, no table
    assert captured.out.strip().startswith("PASSED: target cpu")
    logged = log.read_text()
    assert "deploy build: target=cpu" in logged and re.search(r"\[\d/\d\] validate +ran", logged)


def test_plain_console_shows_ticks_now_and_then_and_every_milestone() -> None:
    stream = io.StringIO()
    console = BuildConsole(stream, live=False, heartbeat_s=60)
    with console.stage(1, 3, "reference"):
        for k in range(1, 65):
            console.status(f"PyTorch reference outputs: batch {k} of 64", tick=True)
        console.status("exporting with the dynamo exporter, opset 18")
    console.close()
    assert stream.getvalue().splitlines() == [
        "  PyTorch reference outputs: batch 1 of 64",  # the first tick; the next 63 within a minute are not logged
        "  exporting with the dynamo exporter, opset 18",
    ]


def test_output_flags_work_before_and_after_the_command() -> None:
    from edgedeploy.cli import build_parser

    parser = build_parser()
    for argv in (["-q", "--log-file", "b.txt", "build"], ["build", "-q", "--log-file", "b.txt"]):
        args = parser.parse_args(argv)
        assert (args.quiet, args.verbose, args.log_file) == (True, False, "b.txt"), argv
    assert parser.parse_args(["-v", "build"]).verbose and parser.parse_args(["build", "-v"]).verbose
    assert not parser.parse_args(["build"]).verbose


def test_a_native_crash_inside_a_stage_still_reaches_the_console() -> None:
    """fd 2 goes to a temporary file while a stage runs; a segfault's report must not die with it."""
    import subprocess
    import sys

    script = (
        "import ctypes\nfrom edgedeploy.pipeline.quiet import StageNoise\n"
        "with StageNoise('precision'):\n    print('library chatter')\n    ctypes.string_at(0)\n"
    )
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert res.returncode != 0
    assert "Fatal Python error: Segmentation fault" in res.stderr and "library chatter" not in res.stderr


def test_the_log_file_of_a_failed_build_ends_with_the_error(tiny_project: Path, tmp_path: Path, capsys) -> None:
    from edgedeploy.errors import InputError

    log = tmp_path / "build.txt"
    argv = ["build", "--config", str(tiny_project), "--checkpoint", str(tmp_path / "gone.safetensors")]
    assert main([*argv, "--log-file", str(log)]) == InputError.exit_code
    assert "checkpoint not found" in capsys.readouterr().err
    last = log.read_text().splitlines()[-1]
    assert last.startswith("deploy: input error: checkpoint not found")
    assert last.endswith(f"(exit {InputError.exit_code})")

"""Flags generated from the config schema: switches, every field reachable, --set, and fixes that name real flags."""

from __future__ import annotations

import ast
import dataclasses
import re
import typing
from pathlib import Path

import pytest

from edgedeploy.cli import build_parser, main
from edgedeploy.commands._common import config_from_args
from edgedeploy.config import DeployConfig
from edgedeploy.config_flags import FLAG_SECTIONS, flag_fields
from edgedeploy.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent
BASE = ["build", "--factory", "m:build", "--input", "x:1x3x8x8"]


def _cfg(*flags: str) -> DeployConfig:
    return config_from_args(build_parser().parse_args([*BASE, *flags]))


def test_booleans_are_switches_with_a_no_form() -> None:
    cfg = _cfg("--no-simplify", "--no-cache", "--trust-checkpoint-code", "--no-float-when-faster", "--no-equalize")
    assert cfg.export.simplify is False and cfg.build.cache is False
    assert cfg.model.trust_sidecar_code is True and cfg.precision.float_when_faster is False
    assert cfg.precision.equalize is False
    cfg = _cfg("--simplify", "--equalize", "--float-when-faster", "--reduce-range")
    assert cfg.export.simplify is True and cfg.precision.equalize is True and cfg.precision.float_when_faster is True
    assert cfg.precision.reduce_range is True
    defaults = _cfg()
    assert defaults.export.simplify is True and defaults.precision.equalize == "auto"  # absent: the config's value


def test_switches_still_take_a_value() -> None:
    cfg = _cfg("--simplify", "false", "--cache", "off", "--equalize", "auto", "--float-when-faster", "false")
    assert cfg.export.simplify is False and cfg.build.cache is False
    assert cfg.precision.equalize == "auto" and cfg.precision.float_when_faster is False
    with pytest.raises(ConfigError) as err:
        _cfg("--simplify", "maybe")
    assert re.search(r"flag --simplify: expected true/false.*--no-simplify alone", err.value.one_line())


def test_no_form_takes_no_value(capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args([*BASE, "--no-cache", "true"])
    assert exc.value.code == 2 and "--no-cache takes no value" in capsys.readouterr().err


def test_every_section_field_has_a_flag() -> None:
    hints = typing.get_type_hints(DeployConfig)
    every = {f"{s}.{f.name}" for s in FLAG_SECTIONS for f in dataclasses.fields(hints[s])}
    fields = flag_fields()
    assert {f.dotted for f in fields} == every
    flags = [f.flag for f in fields]
    assert len(set(flags)) == len(flags)
    options = {o for a in _build_actions() for o in a.option_strings}
    assert set(flags) <= options and {f.negative for f in fields if f.kind.startswith("bool")} <= options


def test_tuple_json_and_numeric_fields_from_flags() -> None:
    cfg = _cfg("--calib-resize", "224,160", "--keep-fp32", "a,b", "--kwargs", '{"classes": 3}', "--calib-samples",
               "16", "--accuracy-target", "0.9", "--calib-layout", "NHWC")  # fmt: skip
    assert cfg.precision.calib_resize == (224, 160) and cfg.precision.keep_fp32 == ("a", "b")
    assert cfg.model.kwargs == {"classes": 3} and cfg.precision.calib_samples == 16
    assert cfg.precision.accuracy_target == 0.9 and cfg.precision.calib_layout == "NHWC"
    assert _cfg("--calib-resize", "96x128").precision.calib_resize == (96, 128)
    with pytest.raises(ConfigError, match="flag --kwargs: expected a JSON object"):
        _cfg("--kwargs", "classes=3")


def test_choice_flag_names_the_flag_and_the_closest_choice() -> None:
    with pytest.raises(ConfigError) as err:
        _cfg("--precision", "int9")
    line = err.value.one_line()
    assert "flag --precision" in line and "precision.mode" in line and "did you mean --precision int8?" in line


def test_set_reaches_nested_keys_and_refuses_unknown_ones() -> None:
    nested = ["tolerance.int8.min_cosine=0.97", "gate.max_latency_ms=5", "dims.b={min=1,opt=2,max=3}"]
    cfg = _cfg("--input", "y:bx4", *[arg for text in nested for arg in ("--set", text)])
    assert cfg.tolerance_for("int8").min_cosine == 0.97 and cfg.gate is not None and cfg.gate.max_latency_ms == 5
    assert cfg.dims["b"].max == 3
    with pytest.raises(ConfigError) as err:
        _cfg("--set", "tolerance.int8.min_cosin=0.97")
    assert "did you mean tolerance.int8.min_cosine?" in err.value.one_line()
    with pytest.raises(ConfigError, match="expected KEY=VALUE"):
        _cfg("--set", "tolerance.int8.min_cosine")


def _build_actions(parser=None) -> list:
    """Every action of ``deploy`` and its subcommands, nested ones (``deploy cache prune``) included."""
    import argparse

    parser = parser or build_parser()
    actions = list(parser._actions)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):
                actions += _build_actions(sub)
    return actions


def test_every_flag_a_fix_names_exists() -> None:
    """Each ``--flag`` in a ``hint=`` (the fix an error prints) is an option of some ``deploy`` subcommand."""
    options = {o for a in _build_actions() for o in a.option_strings}
    missing = []
    for path in (ROOT / "edgedeploy").rglob("*.py"):
        if "device" in path.parts:  # complete_bundle.py runs on the device with its own flags
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.keyword) and node.arg == "hint":
                for const in ast.walk(node.value):
                    if isinstance(const, ast.Constant) and isinstance(const.value, str):
                        for flag in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", const.value):
                            if flag not in options:
                                missing.append(f"{path.relative_to(ROOT)}: {flag}")
    assert not missing, missing


def test_calib_resize_flag_is_the_fix_for_dynamic_image_size(tmp_path: Path, capsys) -> None:
    (tmp_path / "photos").mkdir()
    (tmp_path / "photos" / "a.png").write_bytes(b"not read before the refusal")
    code = main(["build", "--factory", "no_such_module_anywhere:build", "--input", "image:1x3xhxw",
                 "--dim", "h=8:16:32", "--dim", "w=8:16:32", "--precision", "int8", "--calib", str(tmp_path / "photos"),
                 "--out", str(tmp_path / "out")])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2, err
    assert "--calib-resize" in err[-1] and "dynamic height/width" in err[-1]
    assert not (tmp_path / "out").exists()


# ---- did you mean ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["build", "--traget", "cpu"], "deploy build: unknown flag --traget -- fix: did you mean --target?"),
        (["build", "--calib-resise=224,224"], "unknown flag --calib-resise -- fix: did you mean --calib-resize?"),
        (["cache", "prune", "--max-szie", "1G"], "unknown flag --max-szie -- fix: did you mean --max-size?"),
        (["build", "--no-simplfy"], "did you mean --no-simplify?"),
        # another command's flag is named as such, not matched to a look-alike (--factory is not --dla-core)
        (["check", "-c", "d.toml", "--factory", "m:b"], "unknown flag --factory: it is a flag of deploy build"),
        (["check", "-c", "d.toml", "--opset", "13"], "unknown flag --opset: it is a flag of deploy build --"),
        (["check", "-c", "d.toml", "--targte", "cpu"], "unknown flag --targte -- fix: did you mean --target?"),
    ],
)
def test_mistyped_flag_names_the_closest_one(capsys, argv: list[str], needle: str) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and needle in err


def test_mistyped_subcommand_names_the_closest_one(capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["biuld"])
    assert exc.value.code == 2 and "did you mean 'build'?" in capsys.readouterr().err


def test_mistyped_choice_names_the_closest_one(capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["check", "--onnx", "m.onnx", "--precision", "int9"])
    assert exc.value.code == 2 and "did you mean 'int8'?" in capsys.readouterr().err


def test_a_bad_value_given_by_a_flag_is_blamed_on_that_flag_not_the_file(tiny_project: Path, capsys) -> None:
    for argv, needle in (
        (["--dim", "batch=8:4:1"], "deploy.toml, as overridden by dims.batch: key 'dims.batch' needs 1 <= min"),
        (["--dim", "batch=8:4:1"], "fix: order them: [dims.batch] min = 1, opt = 4, max = 8 (--dim batch=1:4:8)"),
        (["--set", 'validate.samples="3"'], "must be an integer, got '3' -- fix: drop the quotes: samples = 3"),
        (["--set", "validate.samples=two"], "fix: set samples to a whole number, e.g. samples = 1"),
        (["--set", "tolerance.fp32.atol=abc"], "as overridden by tolerance.fp32.atol: key 'tolerance.fp32.atol'"),
        (["--calib-samples=-3"], "as overridden by --calib-samples (precision.calib_samples): key 'precision.calib_"),
    ):
        assert main(["build", "-c", str(tiny_project), *argv]) == 2
        assert needle in capsys.readouterr().err
    module = next(tiny_project.parent.glob("tinynet_*.py")).stem
    assert main(["build", "-c", str(tiny_project), "--factory", f"{module}:biuld"]) == 2
    assert f"did you mean {module}:build?" in capsys.readouterr().err


def test_mistyped_target_names_the_closest_profile(capsys, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # the default --out is build/<name> under the working folder: keep it out of the repo
    assert main([*BASE, "--target", "jetson-orin-nan"]) == 2
    assert "did you mean 'jetson-orin-nano'" in capsys.readouterr().err


def test_api_keyword_typo_blames_the_keyword_not_the_config(tiny_project: Path) -> None:
    import edgedeploy

    cfg = edgedeploy.load_config(tiny_project)
    for call in (
        lambda: edgedeploy.build(cfg, target="cpu"),
        lambda: edgedeploy.build(tiny_project, target="cpu"),
        lambda: edgedeploy.load_config(tiny_project, target="cpu"),
    ):
        with pytest.raises(ConfigError) as err:
            call()
        line = err.value.one_line()
        assert "unknown keyword 'target'" in line and "did you mean build__target?" in line
        assert str(tiny_project) not in line and "deploy.toml" not in line
    with pytest.raises(ConfigError) as err:
        edgedeploy.build(cfg, precison__mode="int8")
    assert "did you mean precision__mode?" in err.value.one_line()
    assert not (tiny_project.parent / "out").exists()


def test_api_keyword_paths_are_the_callers_like_path_flags(tiny_project: Path, tmp_path: Path, monkeypatch) -> None:
    import edgedeploy

    caller = tmp_path / "caller"
    caller.mkdir()
    monkeypatch.chdir(caller)
    cfg = edgedeploy.load_config(tiny_project, build__out="build/r18", build__target="cpu")
    assert Path(cfg.build.out) == caller / "build" / "r18"  # not beside the config file
    assert cfg.build.target == "cpu"  # other keywords pass through untouched


def test_generate_key_creates_its_folder_and_refuses_to_overwrite(tmp_path: Path, capsys) -> None:
    prefix = tmp_path / "keys" / "release"
    assert main(["sign", "--generate-key", str(prefix)]) == 0
    assert (tmp_path / "keys" / "release.key").stat().st_mode & 0o077 == 0
    assert (tmp_path / "keys" / "release.pub").is_file()
    assert main(["sign", "--generate-key", str(prefix)]) == 3
    assert "choose another --generate-key PREFIX" in capsys.readouterr().err
    (tmp_path / "file").write_text("")
    assert main(["sign", "--generate-key", str(tmp_path / "file" / "release")]) == 3  # a file where a folder goes
    assert "cannot write the key pair" in capsys.readouterr().err


def test_field_types_a_new_key_may_use_get_a_flag() -> None:
    """A key added later with a number-or-word or a list-of-numbers type gets a working flag too."""
    from typing import Literal

    from edgedeploy.config_flags import FlagField, _kind, parse_flag_value

    kind, words = _kind(int | Literal["auto"])  # type: ignore[misc]
    number_or_auto = FlagField("--n", "s.n", int | Literal["auto"], "", kind=kind, choices=words)
    assert parse_flag_value(number_or_auto, "auto") == "auto" and parse_flag_value(number_or_auto, "3") == 3
    kind, words = _kind(tuple[float, ...])  # type: ignore[misc]
    floats = FlagField("--f", "s.f", tuple[float, ...], "", kind=kind, choices=words)
    assert parse_flag_value(floats, "0.5,1.5") == [0.5, 1.5]
    with pytest.raises(ConfigError, match="expected numbers"):
        parse_flag_value(floats, "a,b")


NET = """
import torch


def build():
    return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(144, 5))
"""


def test_a_factory_without_checkpoint_gives_the_same_weights_to_every_stage(tmp_path: Path, monkeypatch) -> None:
    """No checkpoint: the factory's random initial weights are the model's. They come from a fixed seed, so a
    rebuild that runs some stages again and restores others from the cache still compares one model with itself
    (a different flag here reruns capture and what follows; the reference stage is restored)."""
    import torch

    from edgedeploy.modelio.checkpoint import build_model

    module = f"randnet_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{module}.py").write_text(NET)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    cfg = _cfg_for(f"{module}:build")
    first, second = build_model(cfg), build_model(cfg)
    assert torch.equal(first[0].weight, second[0].weight)
    assert torch.equal(torch.rand(1), before)  # the caller's random stream is left where it was
    base = ["build", "--factory", f"{module}:build", "--input", "x:1x3x8x8", "--target", "cpu"]
    assert main([*base, "--out", str(tmp_path / "a")]) == 0
    assert main([*base, "--out", str(tmp_path / "b"), "--capture", "export"]) == 0


def _cfg_for(factory: str) -> DeployConfig:
    return config_from_args(build_parser().parse_args(["build", "--factory", factory, "--input", "x:1x3x8x8"]))


def test_a_bad_flag_value_is_blamed_on_the_flag_typed(tiny_project: Path, capsys) -> None:
    assert main(["build", "-c", str(tiny_project), "--samples", "0"]) == 2
    err = capsys.readouterr().err
    assert "as overridden by --samples (validate.samples): key 'validate.samples' = 0" in err
    assert main(["build", "-c", str(tiny_project), "--set", "validate.samples=0"]) == 2
    err = capsys.readouterr().err  # --set names the key itself: that is what was typed
    assert "as overridden by validate.samples: key 'validate.samples' = 0" in err


def test_a_key_given_by_its_flag_and_by_set_is_refused() -> None:
    """Which of two values was meant cannot be known: ``--out A --set build.out=B`` built into B silently."""
    with pytest.raises(ConfigError) as err:
        _cfg("--samples", "2", "--set", "validate.samples=3")
    assert "validate.samples is given twice: --samples 2 and --set validate.samples=3" in err.value.one_line()
    assert _cfg("--samples", "2", "--set", "validate.samples=2").validate.samples == 2  # the same value: one answer

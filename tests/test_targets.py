"""Target profiles: published facts, capability errors (never a silent downgrade), user profile files."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from edgedeploy.cli import main
from edgedeploy.errors import ConfigError, TargetCapabilityError
from edgedeploy.targets import all_targets, get_target, load_target_file


@pytest.mark.parametrize(
    ("name", "jetpack", "trt", "cuda", "sm", "dla", "opset", "python"),
    [
        ("jetson-orin", "6.2", "10.3", "12.6", "8.7", 2, 20, "3.10"),
        ("jetson-orin-nano", "6.2", "10.3", "12.6", "8.7", 0, 20, "3.10"),
        ("jetson-xavier", "5.1", "8.5", "11.4", "7.2", 2, 17, "3.8"),
        ("jetson-nano", "4.6.1", "8.2", "10.2", "5.3", 0, 13, "3.6"),
    ],
)
def test_jetson_profiles_match_jetpack_release_notes(name, jetpack, trt, cuda, sm, dla, opset, python):
    t = get_target(name)
    assert (t.jetpack, t.trt_version, t.cuda_version, t.sm, t.dla_cores, t.max_opset, t.device_python) == (
        jetpack,
        trt,
        cuda,
        sm,
        dla,
        opset,
        python,
    )
    assert t.arch == "aarch64" and t.runtime == "tensorrt" and not t.builds_here
    assert 0 < t.workspace_mib <= t.memory_mib


def test_trt11_desktop_is_strongly_typed_only_and_cpu_builds_here():
    t11, t10, cpu = get_target("desktop-trt11"), get_target("desktop"), get_target("cpu")
    assert t11.strongly_typed_only and not t11.implicit_int8 and t11.trt_major == 11
    assert not t10.implicit_int8 and t10.explicit_int8_only and not t10.strongly_typed_only and t10.strongly_typed
    assert get_target("jetson-xavier").implicit_int8 and not get_target("jetson-xavier").explicit_int8_only
    assert not get_target("jetson-xavier").strongly_typed  # TensorRT 8.5: no strongly typed networks
    assert cpu.builds_here and cpu.trt_major == 0
    for t in all_targets().values():
        assert t.problems() == [], t.name
        assert {"trt_version", "max_opset"} <= set(t.capabilities())  # read by the operator tables


def test_int8_on_jetson_nano_is_a_capability_error_not_a_downgrade():
    nano = get_target("jetson-nano")
    with pytest.raises(TargetCapabilityError, match="jetson-nano' cannot run int8") as exc:
        nano.require_precision("int8")
    assert exc.value.exit_code == 4
    nano.require_precision("fp16")  # Maxwell has fast FP16


def test_dla_requests_are_checked_against_the_target():
    with pytest.raises(TargetCapabilityError, match="jetson-orin-nano' has no DLA"):
        get_target("jetson-orin-nano").require_dla(0)
    orin = get_target("jetson-orin")
    with pytest.raises(TargetCapabilityError, match=r"DLA cores 0\.\.1, asked for core 2") as err:
        orin.require_dla(2)
    assert err.value.hint == "use --dla-core 0 or --dla-core 1 (build.dla_core)"  # the fix that fixes it
    with pytest.raises(TargetCapabilityError, match="FP16 and INT8 layers only"):
        orin.require_dla(1, "fp32")
    orin.require_dla(1, "int8")
    orin.require_dla(None, "fp32")


def test_build_refuses_int8_on_nano_and_dla_on_orin_nano_before_any_stage(tiny_project, capsys):
    out = tiny_project.parent / "out"
    rc = main(["build", "-c", str(tiny_project), "--target", "jetson-nano", "--precision", "int8", "--out", str(out)])
    assert rc == 4
    assert "cannot run int8" in capsys.readouterr().err
    rc = main(["build", "-c", str(tiny_project), "--target", "jetson-orin-nano", "--dla-core", "0", "--out", str(out)])
    assert rc == 4
    assert "no DLA cores" in capsys.readouterr().err
    assert not (out / "bundle").exists()


def test_an_unknown_target_names_where_it_was_set_and_the_closest(tiny_project, capsys):
    text = tiny_project.read_text()
    assert "[build]\n" in text
    tiny_project.write_text(text.replace("[build]\n", '[build]\ntarget = "jetson-orn"\n', 1))
    assert main(["build", "-c", str(tiny_project)]) == 2
    err = capsys.readouterr().err
    assert f"{tiny_project}: key 'build.target' (--target): unknown target 'jetson-orn'" in err
    assert "did you mean 'jetson-orin'" in err


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "targets.toml"
    p.write_text(textwrap.dedent(text))
    return p


def test_user_profile_file_extends_a_builtin(tmp_path):
    path = _write(
        tmp_path,
        """
        [targets.orin-nx-8gb]
        base = "jetson-orin"
        description = "Orin NX 8GB: one DLA core"
        dla_cores = 1
        memory_mib = 8192
        """,
    )
    t = load_target_file(path)["orin-nx-8gb"]
    assert (t.dla_cores, t.memory_mib, t.sm, t.trt_version) == (1, 8192, "8.7", "10.3")
    with pytest.raises(TargetCapabilityError):
        t.require_dla(1)
    assert get_target("orin-nx-8gb", path).name == "orin-nx-8gb"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ('[targets.x]\nbase = "jetson-orin"\ndla_core = 1\n', "did you mean 'dla_cores'"),
        ('[targets.x]\nbase = "jetson-orin"\nworkspace_mib = 99999\n', "exceeds memory_mib"),
        ('[targets.x]\nbase = "desktop-trt11"\nimplicit_int8 = true\n', "no implicit_int8"),
        ('[targets.x]\nbase = "jetson-orin"\nimplicit_int8 = true\n', "TensorRT 10.3 takes explicit Q/DQ INT8 only"),
        ('[targets.x]\nbase = "jetson-xavier"\ntrt_version = "10.1"\n', "implicit_int8 is for TensorRT 8.x"),
        ('[targets.x]\nbase = "jetson-orin"\nprecisions = ["int4"]\n', "subset of fp32, fp16, int8"),
        ('[targets.x]\nbase = "nope"\n', "not a known target"),
    ],
)
def test_bad_user_profiles_name_file_and_key(tmp_path, body, message):
    path = _write(tmp_path, body)
    with pytest.raises(ConfigError) as exc:
        load_target_file(path)
    assert message in exc.value.one_line()
    assert str(path) in exc.value.message


def test_deploy_targets_lists_every_profile_with_capabilities(capsys):
    assert main(["targets"]) == 0
    text = capsys.readouterr().out
    for name in all_targets():
        assert name in text
    assert "none (no INT8)" in text and "QDQ only" in text
    assert main(["targets", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["jetson-orin"]["dla_cores"] == 2 and data["jetson-nano"]["precisions"] == ["fp32", "fp16"]


def test_desktop_profiles_name_the_python_of_their_build_image():
    """The desktop device step runs in the NGC TensorRT image (Dockerfile; 25.xx images are Ubuntu 24.04: 3.12)."""
    import re

    dockerfile = (Path(__file__).resolve().parents[1] / "Dockerfile").read_text()
    years = {int(y) for y in re.findall(r"nvcr\.io/nvidia/tensorrt:(\d\d)\.\d\d-py3", dockerfile)}
    assert years and min(years) >= 25
    assert get_target("desktop").device_python == get_target("desktop-trt11").device_python == "3.12"

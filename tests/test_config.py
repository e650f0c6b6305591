"""Config loading and validation: errors name the file and the dotted key."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from edgedeploy.config import DEFAULT_TOLERANCES, config_from_dict, load_config
from edgedeploy.config_flags import flag_fields
from edgedeploy.errors import ConfigError

BASE = {
    "outputs": ["y"],
    "model": {"factory": "m:build"},
    "inputs": [{"name": "x", "shape": ["batch", 3, 8, 8]}],
    "dims": {"batch": {"min": 1, "opt": 2, "max": 4}},
}


def _with(**changes):
    raw = {k: (dict(v) if isinstance(v, dict) else v) for k, v in BASE.items()}
    for dotted, value in changes.items():
        node = raw
        parts = dotted.split("__")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = value
    return raw


def test_valid_config_defaults():
    cfg = config_from_dict(BASE, source="t.toml")
    assert cfg.build.target == "cpu"
    assert cfg.precision.mode == "fp32"
    assert cfg.shape_for(cfg.inputs[0], "max") == (4, 3, 8, 8)
    assert cfg.dynamic_dims(cfg.inputs[0]) == {0: "batch"}
    assert cfg.tolerance_for("fp32") == DEFAULT_TOLERANCES["fp32"]


def test_unknown_key_is_named_with_suggestion():
    with pytest.raises(ConfigError) as err:
        config_from_dict(_with(export__opsett=17), source="deploy.toml")
    line = err.value.one_line()
    assert "deploy.toml" in line and "export.opsett" in line and "did you mean 'opset'" in line


def test_unknown_top_level_table():
    with pytest.raises(ConfigError, match="unknown key 'buld'"):
        config_from_dict(_with(buld={"target": "cpu"}), source="d.toml")


def test_wrong_type_names_key():
    with pytest.raises(ConfigError, match=r"'dims.batch.max' must be an integer"):
        config_from_dict(_with(dims={"batch": {"min": 1, "opt": 2, "max": "8"}}))


def test_literal_value_suggests_closest():
    with pytest.raises(ConfigError) as err:
        config_from_dict(_with(precision={"mode": "int9"}))
    assert "precision.mode" in str(err.value) and "int8" in err.value.one_line()


def test_dims_must_be_ordered():
    with pytest.raises(ConfigError, match="dims.batch"):
        config_from_dict(_with(dims={"batch": {"min": 4, "opt": 2, "max": 8}}))


def test_undeclared_dim_in_shape():
    raw = _with(inputs=[{"name": "x", "shape": ["n", 3]}])
    with pytest.raises(ConfigError, match=r"dim 'n'.*\[dims.n\]"):
        config_from_dict(raw)


def test_missing_required_and_bad_factory():
    raw = dict(BASE)
    raw.pop("outputs")
    with pytest.raises(ConfigError, match="missing required key 'outputs'"):
        config_from_dict(raw)
    with pytest.raises(ConfigError, match="module:callable"):
        config_from_dict(_with(model={"factory": "nocolon"}))


def test_user_tolerance_merges_with_defaults():
    cfg = config_from_dict(_with(tolerance={"fp32": {"atol": 1e-3}}))
    tol = cfg.tolerance_for("fp32")
    assert tol.atol == 1e-3 and tol.rtol == DEFAULT_TOLERANCES["fp32"].rtol
    with pytest.raises(ConfigError, match="tolerance.fp64"):
        config_from_dict(_with(tolerance={"fp64": {"atol": 1.0}}))


def test_overrides_are_validated_too():
    cfg = config_from_dict(BASE, overrides={"build.target": "jetson-orin", "export.opset": 17})
    assert cfg.build.target == "jetson-orin" and cfg.export.opset == 17
    with pytest.raises(ConfigError, match="export.opset"):
        config_from_dict(BASE, overrides={"export.opset": "seventeen"})


def test_flags_map_one_to_one_onto_fields():
    fields = flag_fields()
    flags = [f.flag for f in fields]
    dotted = [f.dotted for f in fields]
    assert len(set(flags)) == len(flags) and len(set(dotted)) == len(dotted)
    assert {"--target", "--checkpoint", "--out", "--precision", "--opset", "--calib"} <= set(flags)


def test_load_config_file_errors(tmp_path: Path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("outputs = [\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(bad)


def test_checkpoint_metadata_fills_model_and_inputs(tmp_path: Path):
    import json

    (tmp_path / "ck.meta.json").write_text(
        json.dumps(
            {
                "factory": "m:build",
                "factory_kwargs": {"k": 1},
                "inputs": [{"name": "x", "shape": ["b", 4]}],
                "dims": {"b": {"min": 1, "opt": 2, "max": 3}},
                "outputs": ["y"],
            }
        )
    )
    (tmp_path / "m.py").write_text("def build(k=0):\n    return k\n")
    (tmp_path / "deploy.toml").write_text('[model]\ncheckpoint = "ck.safetensors"\ntrust_sidecar_code = true\n')
    cfg = load_config(tmp_path / "deploy.toml")
    assert cfg.model.factory == "m:build" and cfg.model.kwargs == {"k": 1} and cfg.factory_origin == "sidecar"
    assert cfg.inputs[0].name == "x" and cfg.outputs == ("y",)


def test_calib_method_mse_is_accepted_and_a_typo_names_the_choices():
    assert config_from_dict(_with(precision={"calib_method": "mse"})).precision.calib_method == "mse"
    with pytest.raises(ConfigError) as err:
        config_from_dict(_with(precision={"calib_method": "msee"}))
    assert "precision.calib_method" in str(err.value) and "mse" in err.value.one_line()


@pytest.mark.parametrize(
    ("norm", "message"),
    [
        (
            {"mean": [0.5, 0.5, 0.5], "stdev": [0.2, 0.2, 0.2]},
            r"unknown key 'model.normalization.stdev' -- fix: did you mean 'model.normalization.std'",
        ),
        ({"mean": "0.5"}, r"'model.normalization.mean' = '0.5' must be a list of numbers"),
        ({"std": [0.2, 0.0, 0.2]}, r"'model.normalization.std' = .* must be a list of positive numbers"),
        ({"mean": [0.5, 0.5, 0.5], "std": [0.2, 0.2]}, r"mean' \(3 values\) and 'std' \(2\) must give one value"),
    ],
)
def test_normalization_takes_mean_and_std_per_channel_and_nothing_else(norm, message):
    """A misspelled key left calibration images unnormalized (std 1) without a word; now it is named."""
    with pytest.raises(ConfigError) as err:
        config_from_dict(_with(model={"factory": "m:build", "normalization": norm}), source="d.toml")
    assert re.search(message, err.value.one_line()), err.value.one_line()
    good = {"mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}
    cfg = config_from_dict(_with(model={"factory": "m:build", "normalization": good}), source="d.toml")
    assert cfg.model.normalization == good

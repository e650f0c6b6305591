"""A Hugging Face model folder is data: the Python files it names (``auto_map``) never run unless the user says so,
and no prompt ever waits on (or takes an answer from) stdin."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from edgedeploy.config import config_from_dict
from edgedeploy.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
EVIL = "import pathlib\npathlib.Path({marker!r}).write_text('the folder ran its code')\n"


def _plant(folder: Path, marker: Path, where: str = "config.json") -> None:
    (folder / "evil.py").write_text(EVIL.format(marker=str(marker)))
    path = folder / where
    data = json.loads(path.read_text()) if path.is_file() else {}
    data["auto_map"] = {"AutoModel": "evil.EvilModel", "AutoConfig": "evil.EvilConfig"}
    if where == "tokenizer_config.json":
        data["auto_map"] = {"AutoTokenizer": ["evil.EvilTokenizer", None]}
    path.write_text(json.dumps(data))


def _folder(tmp_path: Path) -> Path:
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "bert", "vocab_size": 100, "type_vocab_size": 2}))
    (folder / "model.safetensors").write_bytes(b"")
    return folder


@pytest.mark.parametrize("where", ["config.json", "tokenizer_config.json"])
def test_a_folder_naming_its_own_code_is_refused_at_config_load(tmp_path, where):
    folder = _folder(tmp_path)
    marker = tmp_path / "ran"
    _plant(folder, marker, where)
    with pytest.raises(ConfigError, match=rf"{where} auto_map: evil\.Evil") as exc:
        config_from_dict({"model": {"hf": "m"}}, source="deploy.toml", base_dir=tmp_path)
    assert "--trust-remote-code" in exc.value.one_line()
    assert not marker.exists()


def test_trust_remote_code_is_the_users_explicit_choice(tmp_path):
    folder = _folder(tmp_path)
    plain = config_from_dict({"model": {"hf": "m"}}, source="deploy.toml", base_dir=tmp_path)
    assert plain.model.trust_remote_code is False and "trust_remote_code" not in plain.model.kwargs
    _plant(folder, tmp_path / "ran")
    cfg = config_from_dict({"model": {"hf": "m", "trust_remote_code": True}}, source="deploy.toml", base_dir=tmp_path)
    assert cfg.model.kwargs["trust_remote_code"] is True
    with pytest.raises(ConfigError, match="trust_remote_code"):
        config_from_dict({"model": {"hf": "m", "trust_remote_code": "yes"}}, source="deploy.toml", base_dir=tmp_path)


def test_no_prompt_gives_transformers_an_empty_stdin():
    from edgedeploy.modelio.hf import no_prompt

    with no_prompt(), pytest.raises(EOFError):
        input("run custom code? [y/N] ")


def test_yes_piped_into_a_build_of_a_folder_with_code_runs_nothing(tmp_path):
    pytest.importorskip("transformers")
    sys.path.insert(0, str(REPO / "tests"))
    from hf_tiny import save_tiny

    folder = save_tiny("bert", tmp_path / "bert")
    marker = tmp_path / "ran"
    _plant(folder, marker)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    cmd = [sys.executable, "-m", "edgedeploy", "build", "--hf", str(folder), "--out", str(tmp_path / "out")]
    proc = subprocess.run(cmd, input="y\n" * 20, capture_output=True, text=True, env=env, timeout=600, cwd=tmp_path)
    assert proc.returncode == ConfigError.exit_code, proc.stderr[-2000:]
    assert "asks to run its own Python code" in proc.stderr and "Traceback" not in proc.stderr
    assert not marker.exists()
    assert not (tmp_path / "out").exists()

"""A config file that is not valid TOML gets a fix naming the line to edit and what is wrong there."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgedeploy.cli import main

GOOD = """outputs = ["logits"]

[model]
factory = "tinynet:build"
"""


def _error(capsys: pytest.CaptureFixture[str], cfg: Path) -> tuple[int, str]:
    code = main(["build", "--config", str(cfg), "--target", "cpu"])
    return code, capsys.readouterr().err.strip()


@pytest.mark.parametrize(
    ("text", "line", "cause"),
    [
        (GOOD.replace('"logits"]', '"logits"'), 3, "an unclosed [ just before it"),
        (GOOD.replace('"tinynet:build"', "{ x = 1"), 4, "an unclosed { just before it"),
        (GOOD.replace('"tinynet:build"', '"tinynet:build'), 4, 'a string without its closing "'),
        (GOOD + 'factory = "again"\n', 5, "a key or table set twice"),
    ],
)
def test_a_toml_syntax_error_names_the_line_and_the_cause(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, line: int, cause: str
) -> None:
    cfg = tmp_path / "bad.toml"
    cfg.write_text(text)
    code, err = _error(capsys, cfg)
    assert code == 2
    assert err.startswith(f"deploy: config error: {cfg}: not valid TOML (")
    assert f" -- fix: fix the TOML syntax at {cfg}:{line} ({cause}" in err


def test_a_config_that_is_not_utf8_is_told_to_be_saved_as_utf8(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = tmp_path / "latin1.toml"
    cfg.write_bytes('outputs = ["sortie é"]\n'.encode("latin-1"))
    code, err = _error(capsys, cfg)
    assert code == 2
    assert err == f"deploy: config error: {cfg}: not a UTF-8 text file -- fix: save {cfg} as UTF-8 text"

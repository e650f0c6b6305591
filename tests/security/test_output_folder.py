"""The output folder is one unit: nothing outside it is deleted, it switches atomically, one build at a time."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import edgedeploy
from edgedeploy.errors import ConfigError, DeployError, InputError
from edgedeploy.fileio import outdir
from edgedeploy.fileio.hashing import sha256_file
from edgedeploy.fileio.outdir import OutputFolder
from edgedeploy.pipeline.manifest import verify_artifacts

REPO = Path(__file__).resolve().parents[2]
QUIET = {"log": lambda _: None}


# ---- real builds ---------------------------------------------------------------------------------------


def test_files_named_in_the_previous_manifest_outside_out_are_never_deleted(tiny_project: Path, tmp_path):
    result = edgedeploy.build(tiny_project, **QUIET)
    victims = [tmp_path / "victim.txt", tiny_project.parent / "tinynet_keep.txt"]
    for v in victims:
        v.write_text("mine")
    manifest = json.loads((result.out / "manifest.json").read_text())
    manifest["artifacts"]["../../victim.txt"] = "0" * 64
    manifest["artifacts"][str(victims[1])] = "0" * 64
    manifest["artifacts"]["../proj/tinynet_keep.txt"] = "0" * 64
    (result.out / "manifest.json").write_text(json.dumps(manifest))
    again = edgedeploy.build(tiny_project, **QUIET)
    assert again.ok
    assert all(v.read_text() == "mine" for v in victims)
    assert verify_artifacts(again.out)


def test_out_dot_never_overwrites_the_users_files(tiny_project: Path):
    project = tiny_project.parent
    (project / "report.md").write_text("my notes")
    (project / "model.onnx").write_bytes(b"my model")
    with pytest.raises(ConfigError, match="contains this build's input"):
        edgedeploy.build(tiny_project, build__out=str(project), **QUIET)
    assert (project / "report.md").read_text() == "my notes"
    assert (project / "model.onnx").read_bytes() == b"my model"


def test_an_out_path_below_a_file_or_in_a_folder_without_new_files_is_one_config_error(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match=r"notes.txt is a file, so .*notes.txt/sub cannot be made below it"):
        with OutputFolder(tmp_path / "notes.txt" / "sub"):
            pass
    assert (tmp_path / "notes.txt").read_text() == "mine"
    if Path("/proc/self").is_dir():  # takes no new files: filelock alone would wait for a lock nobody holds
        with pytest.raises(ConfigError, match="cannot write beside /proc/self/out"):
            with OutputFolder(Path("/proc/self/out")):
                pass


def test_a_non_empty_folder_that_is_not_an_edgedeploy_output_is_refused(tiny_project: Path, tmp_path):
    mine = tmp_path / "photos"
    mine.mkdir()
    (mine / "holiday.jpg").write_bytes(b"jpeg")
    with pytest.raises(InputError, match="not an edgedeploy output folder"):
        edgedeploy.build(tiny_project, build__out=str(mine), **QUIET)
    assert [p.name for p in mine.iterdir()] == ["holiday.jpg"]
    assert not list(tmp_path.glob(".photos.*staging*"))


def test_user_files_added_to_an_output_folder_stop_the_next_build(tiny_project: Path):
    result = edgedeploy.build(tiny_project, **QUIET)
    (result.out / "notes.txt").write_text("keep me")
    with pytest.raises(InputError, match=r"holds files deploy build did not write \(notes.txt\)"):
        edgedeploy.build(tiny_project, **QUIET)
    assert (result.out / "notes.txt").read_text() == "keep me"


def test_out_pointing_at_a_file_is_a_config_error(tiny_project: Path, tmp_path, capsys):
    from edgedeploy.cli import main

    target = tmp_path / "a-file"
    target.write_text("x")
    assert main(["build", "-c", str(tiny_project), "--out", str(target)]) == ConfigError.exit_code
    assert "build.out" in capsys.readouterr().err and target.read_text() == "x"


def test_releases_restored_from_a_shared_cache_share_no_inode(tiny_project: Path, tmp_path, monkeypatch):
    monkeypatch.setenv("EDGEDEPLOY_CACHE_DIR", str(tmp_path / "shared-cache"))
    a = edgedeploy.build(tiny_project, build__out=str(tmp_path / "a"), **QUIET)
    b = edgedeploy.build(tiny_project, build__out=str(tmp_path / "b"), **QUIET)
    assert any(s.status == "cached" for s in b.stages)
    before = sha256_file(b.out / "model.onnx")
    with open(a.out / "model.onnx", "r+b") as fh:  # edit one release in place
        fh.write(b"\0\0\0\0")
    assert sha256_file(b.out / "model.onnx") == before
    assert os.stat(b.out / "model.onnx").st_nlink == 1


def test_stale_staging_folders_are_removed_by_the_next_build(tiny_project: Path):
    result = edgedeploy.build(tiny_project, **QUIET)
    out = result.out
    dead = [out.parent / f".{out.name}.staging-deadbeef", out.parent / f".{out.name}.old-deadbeef", out / ".staging-1"]
    for d in dead:
        d.mkdir()
        (d / "model.onnx").write_bytes(os.urandom(1024))
    edgedeploy.build(tiny_project, **QUIET)
    assert not any(d.exists() for d in dead)


def test_kill_9_during_a_real_publish_leaves_the_old_release(tiny_project: Path):
    first = edgedeploy.build(tiny_project, **QUIET)
    old_manifest = (first.out / "manifest.json").read_text()
    call = f"edgedeploy.build({str(tiny_project)!r}, log=lambda _: None, validate__samples=2)"
    proc = _signalled_build("switch", "SIGKILL", call)
    assert proc.returncode == -9, proc.stderr
    assert (first.out / "manifest.json").read_text() == old_manifest
    assert verify_artifacts(first.out)
    assert list(first.out.parent.glob(f".{first.out.name}.staging-*"))  # the killed build's leftovers ...
    edgedeploy.build(tiny_project, **QUIET)
    assert not list(first.out.parent.glob(f".{first.out.name}.staging-*"))  # ... removed by the next build
    assert list(Path(os.environ["EDGEDEPLOY_CACHE_DIR"]).glob("*/*/stage.json"))  # one cache, outside OUT


def test_sigterm_mid_build_unwinds_like_ctrl_c_and_leaves_the_previous_output(tiny_project: Path):
    first = edgedeploy.build(tiny_project, **QUIET)
    old_manifest = (first.out / "manifest.json").read_text()
    call = f"sys.exit(main(['build', '-c', {str(tiny_project)!r}, '--samples', '2']))"
    proc = _signalled_build("marker", "SIGTERM", call)  # marker: the finished staging is about to be switched in
    assert proc.returncode == 143, proc.stderr
    assert "terminated (SIGTERM)" in proc.stderr.strip().splitlines()[-1]
    assert (first.out / "manifest.json").read_text() == old_manifest and verify_artifacts(first.out)
    assert not list(first.out.parent.glob(f".{first.out.name}.staging-*"))  # unwound, not left for the next build


def test_two_concurrent_builds_into_one_out_leave_one_complete_release(tiny_project: Path):
    cmd = [sys.executable, "-m", "edgedeploy", "build", "-c", str(tiny_project)]
    procs = [
        subprocess.Popen([*cmd, *extra], env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for extra in ([], ["--validate-samples", "2"] if _has_flag("--validate-samples") else ["--opset", "17"])
    ]
    results = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], results
    assert any("waiting for another build" in err for _, err in results)
    out = tiny_project.parent / "out"
    manifest = json.loads((out / "manifest.json").read_text())
    verify_artifacts(out)
    report = json.loads((out / "report.json").read_text())
    assert report["status"] == "passed" and manifest["config_sha256"]
    assert not list(out.parent.glob(".out.staging-*")) and not list(out.parent.glob(".out.old-*"))


def _signalled_build(step: str, signal_name: str, call: str) -> subprocess.CompletedProcess:
    """Run ``call`` (a build) in a new process that sends itself ``signal_name`` at publish step ``step``."""
    script = textwrap.dedent(
        f"""
        import os, signal, sys
        import edgedeploy
        from edgedeploy.cli import main
        from edgedeploy.fileio import outdir
        def hook(step):
            if step == {step!r}:
                os.kill(os.getpid(), signal.{signal_name})
        outdir.step_hook = hook
        {call}
        """
    )
    return subprocess.run([sys.executable, "-c", script], env=_env(), capture_output=True, text=True, timeout=300)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    return env


def _has_flag(flag: str) -> bool:
    from edgedeploy.config_flags import flag_fields

    return any(f.flag == flag for f in flag_fields())


# ---- every publish step, synthetic folders (fast) ------------------------------------------------------


def _release(folder: Path, tag: str) -> None:
    """A minimal edgedeploy output: two artifacts and a manifest listing them."""
    folder.mkdir(parents=True)
    (folder / "model.onnx").write_text(f"model {tag}")
    (folder / "report.json").write_text(f"report {tag}")
    arts = {n: sha256_file(folder / n) for n in ("model.onnx", "report.json")}
    (folder / "manifest.json").write_text(json.dumps({"schema": "edgedeploy-manifest/1", "artifacts": arts}))


def _state(out: Path) -> str:
    """'old' or 'new' when ``out`` verifies and is entirely one release; anything else fails the test."""
    verify_artifacts(out)
    tags = {(out / n).read_text().split()[-1] for n in ("model.onnx", "report.json")}
    assert len(tags) == 1, f"mixed release: {tags}"
    return tags.pop()


STEPS_EXCHANGE = ["marker", "cache", "switch", "cleanup"]
STEPS_RENAMES = ["marker", "cache", "switch", "retire", "install", "cleanup"]


class Crash(BaseException):
    pass


@pytest.mark.parametrize("exchange", [True, False], ids=["rename-exchange", "two-renames"])
def test_a_failure_at_every_publish_step_leaves_old_or_new(tmp_path, monkeypatch, exchange):
    if not exchange:
        monkeypatch.setattr(outdir, "_exchange", lambda a, b: False)
    steps = STEPS_EXCHANGE if exchange else STEPS_RENAMES
    for step in steps:
        out = tmp_path / step / "out"
        _release(out, "old")
        (out / ".cache").mkdir()
        (out / ".cache" / "entry").write_text("cached")

        def crash(at, step=step):
            if at == step:
                raise Crash(at)

        monkeypatch.setattr(outdir, "step_hook", crash)
        with OutputFolder(out) as folder:
            staging = folder.new_staging()
            staging.rmdir()
            _release(staging, "new")
            with pytest.raises(Crash):
                folder.publish(staging)
        monkeypatch.setattr(outdir, "step_hook", lambda at: None)
        with OutputFolder(out):  # the next build's recovery
            pass
        assert _state(out) == ("new" if step == "cleanup" else "old"), step
        assert (out / ".cache" / "entry").read_text() == "cached", step
        assert sorted(p.name for p in out.parent.iterdir()) == [".out.lock", "out"], step


@pytest.mark.parametrize("exchange", [True, False], ids=["rename-exchange", "two-renames"])
def test_kill_9_at_every_publish_step_leaves_old_or_new(tmp_path, exchange):
    steps = STEPS_EXCHANGE if exchange else STEPS_RENAMES
    for step in steps:
        out = tmp_path / step / "out"
        _release(out, "old")
        new = tmp_path / step / "new"
        _release(new, "new")
        script = textwrap.dedent(
            f"""
            import os, signal
            from pathlib import Path
            from edgedeploy.fileio import outdir
            if not {exchange!r}:
                outdir._exchange = lambda a, b: False
            def die(at):
                if at == {step!r}:
                    os.kill(os.getpid(), signal.SIGKILL)
            outdir.step_hook = die
            with outdir.OutputFolder(Path({str(out)!r})) as folder:
                staging = folder.new_staging()
                staging.rmdir()
                os.rename({str(new)!r}, staging)
                folder.publish(staging)
            """
        )
        proc = subprocess.run([sys.executable, "-c", script], env=_env(), capture_output=True, text=True, timeout=60)
        assert proc.returncode == -9, proc.stderr
        if out.exists():  # a reader right after the kill sees a whole release ...
            assert _state(out) in ("old", "new"), step
        else:  # ... or, between the two renames of the fallback, none (never a mix)
            assert not exchange and step == "install"
        with OutputFolder(out):
            pass
        assert _state(out) == ("new" if step == "cleanup" else "old"), step
        assert sorted(p.name for p in out.parent.iterdir()) == [".out.lock", "out"], step


def test_a_publish_error_such_as_a_full_disk_keeps_the_old_release(tmp_path, monkeypatch):
    out = tmp_path / "out"
    _release(out, "old")

    def full(at):
        if at == "switch":
            raise OSError(28, "No space left on device")

    monkeypatch.setattr(outdir, "step_hook", full)
    with OutputFolder(out) as folder:
        staging = folder.new_staging()
        staging.rmdir()
        _release(staging, "new")
        with pytest.raises(OSError):
            folder.publish(staging)
    assert _state(out) == "old"


@pytest.mark.parametrize("name", ["../x", "/etc/passwd", "a/../../x", "a\\b", ""])
def test_manifest_names_are_confined_to_out(tmp_path, name):
    with pytest.raises(DeployError, match="not a plain relative name"):
        outdir.confined(tmp_path, name)


def test_a_manifest_that_is_a_json_list_is_one_line_and_deletes_nothing(tiny_project: Path, capsys):
    from edgedeploy.cli import main

    first = edgedeploy.build(tiny_project, **QUIET)
    (first.out / "manifest.json").write_text("[1, 2]")
    code = main(["build", "-c", str(tiny_project)])
    err = capsys.readouterr().err
    assert code == InputError.exit_code and "Traceback" not in err
    assert "holds files deploy build did not write" in err
    assert (first.out / "model.onnx").is_file()


@pytest.mark.parametrize("planted", ["fifo", "/dev/zero", "folder"])
def test_a_manifest_that_is_no_regular_file_is_one_line_for_gate_sign_and_build(
    tiny_project: Path, planted: str, capsys
) -> None:
    """manifest.json as a FIFO (a plain read blocks forever), a link to /dev/zero (reads until memory runs
    out) or a folder: the gate, sign and the next build each say so in one line, at once, and delete nothing."""
    from edgedeploy.cli import main

    first = edgedeploy.build(tiny_project, **QUIET)
    manifest = first.out / "manifest.json"
    manifest.unlink()
    if planted == "fifo":
        os.mkfifo(manifest)
    elif planted == "folder":
        manifest.mkdir()
    else:
        manifest.symlink_to(planted)
    capsys.readouterr()
    assert main(["gate", str(first.out)]) == 9
    assert main(["sign", str(first.out), "--key", str(first.out / "none.key")]) in (3, 9)
    assert main(["build", "-c", str(tiny_project)]) == InputError.exit_code
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("\n") >= 3
    assert (first.out / "model.onnx").is_file()


def test_a_json_record_is_read_only_from_a_bounded_regular_file(tmp_path: Path) -> None:
    from edgedeploy.jsonread import read_json

    (tmp_path / "r.json").write_text('{"a": 1}')
    assert read_json(tmp_path / "r.json") == {"a": 1}
    (tmp_path / "link.json").symlink_to(tmp_path / "r.json")
    with pytest.raises(OSError, match="a symbolic link"):
        read_json(tmp_path / "link.json")
    assert read_json(tmp_path / "link.json", follow_links=True) == {"a": 1}  # a path the user named
    os.mkfifo(tmp_path / "fifo.json")
    with pytest.raises(OSError, match="not a regular file"):
        read_json(tmp_path / "fifo.json", follow_links=True)
    (tmp_path / "big.json").write_text("[" + "0," * 600 + "0]")
    with pytest.raises(OSError, match="more than a record may take"):
        read_json(tmp_path / "big.json", max_bytes=1000)


# ---- the cache is bounded ------------------------------------------------------------------------------


def _entry(root: Path, stage: str, key: str, size: int, age: float) -> Path:
    import time

    from edgedeploy.pipeline.cache import StageCache

    src = root.parent / "src"
    src.mkdir(parents=True, exist_ok=True)
    (src / "blob").write_bytes(b"x" * size)
    StageCache(root).store(stage, key, src, ["blob"], {})
    d = root / stage / key
    os.utime(d / "stage.json", (time.time() - age, time.time() - age))
    return d


def test_cache_prune_drops_least_recently_used_entries_first(tmp_path, capsys):
    from edgedeploy.cli import main
    from edgedeploy.pipeline.cache import StageCache

    root = tmp_path / "cache"
    old = _entry(root, "export", "a" * 64, 4000, age=300)
    used = _entry(root, "export", "b" * 64, 4000, age=200)
    new = _entry(root, "capture", "c" * 64, 4000, age=100)
    assert StageCache(root).lookup("export", "b" * 64) is not None  # a hit counts as a use
    assert main(["cache", "prune", "--dir", str(root), "--max-size", "9000"]) == 0
    assert "pruned 1 entries" in capsys.readouterr().out
    assert not old.exists() and used.exists() and new.exists()
    assert main(["cache", "prune", "--dir", str(root), "--max-size", "0"]) == 0
    assert not used.exists() and not new.exists()
    assert main(["cache", "prune", "--dir", str(root), "--max-size", "lots"]) == ConfigError.exit_code


def test_prune_deletes_only_entries_the_cache_wrote_never_a_folder_that_holds_a_stage_json(tmp_path, capsys):
    """--dir pointed at a workspace (or EDGEDEPLOY_CACHE_DIR at one): a CI job's folder with its own stage.json
    looks like an entry two levels down, but no cache key authenticates it, so it is kept; the real entry
    beside it goes."""
    from edgedeploy.cli import main

    root = tmp_path / "workspace"
    real = _entry(root, "export", "a" * 64, 4000, age=300)
    job = root / "pipelines" / "deploy"
    (job / "src").mkdir(parents=True)
    (job / "stage.json").write_text('{"name": "my CI stage"}')
    (job / "notes.txt").write_text("important")
    forged = root / "export" / ("b" * 64)
    forged.mkdir()
    (forged / "stage.json").write_text(json.dumps({"schema": "edgedeploy-cache/2", "files": {}, "mac": "0" * 64}))
    assert main(["cache", "prune", "--dir", str(root), "--max-size", "0"]) == 0
    assert "pruned 1 entries" in capsys.readouterr().out
    assert not real.exists() and (job / "notes.txt").read_text() == "important" and (job / "src").is_dir()
    assert forged.is_dir()  # a record this user's cache key does not authenticate is not the cache's to delete


def test_a_build_bounds_its_cache(tiny_project: Path, monkeypatch):
    monkeypatch.setenv("EDGEDEPLOY_CACHE_MAX_SIZE", "0")
    result = edgedeploy.build(tiny_project, **QUIET)
    assert result.ok
    assert not list(Path(os.environ["EDGEDEPLOY_CACHE_DIR"]).glob("*/*/stage.json"))


def test_a_cache_entry_naming_files_outside_it_is_dropped(tmp_path):
    from edgedeploy.pipeline.cache import StageCache, _mac, cache_secret

    root = tmp_path / "cache"
    cache = StageCache(root)
    assert cache.problem() is None
    d = root / "export" / ("d" * 64)
    d.mkdir(parents=True, mode=0o700)
    secret = tmp_path / "secret.txt"
    secret.write_text("secret")
    record = {"files": {"../../../secret.txt": sha256_file(secret)}, "metrics": {}}
    record["mac"] = _mac(cache_secret(), "export", "d" * 64, record)  # even authenticated, a name stays inside
    (d / "stage.json").write_text(json.dumps(record))
    assert cache.lookup("export", "d" * 64) is None
    assert not d.exists() and secret.read_text() == "secret"


def test_an_out_in_a_read_only_folder_is_a_config_error(tmp_path, monkeypatch):
    import filelock

    def denied(self, *args, **kwargs):  # what a read-only parent gives (simulated: tests may run as root)
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(filelock.FileLock, "acquire", denied)
    with pytest.raises(ConfigError, match="cannot write beside"):
        with OutputFolder(tmp_path / "out"):
            pass


# ---- planted files and links beside or inside OUT ------------------------------------------------------


def test_a_planted_manifest_does_not_make_someone_elses_files_a_builds_to_delete(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    (docs / "notes").mkdir(parents=True)
    (docs / "thesis.tex").write_text("mine")
    (docs / "notes" / "b.txt").write_text("mine too")
    forged = {"schema": "edgedeploy-manifest/1", "artifacts": {"thesis.tex": "0", "notes/b.txt": "0"}}
    (docs / "manifest.json").write_text(json.dumps(forged))
    with pytest.raises(InputError, match="is not the file .*manifest.json records"):
        with OutputFolder(docs):
            pass
    assert (docs / "thesis.tex").read_text() == "mine" and (docs / "notes" / "b.txt").read_text() == "mine too"
    honest = tmp_path / "honest"
    _release(honest, "old")
    with OutputFolder(honest):  # a real release whose files are as recorded is still this tool's to replace
        pass


def test_planted_links_named_like_leftovers_are_removed_never_followed(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere" / "prod"
    _release(elsewhere, "old")
    (elsewhere / ".last-failed").mkdir()
    (elsewhere / ".last-failed" / "keep.txt").write_text("keep")
    home = tmp_path / "home"
    (home / ".cache" / "pip").mkdir(parents=True)
    (home / ".cache" / "pip" / "data.txt").write_text("mine")
    work = tmp_path / "work"
    work.mkdir()
    _release(work / "cpu", "old")
    os.symlink(home, work / ".cpu.staging-deadbeef")  # would move home/.cache into OUT
    os.symlink(elsewhere, work / ".cpu.old-deadbeef")  # would become OUT where OUT is missing
    with OutputFolder(work / "cpu"):
        pass
    assert not os.path.lexists(work / ".cpu.staging-deadbeef") and not os.path.lexists(work / ".cpu.old-deadbeef")
    assert (home / ".cache" / "pip" / "data.txt").read_text() == "mine"
    shutil.rmtree(work / "cpu")
    os.symlink(elsewhere, work / ".cpu.old-cafef00d")
    with OutputFolder(work / "cpu"):
        pass
    assert not os.path.lexists(work / "cpu")  # no link to another folder made OUT
    assert (elsewhere / ".last-failed" / "keep.txt").read_text() == "keep" and _state(elsewhere) == "old"


def test_a_dangling_link_named_like_the_lock_creates_nothing_where_it_points(tmp_path: Path) -> None:
    victim = tmp_path / "victim" / "made.txt"
    victim.parent.mkdir()
    os.symlink(victim, tmp_path / ".out.lock")
    with pytest.raises(ConfigError, match="cannot write beside"):
        with OutputFolder(tmp_path / "out"):
            pass
    assert not victim.exists()

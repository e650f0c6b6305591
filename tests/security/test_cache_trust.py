"""The stage cache cannot vouch for itself: whoever can write it cannot make a build publish what it wrote.

Each test is an attack: a backdoored ``model.onnx`` planted in the cache with every hash beside it
rewritten, a cache folder another user owns or anyone may write, a poisoned cache inside a signed
release, and a cache folder that is a link into someone's home.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import numpy as np
import pytest

import edgedeploy
from edgedeploy.cli import main
from edgedeploy.fileio.hashing import sha256_file

BACKDOOR = 1000.0


def _backdoor(model: Path) -> None:
    """Rewrite ``model`` so that it adds +1000 to every output when any input value exceeds 5 (a trigger
    no in-range validation input reaches): on in-range inputs it answers exactly like the original."""
    import onnx
    from onnx import TensorProto, helper

    m = onnx.load(str(model))
    g = m.graph
    image, logits = g.input[0].name, g.output[0].name
    for node in g.node:  # the original output becomes an intermediate
        node.output[:] = [f"{o}__clean" if o == logits else o for o in node.output]
    g.initializer.extend(
        [
            onnx.numpy_helper.from_array(np.array(5.0, np.float32), "bd_threshold"),
            onnx.numpy_helper.from_array(np.array(BACKDOOR, np.float32), "bd_gain"),
        ]
    )
    g.node.extend(
        [
            helper.make_node("ReduceMax", [image], ["bd_max"], keepdims=0),
            helper.make_node("Greater", ["bd_max", "bd_threshold"], ["bd_hit"]),
            helper.make_node("Cast", ["bd_hit"], ["bd_hitf"], to=TensorProto.FLOAT),
            helper.make_node("Mul", ["bd_hitf", "bd_gain"], ["bd_add"]),
            helper.make_node("Add", [f"{logits}__clean", "bd_add"], [logits]),
        ]
    )
    onnx.save(m, str(model))


def _poison_export(cache_root: Path) -> Path:
    """Backdoor every cached model.onnx and rewrite every hash beside it (all an attacker who can write the cache
    can do). Returns one poisoned entry."""
    poisoned = []
    for record in cache_root.glob("*/*/stage.json"):
        model = record.parent / "model.onnx"
        if not model.is_file():
            continue
        _backdoor(model)
        data = json.loads(record.read_text())
        data["files"] = {n: sha256_file(record.parent / n) for n in data["files"]}
        record.write_text(json.dumps(data))
        poisoned.append(record.parent)
    assert poisoned, f"no cached model.onnx under {cache_root}"
    return poisoned[0]


def _run_onnx(model: Path, x: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    sess = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    return sess.run(None, {sess.get_inputs()[0].name: x})[0]


def _assert_backdoor_works(model: Path) -> None:
    x = np.zeros((1, 3, 16, 16), np.float32)
    trigger = x.copy()
    trigger[0, 0, 0, 0] = 9.0
    clean = _run_onnx(model, x)
    assert np.allclose(_run_onnx(model, trigger), _run_onnx(model, trigger.clip(-1, 1)) + BACKDOOR, atol=1e-3)
    assert np.isfinite(clean).all()


def _status(result) -> dict[str, str]:
    return {s.name: s.status for s in result.stages}


@pytest.fixture
def cache_dir() -> Path:
    return Path(os.environ["EDGEDEPLOY_CACHE_DIR"])


def test_a_rewritten_cache_entry_with_every_hash_redone_is_rebuilt_not_published(tiny_project: Path, cache_dir):
    first = edgedeploy.build(tiny_project, log=lambda _: None)
    honest = sha256_file(first.out / "model.onnx")
    entry = _poison_export(cache_dir)
    _assert_backdoor_works(entry / "model.onnx")  # the planted model is a working backdoor
    lines: list[str] = []
    again = edgedeploy.build(tiny_project, log=lines.append)
    assert _status(again)["export"] == "ran", lines
    assert sha256_file(again.out / "model.onnx") == honest
    said = [ln for ln in lines if "ignored" in ln and "not authenticated" in ln]
    assert said, lines
    assert main(["gate", str(again.out)]) == 0


def test_a_cache_folder_others_may_write_is_not_used(tiny_project: Path, tmp_path, monkeypatch, cache_dir):
    first = edgedeploy.build(tiny_project, log=lambda _: None)
    honest = sha256_file(first.out / "model.onnx")
    shared = tmp_path / "shared-cache"  # e.g. a 0777 folder, or one CI's cache action restored from restore-keys
    shutil.copytree(cache_dir, shared)  # the victim's entries, keys and HMACs included
    _poison_export(shared)
    os.chmod(shared, 0o777)
    monkeypatch.setenv("EDGEDEPLOY_CACHE_DIR", str(shared))
    lines: list[str] = []
    again = edgedeploy.build(tiny_project, log=lines.append)
    assert all(s != "cached" for s in _status(again).values()), lines
    assert sha256_file(again.out / "model.onnx") == honest
    assert sum("stage cache not used" in ln and "writable by group or others" in ln for ln in lines) == 1, lines


def test_a_cache_folder_another_user_owns_is_not_used(tiny_project: Path, tmp_path, monkeypatch, cache_dir):
    from edgedeploy.pipeline import cache as cache_module

    first = edgedeploy.build(tiny_project, log=lambda _: None)
    honest = sha256_file(first.out / "model.onnx")
    foreign = tmp_path / "their-cache"
    shutil.copytree(cache_dir, foreign)
    _poison_export(foreign)
    if os.geteuid() == 0:
        os.chown(foreign, 12345, 12345)
    else:  # not root: cannot give the folder away; be someone else instead
        me = os.geteuid()
        monkeypatch.setattr(cache_module, "_my_uid", lambda: me + 1)
        monkeypatch.setenv("EDGEDEPLOY_CACHE_KEY", "k" * 64)
    monkeypatch.setenv("EDGEDEPLOY_CACHE_DIR", str(foreign))
    lines: list[str] = []
    again = edgedeploy.build(tiny_project, log=lines.append)
    assert all(s != "cached" for s in _status(again).values()), lines
    assert sha256_file(again.out / "model.onnx") == honest
    assert any("stage cache not used" in ln and "another user" in ln for ln in lines), lines


def test_a_cache_poisoned_after_signing_is_not_published_by_the_next_build(tiny_project: Path, monkeypatch, capsys):
    out = tiny_project.parent / "out"
    monkeypatch.setenv("EDGEDEPLOY_CACHE_DIR", str(out / ".cache"))  # the cache inside OUT, as it used to be
    first = edgedeploy.build(tiny_project, log=lambda _: None)
    honest = sha256_file(first.out / "model.onnx")
    prefix = tiny_project.parent / "release"
    assert main(["sign", "--generate-key", str(prefix)]) == 0
    assert main(["sign", str(out), "--key", f"{prefix}.key"]) == 0
    _poison_export(out / ".cache")
    assert main(["gate", str(out), "--verify-key", f"{prefix}.pub"]) == 0  # the release itself is unchanged
    capsys.readouterr()
    again = edgedeploy.build(tiny_project, log=lambda _: None)
    assert _status(again)["export"] == "ran"
    assert sha256_file(again.out / "model.onnx") == honest


def _home_with_secrets(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    for hidden in (".git", ".secrets", "proj/.git"):
        (home / hidden).mkdir(parents=True)
        (home / hidden / "keep").write_text("mine")
        old = time.time() - 7200  # older than a store's temp folder may live
        os.utime(home / hidden, (old, old))
    (home / "notes" / "entry").mkdir(parents=True)
    (home / "notes" / "entry" / "stage.json").write_text("{}")  # looks like an entry; still not the cache's
    return home


def _intact(home: Path) -> bool:
    return (
        all((home / h / "keep").read_text() == "mine" for h in (".git", ".secrets", "proj/.git"))
        and (home / "notes" / "entry" / "stage.json").is_file()
    )


def test_a_cache_folder_that_is_a_link_into_home_is_neither_used_nor_cleaned(tiny_project: Path, tmp_path, monkeypatch):
    home = _home_with_secrets(tmp_path)
    link = tiny_project.parent / "out" / ".cache"
    link.parent.mkdir()
    link.symlink_to(home, target_is_directory=True)
    monkeypatch.setenv("EDGEDEPLOY_CACHE_DIR", str(link))
    monkeypatch.setenv("EDGEDEPLOY_CACHE_MAX_SIZE", "0")  # the build prunes everything it may
    lines: list[str] = []
    result = edgedeploy.build(tiny_project, log=lines.append)
    assert result.ok
    assert _intact(home)
    assert any("stage cache not used" in ln and "is a link" in ln for ln in lines), lines


def test_prune_refuses_a_linked_cache_folder_and_never_follows_links_inside(tmp_path, capsys):
    from edgedeploy.pipeline.cache import StageCache

    home = _home_with_secrets(tmp_path)
    link = tmp_path / "cache-link"
    link.symlink_to(home, target_is_directory=True)
    assert main(["cache", "prune", "--dir", str(link), "--max-size", "0"]) == 3
    assert "is a link" in capsys.readouterr().err
    root = tmp_path / "cache"
    StageCache(root).store("export", "a" * 64, _src(tmp_path), ["blob"], {})
    (root / "export" / ".0123456789ab.home").symlink_to(home)  # a 'temp folder' that is a link
    (root / "notes").symlink_to(home / "notes")  # a 'stage folder' that is a link
    assert main(["cache", "prune", "--dir", str(root), "--max-size", "0"]) == 0
    assert _intact(home)
    assert not (root / "export" / ("a" * 64)).exists()  # the cache's own entry went


def test_prune_refuses_a_cache_folder_of_another_user(tmp_path, monkeypatch, capsys):
    from edgedeploy.pipeline import cache as cache_module

    root = tmp_path / "cache"
    cache_module.StageCache(root).store("export", "a" * 64, _src(tmp_path), ["blob"], {})
    me = cache_module._my_uid()
    monkeypatch.setattr(cache_module, "_my_uid", lambda: (me or 0) + 1)
    assert main(["cache", "prune", "--dir", str(root), "--max-size", "0"]) == 3
    assert "another user" in capsys.readouterr().err
    assert (root / "export" / ("a" * 64) / "blob").is_file()


def _src(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    src.mkdir(exist_ok=True)
    (src / "blob").write_bytes(b"x" * 100)
    return src


def test_the_cache_key_is_private_and_a_readable_one_disables_the_cache(tmp_path, monkeypatch):
    from edgedeploy.pipeline.cache import StageCache, key_file

    cache = StageCache(tmp_path / "c1")
    cache.store("export", "a" * 64, _src(tmp_path), ["blob"], {"m": 1})
    assert os.stat(key_file()).st_mode & 0o777 == 0o600
    assert cache.lookup("export", "a" * 64) is not None
    os.chmod(key_file(), 0o644)
    lines: list[str] = []
    again = StageCache(tmp_path / "c1", log=lines.append)
    assert again.lookup("export", "a" * 64) is None
    assert len(lines) == 1 and "readable by others" in lines[0], lines
    os.chmod(key_file(), 0o600)
    monkeypatch.setenv("EDGEDEPLOY_CACHE_KEY", "a CI secret of enough length, 32+ chars")  # another secret
    lines.clear()
    ci = StageCache(tmp_path / "c1", log=lines.append)
    assert ci.lookup("export", "a" * 64) is None and "not authenticated" in lines[0]


def test_a_file_swapped_after_the_check_is_caught_on_restore(tmp_path):
    from edgedeploy.pipeline.cache import StageCache

    cache = StageCache(tmp_path / "c")
    cache.store("export", "a" * 64, _src(tmp_path), ["blob"], {})
    entry = cache.lookup("export", "a" * 64)
    assert entry is not None
    (tmp_path / "c" / "export" / ("a" * 64) / "blob").write_bytes(b"y" * 100)  # between lookup and restore
    dest = tmp_path / "staging"
    dest.mkdir()
    assert cache.restore("export", "a" * 64, entry, dest) is False
    assert not (dest / "blob").exists()


def test_one_cache_in_the_users_cache_folder_serves_every_out(tiny_project: Path, tmp_path, monkeypatch):
    monkeypatch.delenv("EDGEDEPLOY_CACHE_DIR")
    xdg = tmp_path / "xdg-cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(xdg))
    a = edgedeploy.build(tiny_project, build__out=str(tmp_path / "fp32-a"), log=lambda _: None)
    b = edgedeploy.build(tiny_project, build__out=str(tmp_path / "fp32-b"), log=lambda _: None)
    assert _status(b)["export"] == _status(b)["reference"] == "cached"
    assert list((xdg / "edgedeploy").glob("export/*/stage.json"))
    assert (xdg / "edgedeploy" / "CACHEDIR.TAG").is_file()
    assert not (a.out / ".cache").exists() and not (b.out / ".cache").exists()
    assert os.stat(xdg / "edgedeploy").st_mode & 0o777 == 0o700


def _remembering(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Files count as settled at once: a test cannot wait for a status-change time to age (fileio.digest_memo)."""
    from edgedeploy.fileio import digest_memo

    monkeypatch.setattr(digest_memo, "SETTLED_S", 0.0)


def _hashes(monkeypatch) -> list[str]:  # type: ignore[no-untyped-def]
    """Every restored copy the cache hashes, by name."""
    from edgedeploy.pipeline import cache as cache_module

    seen: list[str] = []
    real = cache_module.sha256_file
    monkeypatch.setattr(cache_module, "sha256_file", lambda p: seen.append(Path(p).name) or real(p))
    return seen


def _rewrite_in_place(path: Path, data: bytes) -> None:
    """New bytes of the same size in the same inode, the modification time put back: all a file owner can do
    to hide a change (the status-change time still moves)."""
    st = os.stat(path)
    with open(path, "r+b") as fh:
        fh.write(data)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(path).st_ino == st.st_ino and os.stat(path).st_mtime_ns == st.st_mtime_ns


def test_a_restore_skips_hashing_only_the_very_file_it_verified_before(tmp_path, monkeypatch):
    from edgedeploy.pipeline.cache import StageCache

    _remembering(monkeypatch)
    key = "a" * 64
    StageCache(tmp_path / "c").store("export", key, _src(tmp_path), ["blob"], {})
    hashed = _hashes(monkeypatch)  # from here: the restores' hashing

    def restore() -> bool:
        cache = StageCache(tmp_path / "c")  # a new build: the memo is read back from the cache folder
        entry = cache.lookup("export", key)
        assert entry is not None
        dest = tmp_path / "staging"
        shutil.rmtree(dest, ignore_errors=True)
        dest.mkdir()
        ok = cache.restore("export", key, entry, dest)
        cache.digests().save()
        assert not ok or (dest / "blob").read_bytes() == b"x" * 100
        return ok

    assert restore() and hashed == ["blob"]  # verified by hashing, and remembered
    assert restore() and hashed == ["blob"]  # the same inode, untouched: not hashed again
    time.sleep(0.01)  # past the file system's time tick: the rewrite below gets a new status-change time
    _rewrite_in_place(tmp_path / "c" / "export" / key / "blob", b"y" * 100)
    assert restore() is False and hashed == ["blob", "blob"]  # the memo no longer vouches: hashed, caught


def test_a_forged_or_foreign_digest_memo_vouches_for_nothing(tmp_path, monkeypatch):
    from edgedeploy.fileio.digest_memo import DigestMemo

    _remembering(monkeypatch)
    blob = _src(tmp_path) / "blob"
    memo = DigestMemo(tmp_path / "digests.json", b"k" * 32)
    sha = memo.sha256(blob)
    memo.save()
    st = os.stat(blob)
    assert DigestMemo(tmp_path / "digests.json", b"k" * 32).known(st) == sha
    assert DigestMemo(tmp_path / "digests.json", b"another user's key, 32 chars!!!").known(st) is None
    data = json.loads((tmp_path / "digests.json").read_text())
    row = next(iter(data["entries"].values()))
    row[3] = "0" * 64  # a planted digest, the MAC left as it was
    (tmp_path / "digests.json").write_text(json.dumps(data))
    assert DigestMemo(tmp_path / "digests.json", b"k" * 32).known(st) is None


def test_a_file_whose_status_changed_just_now_is_hashed_every_time(tmp_path, monkeypatch):
    from edgedeploy.fileio import digest_memo

    reads: list[int] = []
    real = digest_memo.sha256_open
    monkeypatch.setattr(digest_memo, "sha256_open", lambda fh: reads.append(1) or real(fh))
    blob = _src(tmp_path) / "blob"  # written now: within SETTLED_S
    memo = digest_memo.DigestMemo(tmp_path / "digests.json", b"k" * 32)
    assert memo.sha256(blob) == memo.sha256(blob) == sha256_file(blob)
    assert len(reads) == 2  # a write in the same time tick could hide behind an unchanged time: not remembered
    memo.save()
    assert not (tmp_path / "digests.json").exists()


def test_a_checkpoint_rewritten_in_place_with_its_time_put_back_is_hashed_and_rebuilt(tiny_project: Path, monkeypatch):
    import tomllib

    _remembering(monkeypatch)
    cfg = tomllib.loads(tiny_project.read_text())
    checkpoint = tiny_project.parent / cfg["model"]["checkpoint"]
    first = edgedeploy.build(tiny_project, log=lambda _: None)
    before = json.loads((first.out / "manifest.json").read_text())["inputs"]
    again = edgedeploy.build(tiny_project, log=lambda _: None)  # its digest now comes from the memo
    assert set(_status(again).values()) <= {"cached", "skipped"}
    from safetensors.numpy import load_file, save_file

    weights = {k: np.array(v + 1, dtype=v.dtype) for k, v in load_file(str(checkpoint)).items()}  # same size
    tmp = checkpoint.with_suffix(".new")
    save_file(weights, str(tmp))
    assert tmp.stat().st_size == checkpoint.stat().st_size
    time.sleep(0.01)
    _rewrite_in_place(checkpoint, tmp.read_bytes())
    changed = edgedeploy.build(tiny_project, log=lambda _: None)
    assert _status(changed)["reference"] == "ran"  # a new digest: a new cache key, nothing served stale
    recorded = [before, json.loads((changed.out / "manifest.json").read_text())["inputs"]]
    digests = [next(v["sha256"] for k, v in inputs.items() if "checkpoint" in k) for inputs in recorded]
    assert digests[1] == sha256_file(checkpoint) != digests[0]

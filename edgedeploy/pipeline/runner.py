"""Runs the stages of a build: cache lookups, staging, publishing, manifest and report."""

from __future__ import annotations

import contextlib
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgedeploy.artifacts import CALIB_CODE, CALIBRATION, CHECKPOINT, MODEL_CODE, VALIDATION_DATA
from edgedeploy.config import DeployConfig
from edgedeploy.errors import ConfigError, DeployError, InputError, StageInputError
from edgedeploy.fileio.environment import environment_key
from edgedeploy.fileio.hashing import sha256_json
from edgedeploy.fileio.outdir import FAILED_DIR as FAILED_DIR
from edgedeploy.fileio.outdir import OutputFolder, check_free_space, disk_full
from edgedeploy.fileio.signing import release_model
from edgedeploy.fileio.store import atomic_write_json
from edgedeploy.modelio import reads, usercode
from edgedeploy.pipeline.cache import CACHE_ENV as CACHE_ENV
from edgedeploy.pipeline.cache import StageCache, default_cache_dir, max_cache_bytes
from edgedeploy.pipeline.manifest import MANIFEST, build_manifest
from edgedeploy.pipeline.quiet import BUILD_LOG, StageNoise
from edgedeploy.pipeline.report import REPORT, build_report, write_report_files
from edgedeploy.pipeline.threads import bounded_thread_waits
from edgedeploy.stages.base import BuildContext, Stage, StageResult
from edgedeploy.targets import TargetProfile

if TYPE_CHECKING:
    from edgedeploy.pipeline.code_memo import MemoStore
    from edgedeploy.pipeline.progress import BuildConsole


@dataclass
class StageRecord:
    name: str
    status: str  # ran | cached | skipped | failed
    seconds: float = 0.0
    key: str = ""
    reason: str = ""
    files: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": self.status,
            "seconds": round(self.seconds, 3),
            "key": self.key,
            "reason": self.reason,
            "files": self.files,
        }


@dataclass
class BuildResult:
    """What ``build`` returns: where things went, how each stage went, and the report."""

    out: Path
    target: str
    precision: str
    stages: list[StageRecord]
    artifacts: dict[str, str]
    report: dict[str, Any]
    seconds: float

    @property
    def ok(self) -> bool:
        """True when the build passed and its artifacts were validated against PyTorch here.

        False for a passing build that is not validated yet: a TensorRT bundle (complete_bundle.py
        validates the engine on the device) or a run whose stages did not include validation.
        A failing build raises instead of returning.
        """
        parity = self.report.get("parity") or {}
        return self.report.get("status") == "passed" and parity.get("status") == "passed"

    def artifact(self, name: str) -> Path:
        return self.out / name


def default_stages(target: TargetProfile, cfg: DeployConfig | None = None) -> list[Stage]:
    """The stage sequence for ``target`` (the build stage is chosen by the target's runtime), and the
    release gate last when the build has a policy (``[gate]`` / ``--policy``), before anything is published.

    Raises:
        ConfigError: the policy file is invalid.
    """
    from edgedeploy.stages import pipeline_stages
    from edgedeploy.stages.gate import GateFromReport
    from edgedeploy.validate.gate import policy_for_build

    stages = pipeline_stages(target, cfg)
    if cfg is not None and policy_for_build(cfg) is not None:
        stages.append(GateFromReport())
    return stages


# a Hugging Face folder's tokenizer files (transformers' names), which decide the token ids of text data
HF_TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "vocab.txt",
    "vocab.json", "merges.txt", "spiece.model", "sentencepiece.bpe.model", "tokenizer.model",
)  # fmt: skip


def _model_files(cfg: DeployConfig) -> tuple[Path, ...]:
    """Files the model is made of besides its code and checkpoint: the external-data files a given ONNX model's
    tensors name (read without loading them), a Hugging Face folder's tokenizer files."""
    files: list[Path] = []
    onnx_path = cfg.path(cfg.model.onnx) if cfg.model.onnx else None
    if onnx_path is not None and onnx_path.is_file():
        import onnx

        try:
            proto = onnx.load(str(onnx_path), load_external_data=False)
        except Exception:  # unreadable: the stage that reads it names the problem
            proto = None
        locations = {
            entry.value
            for t in (proto.graph.initializer if proto is not None else ())
            if t.data_location == onnx.TensorProto.EXTERNAL
            for entry in t.external_data
            if entry.key == "location"
        }
        files += [onnx_path.parent / loc for loc in sorted(locations) if (onnx_path.parent / loc).is_file()]
    if cfg.model.hf:
        folder = Path(cfg.model.kwargs["folder"])
        files += [folder / name for name in HF_TOKENIZER_FILES if (folder / name).is_file()]
    return tuple(files)


def _external_inputs(cfg: DeployConfig) -> dict[str, Path]:
    from edgedeploy.pipeline.early import check_exported_file

    for key, origin in cfg.data_origins.items():  # samples the checkpoint's sidecar lists: named as such
        if key != "precision.calib" or cfg.precision.mode == "int8":
            check_exported_file(key, Path(origin["path"]), origin)
    ext: dict[str, Path] = {}
    ckpt = cfg.path(cfg.model.checkpoint)
    if ckpt is not None:
        if not ckpt.is_file():
            raise InputError(
                f"checkpoint not found: {ckpt}", hint="fix model.checkpoint in the config or pass --checkpoint PATH"
            )
        ext[CHECKPOINT] = ckpt
    if cfg.model.onnx:  # a model given as ONNX: the file is the model, graph and weights
        ext[CHECKPOINT] = Path(cfg.path(cfg.model.onnx) or "")
    if cfg.model.hf:  # a Hugging Face folder: its weights key the cache like a checkpoint (config.json: model code)
        from edgedeploy.hfspec import weights_file

        folder = Path(cfg.model.kwargs["folder"])
        ext[CHECKPOINT] = weights_file(folder) or folder / "config.json"
    data = cfg.path(cfg.validate.data)
    if data is not None:
        if not data.is_file():
            raise InputError(f"validation data not found: {data}", hint="fix validate.data")
        ext[VALIDATION_DATA] = data
    calib = cfg.path(cfg.precision.calib)
    if calib is not None and cfg.precision.mode == "int8":
        if not calib.exists():
            raise InputError(f"calibration data not found: {calib}", hint="fix precision.calib or --calib")
        if calib.is_file():
            ext[CALIBRATION] = calib
    return ext


def run_build(
    cfg: DeployConfig,
    *,
    stages: list[Stage] | None = None,
    log: Callable[[str], None] | None = None,
    verbose: bool = False,
    quiet: bool = False,
    log_file: Path | None = None,
) -> BuildResult:
    """Run a whole build into ``cfg.build.out``.

    The previous contents of the output folder are replaced only when every stage
    succeeds; on failure they stay as they were and the failed run's files and
    report go to ``<out>/.last-failed/``.

    Raises:
        DeployError: any stage's error, after the failure report was written.

    Library output during a stage (warnings, logging, prints, native libraries' fd 1/2) goes to
    ``<out>/build.log`` with a count on the stage's line; ``verbose`` shows it as it happens instead.
    Without ``log``, lines go to the console (:class:`~edgedeploy.pipeline.progress.BuildConsole`: a live
    status line on a terminal, plain lines elsewhere); ``quiet`` keeps only warnings there, ``log_file``
    receives every line and library message as well.
    """
    from edgedeploy.pipeline.progress import BuildConsole

    console = None
    if log is None:  # bound now: stages run with fds 1/2 redirected into build.log
        console = BuildConsole(sys.stderr, quiet=quiet, log_file=log_file)
        log = console.line
    out = Path(cfg.path(cfg.build.out) or "build")
    made: list[StageCache] = []

    def cache() -> StageCache:  # one per user, shared by every OUT (see pipeline.cache); made when first needed
        if not made:
            made.append(StageCache(default_cache_dir(), log=log))
        return made[0]

    # the previous output's files, checked against its manifest, are hashed once: later builds read the memo
    memo = (lambda path: cache().digests().sha256(path)) if cfg.build.cache else None
    try:
        # what the target cannot do is refused before what is missing: a missing file is no reason to look
        target = _checked_target(cfg)
        inputs = [Path(cfg.base_dir), *_external_inputs(cfg).values()]
        with OutputFolder(out, inputs=inputs, log=log, sha256=memo) as folder:  # one build per folder, one unit
            check_free_space(folder.out.parent, cfg.path(cfg.model.checkpoint))
            try:
                with reads.building(reads.ReadLog()) as read_log:  # what user code reads keys the cache too
                    return _run_build(cfg, folder, stages, log, verbose, target, console, cache(), read_log)
            except OSError as exc:  # ENOSPC / EDQUOT: one line, staging already removed, OUT untouched
                err = disk_full(exc, folder.out)
                if err is None:
                    raise
                raise err from None
    except DeployError as exc:
        if console is not None:  # the log file ends with why, as the console does
            console.record(f"deploy: {exc.one_line()} (exit {exc.exit_code})")
        raise
    finally:
        if console is not None:
            console.close()


def _checked_target(cfg: DeployConfig) -> tuple[TargetProfile, str]:
    """(the build's target, how it was resolved), its capabilities checked against ``cfg``.

    Raises:
        TargetCapabilityError: the target cannot do what the config asks (precision, DLA, opset).
        ConfigError: the target is unknown, or its profile file is bad (from the resolver).
    """
    from edgedeploy.targets.resolve import check_capabilities, resolve_target
    from edgedeploy.trt.provenance import running_tensorrt

    try:
        target, resolved = resolve_target(
            cfg.build.target,
            targets_file=cfg.path(cfg.build.targets_file),
            jetson_default=cfg.build.jetson,
            local_tensorrt=running_tensorrt,
        )
    except ConfigError as exc:
        if not exc.message.startswith(f"unknown target {cfg.build.target!r}"):
            raise  # [build] jetson's default, a targets file: their own messages say where
        # where the name came from, as every other config error says
        raise ConfigError(f"{cfg.source}: key 'build.target' (--target): {exc.message}", hint=exc.hint) from None
    check_capabilities(target, cfg)  # precision, DLA, opset: before any stage
    return target, resolved


def _run_build(
    cfg: DeployConfig,
    folder: OutputFolder,
    stages: list[Stage] | None,
    log: Callable[[str], None],
    verbose: bool,
    checked: tuple[TargetProfile, str],
    console: BuildConsole | None = None,
    cache: StageCache | None = None,
    read_log: reads.ReadLog | None = None,
) -> BuildResult:
    t_start = time.perf_counter()
    target, resolved = checked
    from edgedeploy.pipeline.early import refuse_early

    refuse_early(cfg, target)  # config / target / data-presence refusals, before any model is loaded
    out = folder.out
    cache = cache or StageCache(default_cache_dir(), log=log)  # one per user, shared by every OUT; see pipeline.cache
    # setup problems (missing inputs, a factory that does not import, a bad policy) fail before anything is written
    external = _external_inputs(cfg)
    usercode.forget()  # modules an earlier build in this process imported are imported afresh
    bounded_thread_waits()  # before the model code imports torch: its OpenMP runtime reads the settings once
    # the user's code, once: every file it imported is an input of the model (none for a model given as ONNX)
    model_code, factory, loader = _model_code(cfg, cache) if cfg.model.factory else ((), None, None)
    calib_code = _calibration_code(cfg)
    stages = stages if stages is not None else default_stages(target, cfg)
    staging = folder.new_staging()  # beside OUT, so the finished folder is switched in by one rename
    ctx = BuildContext(cfg=cfg, target=target, staging=staging, out=out, external=external, log=log)
    ctx.on_status = console.status if console is not None else None
    if cfg.build.cache:  # inputs unchanged since an earlier build are not hashed again (fileio.digest_memo)
        ctx.digests = cache.digests()
    if CHECKPOINT not in ctx.external:
        ctx.warn(
            "no model.checkpoint: the model runs with the weights its factory gives it (random, from a fixed seed, "
            "unless the factory loads trained weights); set model.checkpoint or --checkpoint to deploy trained weights"
        )
    if cfg.model.factory:
        ctx.factory, ctx.factory_loader = factory, loader
        ctx.groups[MODEL_CODE] = model_code
    if cfg.model.hf and cfg.model.factory:  # the architecture lives in the folder's config.json: model code
        ctx.groups[MODEL_CODE] = (*model_code, Path(cfg.model.kwargs["folder"]) / "config.json")
    # files that are the model as much as its code: a given ONNX model's external weights, a Hugging Face folder's
    # tokenizer (it turns validate.data's text into the goldens' token ids)
    extra = _model_files(cfg)
    if extra:
        ctx.groups[MODEL_CODE] = (*ctx.groups.get(MODEL_CODE, ()), *extra)
    if calib_code is not None:
        ctx.groups[CALIB_CODE] = calib_code
    ctx.read_log = read_log
    read_memos = _reads_memos(cfg, cache, ctx) if cfg.build.cache else {}
    ctx.reads = {group: memo.recall() for group, memo in read_memos.items()}
    environment = environment_key()  # the interpreter and installed packages key every stage's cache entry
    records: list[StageRecord] = []
    produced: list[str] = []
    log(f"deploy build: target={target.name}{resolved} precision={cfg.precision.mode} out={out}")
    for name, files in ctx.groups.items():  # which of the user's files key the cache (manifest.json lists them)
        log(f"  {name}: {_file_list(files, Path(cfg.base_dir))}")
    current = ""
    noise: list[str] = []
    try:
        for i, stage in enumerate(stages, 1):
            current = stage.name
            heard = StageNoise(stage.name, verbose)
            showing = console.stage(i, len(stages), stage.name) if console is not None else contextlib.nullcontext()
            try:
                with showing, heard:
                    rec = _run_stage(stage, ctx, cache, cfg, list(zip(stages, records)), environment)
            finally:
                noise.extend(f"[{stage.name}] {line}" for line in heard.lines)
                if console is not None:
                    for line in heard.lines:
                        console.record(f"[{stage.name}] {line}")
            records.append(rec)
            produced.extend(f for f in rec.files if f not in produced)
            detail = "; ".join(x for x in (rec.reason, heard.summary()) if x)
            detail = f" ({detail})" if detail else ""
            log(f"[{i}/{len(stages)}] {stage.name:<10} {rec.status:<7} {rec.seconds:6.2f}s{detail}")
        _remember_reads(ctx, read_memos, log)
        if noise:
            (staging / BUILD_LOG).write_text("\n".join(noise) + "\n")
            produced.append(BUILD_LOG)
    except DeployError as exc:
        _remember_reads(ctx, read_memos, log)
        if noise:
            (staging / BUILD_LOG).write_text("\n".join(noise) + "\n")
        _fail(ctx, cfg, target, records, current, exc, t_start, folder)
        raise
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    seconds = time.perf_counter() - t_start
    report = build_report(
        cfg=cfg,
        target=target,
        stages=[r.to_dict() for r in records],
        metrics=ctx.metrics,
        warnings=ctx.warnings,
        status="passed",
        seconds=seconds,
    )
    report["model"] = release_model(ctx.metrics, ctx.sha256)  # what was validated, bound by the gate
    report_files = write_report_files(report, staging, plot_cache=cache if cfg.build.cache else None)
    artifacts = {name: ctx.sha256(name) for name in produced + report_files}
    manifest = build_manifest(
        config=cfg.to_dict(),
        config_sha=sha256_json(cfg.to_dict()),
        target=target.capabilities(),
        inputs=_manifest_inputs(ctx),
        artifacts=artifacts,
        stages=[r.to_dict() for r in records],
        summary=report.get("summary", {}),
    )
    atomic_write_json(staging / MANIFEST, manifest)
    try:
        folder.publish(staging)  # the whole folder at once; the previous one is retired as a unit
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if cfg.build.cache and not cache.problem():
        cache.digests().save()
        cache.prune(max_cache_bytes())  # least recently used entries beyond the bound
    return BuildResult(
        out=out,
        target=target.name,
        precision=cfg.precision.mode,
        stages=records,
        artifacts=artifacts,
        report=report,
        seconds=seconds,
    )


def _model_code(cfg: DeployConfig, cache: MemoStore) -> tuple[tuple[Path, ...], Any, Any]:
    """(the model code's files, the factory or None, a loader or None): the files remembered from an earlier
    build when they are unchanged (the module is then imported only if a stage runs: a cached build never
    imports torch), else the module imported now (every file it imported is an input of the model).

    Raises:
        ConfigError: the module does not import.
    """
    from edgedeploy.pipeline.code_memo import CodeMemo, factory_loader

    memo = CodeMemo.for_build(cfg, cache)
    files = memo.recall() if memo is not None else None
    if memo is not None and files is not None:
        return files, None, factory_loader(cfg, files, memo)
    loaded = usercode.load_factory(cfg)
    if memo is not None:
        memo.remember(tuple(loaded.files))
    return tuple(loaded.files), loaded.factory, None


def _reads_memos(cfg: DeployConfig, cache: StageCache, ctx: BuildContext) -> dict[str, Any]:
    """Input group -> the memo of the paths its user code read when it last ran (the model factory, the
    calibration callable), for the groups this build has."""
    from edgedeploy.pipeline.code_memo import ReadsMemo

    specs = {MODEL_CODE: cfg.model.factory, CALIB_CODE: cfg.precision.calib_callable}
    return {g: ReadsMemo.for_group(cfg, cache, g, spec) for g, spec in specs.items() if spec and g in ctx.groups}


def _remember_reads(ctx: BuildContext, memos: dict[str, Any], log: Callable[[str], None]) -> None:
    """Remember what each group's code read, where it ran this build, for the next build's keys; say so when
    this build's stages could not be stored for it."""
    if ctx.read_log is None:
        return
    for group in ctx.read_log.ran:
        if group in memos:
            memos[group].remember(ctx.read_log.of(group)[: reads.MAX_READS])
    many = {g: n for g in ctx.read_log.ran if (n := len(ctx.read_log.of(g))) > reads.MAX_READS}
    for group, count in many.items():
        log(
            f"  your code ({group}) read {count} files, more than the {reads.MAX_READS} a cache key holds: its "
            "stages are never cached; give such data as a file or folder the config names (precision.calib)"
        )
    unkeyed = ctx.unkeyed_reads()
    if unkeyed and memos and not many:
        names = ", ".join(p.name for p in unkeyed[:3]) + (f" (+{len(unkeyed) - 3} more)" if len(unkeyed) > 3 else "")
        log(
            f"  your code read files the cache keys did not hold yet ({names}): the stages that ran are not cached "
            "this time; the next build keys these files"
        )


def _calibration_code(cfg: DeployConfig) -> tuple[Path, ...] | None:
    """The files of ``precision.calib_callable`` and what it imports, when a build uses it (loaded once, here,
    so a callable that does not import fails before anything is written).

    Raises:
        ConfigError: the callable does not load.
    """
    if not cfg.precision.calib_callable or cfg.precision.mode == "fp32":
        return None
    return usercode.load_callable_code(cfg, cfg.precision.calib_callable, "precision.calib_callable").files


def _file_list(files: tuple[Path, ...], base: Path, most: int = 6) -> str:
    names = []
    for f in files:
        try:
            names.append(f.relative_to(base.resolve()).as_posix())
        except ValueError:  # outside the project: the full path says where
            names.append(str(f))
    more = f" (+{len(names) - most} more)" if len(names) > most else ""
    return ", ".join(names[:most]) + more


def _manifest_inputs(ctx: BuildContext) -> dict[str, Any]:
    """External inputs as the manifest records them; user code lists every file the build loaded."""
    inputs: dict[str, Any] = {k: {"path": str(p), "sha256": ctx.sha256(k)} for k, p in ctx.external.items()}
    for name, files in ctx.groups.items():
        inputs[name] = {
            "path": str(files[0]) if files else "",
            "sha256": ctx.sha256(name),
            "files": [{"path": str(f), "sha256": ctx.group_file_sha(name, f)} for f in files],
        }
        # what the code read as it ran (this build's run, else the last one's, which keyed the cached stages)
        ran = ctx.read_log is not None and name in ctx.read_log.ran
        read = ctx.read_log.of(name) if ran else list(ctx.reads.get(name, ()))
        if read:
            inputs[name]["reads"] = [{"path": str(p), "state": ctx.read_state(p)} for p in read]
    return inputs


def _input_hashes(stage: Stage, ctx: BuildContext) -> dict[str, str]:
    """sha256 of every external input ``stage`` declares.

    Raises:
        StageInputError: a declared input is not configured for this build, or its file is gone.
    """
    hashes = {}
    for name in stage.inputs(ctx):
        if not ctx.has_input(name):
            raise StageInputError(
                stage.name,
                name,
                f"needs input {name!r}, which this build does not have",
                hint=f"configure {name} for this build, or drop it from {type(stage).__name__}.inputs()",
            )
        try:
            hashes[name] = ctx.sha256(name)
        except InputError as exc:  # configured, but the file went away since the build started
            raise StageInputError(stage.name, name, exc.message, hint=f"restore the {name} file") from None
    return hashes


def _consumed_hashes(stage: Stage, ctx: BuildContext, earlier: list[tuple[Stage, StageRecord]]) -> dict[str, str]:
    """sha256 of the staging files ``stage`` reads: every required one, and the optional ones present.

    Raises:
        StageInputError: a required file is not in staging (the stage that writes it was skipped, failed
            to write it, or does not run before this one).
    """
    required = stage.requires(ctx)
    missing = [n for n in required if not ctx.path(n).is_file()]
    if missing:
        name = missing[0]
        writers = [(s, r) for s, r in earlier if name in type(s).produces or name in r.files]
        if writers and writers[-1][1].status == "skipped":
            why = f"the stage that writes it ({writers[-1][0].name}) was skipped: {writers[-1][1].reason}"
        elif writers:
            why = f"the stage that writes it ({writers[-1][0].name}) did not write it"
        else:
            why = "no earlier stage of this build writes it"
        raise StageInputError(
            stage.name,
            name,
            f"needs {name}, which is not in the build's staging folder: {why}",
            hint=f"run a stage that writes {name} before {stage.name}, or declare it in "
            f"{type(stage).__name__}.optional if the stage can do without it",
        )
    present = [n for n in stage.optional if n not in required and ctx.path(n).is_file()]
    return {n: ctx.sha256(n) for n in (*required, *present)}


def _run_stage(
    stage: Stage,
    ctx: BuildContext,
    cache: StageCache,
    cfg: DeployConfig,
    earlier: list[tuple[Stage, StageRecord]] | None = None,
    environment: str = "",
) -> StageRecord:
    reason = stage.applies(ctx)
    if reason is not None:
        return StageRecord(stage.name, "skipped", reason=reason)
    t0 = time.perf_counter()
    outputs = list(stage.outputs(ctx))
    key = sha256_json(
        {
            "stage": stage.name,
            "version": stage.version,
            "config": stage.config_key(ctx),
            "consumes": _consumed_hashes(stage, ctx, earlier or []),
            "inputs": _input_hashes(stage, ctx),
            "outputs": outputs,
            # the interpreter and the installed packages' versions made the artifact too (fileio.environment)
            "environment": environment,
        }
    )
    use_cache = cfg.build.cache and stage.cacheable
    entry = cache.lookup(stage.name, key) if use_cache else None
    if entry is not None:
        ctx.forget_digests(list(entry.files))  # a failed restore removes what it copied
    if entry is not None and cache.restore(stage.name, key, entry, ctx.staging):
        for name, sha in entry.files.items():  # each copy was checked against the authenticated sha256
            ctx.remember_digest(name, sha)
        _record(ctx, stage.name, StageResult(entry.metrics, list(entry.warnings), list(entry.notes)), emitted=0)
        return StageRecord(stage.name, "cached", time.perf_counter() - t0, key, files=list(entry.files))
    before = len(ctx.warnings)
    try:
        result = StageResult.of(stage.run(ctx))
    except DeployError as exc:
        _record(ctx, stage.name, StageResult.of(exc.partial), emitted=0)
        raise
    finally:
        ctx.forget_digests(outputs)
    outputs = list(stage.outputs(ctx))  # a stage may learn its files while running (capture = "auto")
    ctx.forget_digests(outputs)
    # warnings given to ctx.warn while running are part of the result (and so of the cache entry)
    emitted = ctx.warnings[before:]
    result.warnings = emitted + [w for w in result.warnings if w not in emitted]
    missing = [f for f in outputs if not (ctx.staging / f).is_file()]
    if missing:  # a stage that claims outputs it did not write is a bug in that stage
        raise RuntimeError(f"stage {stage.name} did not write {missing}")
    _record(ctx, stage.name, result, emitted=len(emitted))
    # a key that missed a file the user's code read this build (its first run, or a new file) cannot vouch for
    # the result: not stored; the next build keys that file (modelio.reads)
    if use_cache and not ctx.unkeyed_reads():
        cache.store(stage.name, key, ctx.staging, outputs, result.metrics, warnings=result.warnings, notes=result.notes)
    return StageRecord(stage.name, "ran", time.perf_counter() - t0, key, files=outputs)


def _record(ctx: BuildContext, name: str, result: StageResult, *, emitted: int) -> None:
    """Put a stage's result into the build: metrics (notes included) and warnings not yet emitted."""
    metrics = dict(result.metrics)
    if result.notes:
        metrics["notes"] = list(metrics.get("notes") or []) + [
            n for n in result.notes if n not in (metrics.get("notes") or [])
        ]
    ctx.metrics[name] = metrics
    for w in result.warnings[emitted:]:
        ctx.warn(w)


def _fail(
    ctx: BuildContext,
    cfg: DeployConfig,
    target: TargetProfile,
    records: list[StageRecord],
    stage: str,
    exc: DeployError,
    t_start: float,
    folder: OutputFolder,
) -> None:
    """Keep the failed run's files and a failure report in ``<out>/.last-failed``; touch nothing else."""
    records = records + [StageRecord(stage or "setup", "failed", reason=exc.one_line())]
    report = build_report(
        cfg=cfg,
        target=target,
        stages=[r.to_dict() for r in records],
        metrics=ctx.metrics,
        warnings=ctx.warnings,
        status="failed",
        seconds=time.perf_counter() - t_start,
        error={"kind": exc.kind, "exit_code": exc.exit_code, "message": exc.one_line()},
    )
    try:
        write_report_files(report, ctx.staging)
    except Exception:  # the failure report is best effort; the original error matters more
        pass
    exc.report = report
    had_output = (ctx.out / MANIFEST).is_file()  # the previous release, untouched: a failure publishes nothing
    failed = folder.fail(ctx.staging)
    if ctx.log:
        kept = f"previous output in {ctx.out} left as it was" if had_output else f"no output in {ctx.out} before"
        ctx.log(f"build failed; {kept}; failure report: {failed / REPORT}")

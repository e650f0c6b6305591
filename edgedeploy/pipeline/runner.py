"""Runs the stages of a build: cache lookups, staging, publishing, manifest and report."""

from __future__ import annotations

import os
import shutil
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgedeploy.config import DeployConfig
from edgedeploy.errors import DeployError, InputError
from edgedeploy.pipeline.cache import StageCache
from edgedeploy.pipeline.context import BuildContext, factory_source
from edgedeploy.pipeline.hashing import sha256_json
from edgedeploy.pipeline.manifest import MANIFEST, build_manifest, read_manifest
from edgedeploy.pipeline.quiet import BUILD_LOG, StageNoise
from edgedeploy.pipeline.report import REPORT, build_report, write_report_files
from edgedeploy.pipeline.store import atomic_write_json, publish
from edgedeploy.stages.base import Stage
from edgedeploy.targets import TargetProfile, get_target

FAILED_DIR = ".last-failed"
CACHE_ENV = "EDGEDEPLOY_CACHE_DIR"


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
        return self.report.get("status") == "passed"

    def artifact(self, name: str) -> Path:
        return self.out / name


def default_stages(target: TargetProfile) -> list[Stage]:
    """The stage sequence for ``target`` (the build stage is chosen by the target's runtime)."""
    from edgedeploy.stages import pipeline_stages

    return pipeline_stages(target)


def _external_inputs(cfg: DeployConfig) -> dict[str, Path]:
    ext: dict[str, Path] = {}
    ckpt = cfg.path(cfg.model.checkpoint)
    if ckpt is not None:
        if not ckpt.is_file():
            raise InputError(
                f"checkpoint not found: {ckpt}", hint="fix model.checkpoint in the config or pass --checkpoint PATH"
            )
        ext["checkpoint"] = ckpt
    src = factory_source(cfg)
    if src is not None:
        ext["model_code"] = src
    if cfg.model.hf:  # a Hugging Face folder: its weights and config.json key the cache like a checkpoint
        from edgedeploy.hfspec import weights_file

        folder = Path(cfg.model.kwargs["folder"])
        ext["checkpoint"] = weights_file(folder) or folder / "config.json"
        ext["model_code"] = folder / "config.json"
    calib = cfg.path(cfg.precision.calib)
    if calib is not None and cfg.precision.mode == "int8":
        if not calib.exists():
            raise InputError(f"calibration data not found: {calib}", hint="fix precision.calib or --calib")
        if calib.is_file():
            ext["calibration"] = calib
    return ext


def run_build(
    cfg: DeployConfig,
    *,
    stages: list[Stage] | None = None,
    log: Callable[[str], None] | None = None,
    verbose: bool = False,
) -> BuildResult:
    """Run a whole build into ``cfg.build.out``.

    The previous contents of the output folder are replaced only when every stage
    succeeds; on failure they stay as they were and the failed run's files and
    report go to ``<out>/.last-failed/``.

    Raises:
        DeployError: any stage's error, after the failure report was written.

    Library output during a stage (warnings, logging, prints) goes to ``<out>/build.log`` with a
    count on the stage's line; ``verbose`` shows it as it happens instead.
    """
    console = sys.stderr  # bound now: stages run with sys.stderr redirected into build.log
    log = log or (lambda line: print(line, file=console, flush=True))
    t_start = time.perf_counter()
    target = get_target(cfg.build.target, cfg.path(cfg.build.targets_file))
    from edgedeploy.pipeline.early import refuse_early

    refuse_early(cfg, target)  # config / target / data-presence refusals, before any model is loaded
    out = Path(cfg.path(cfg.build.out) or "build")
    out.mkdir(parents=True, exist_ok=True)
    cache = StageCache(Path(os.environ.get(CACHE_ENV) or out / ".cache"))
    staging = out / f".staging-{uuid.uuid4().hex[:8]}"
    staging.mkdir(parents=True)
    ctx = BuildContext(cfg=cfg, target=target, staging=staging, out=out, external=_external_inputs(cfg), log=log)
    stages = stages if stages is not None else default_stages(target)
    records: list[StageRecord] = []
    produced: list[str] = []
    log(f"deploy build: target={target.name} precision={cfg.precision.mode} out={out}")
    current = ""
    noise: list[str] = []
    try:
        for i, stage in enumerate(stages, 1):
            current = stage.name
            heard = StageNoise(stage.name, verbose)
            try:
                with heard:
                    rec = _run_stage(stage, ctx, cache, cfg)
            finally:
                noise.extend(f"[{stage.name}] {line}" for line in heard.lines)
            records.append(rec)
            produced.extend(f for f in rec.files if f not in produced)
            detail = "; ".join(x for x in (rec.reason, heard.summary()) if x)
            detail = f" ({detail})" if detail else ""
            log(f"[{i}/{len(stages)}] {stage.name:<10} {rec.status:<7} {rec.seconds:6.2f}s{detail}")
        if noise:
            (staging / BUILD_LOG).write_text("\n".join(noise) + "\n")
            produced.append(BUILD_LOG)
        current = "gate"  # release gate ([gate] / --policy), before anything is published
        from edgedeploy.gate import gate_build

        gate_build(ctx)
    except DeployError as exc:
        if noise:
            (staging / BUILD_LOG).write_text("\n".join(noise) + "\n")
        _fail(ctx, cfg, target, records, current, exc, t_start)
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
    report_files = write_report_files(report, staging, plot_cache=cache.root / "plots")
    artifacts = {name: ctx.sha256(name) for name in produced + report_files}
    manifest = build_manifest(
        config=cfg.to_dict(),
        config_sha=sha256_json(cfg.to_dict()),
        target=target.capabilities(),
        inputs={k: {"path": str(p), "sha256": ctx.sha256(k)} for k, p in ctx.external.items()},
        artifacts=artifacts,
        stages=[r.to_dict() for r in records],
        summary=report.get("summary", {}),
    )
    atomic_write_json(staging / MANIFEST, manifest)
    previous = read_manifest(out) or {}
    stale = [n for n in previous.get("artifacts", {}) if n not in artifacts]
    publish(staging, out, list(artifacts) + [MANIFEST], stale=stale)
    shutil.rmtree(staging, ignore_errors=True)
    shutil.rmtree(out / FAILED_DIR, ignore_errors=True)
    return BuildResult(
        out=out,
        target=target.name,
        precision=cfg.precision.mode,
        stages=records,
        artifacts=artifacts,
        report=report,
        seconds=seconds,
    )


def _run_stage(stage: Stage, ctx: BuildContext, cache: StageCache, cfg: DeployConfig) -> StageRecord:
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
            "consumes": {n: ctx.sha256(n) for n in stage.consumes if ctx.path(n).is_file()},
            "outputs": outputs,
        }
    )
    entry = cache.lookup(stage.name, key) if cfg.build.cache else None
    if entry is not None:
        cache.restore(stage.name, key, entry, ctx.staging)
        ctx.metrics[stage.name] = entry.metrics
        return StageRecord(stage.name, "cached", time.perf_counter() - t0, key, files=list(entry.files))
    try:
        metrics = stage.run(ctx) or {}
    except DeployError:
        ctx.metrics.setdefault(stage.name, {})
        raise
    outputs = list(stage.outputs(ctx))  # a stage may learn its files while running (capture = "auto")
    missing = [f for f in outputs if not (ctx.staging / f).is_file()]
    if missing:  # a stage that claims outputs it did not write is a bug in that stage
        raise RuntimeError(f"stage {stage.name} did not write {missing}")
    ctx.metrics[stage.name] = metrics
    if cfg.build.cache:
        cache.store(stage.name, key, ctx.staging, outputs, metrics)
    return StageRecord(stage.name, "ran", time.perf_counter() - t0, key, files=outputs)


def _fail(
    ctx: BuildContext,
    cfg: DeployConfig,
    target: TargetProfile,
    records: list[StageRecord],
    stage: str,
    exc: DeployError,
    t_start: float,
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
    failed = ctx.out / FAILED_DIR
    shutil.rmtree(failed, ignore_errors=True)
    try:
        os.replace(ctx.staging, failed)
    except OSError:
        shutil.rmtree(ctx.staging, ignore_errors=True)
    if ctx.log:
        ctx.log(f"build failed; previous output in {ctx.out} left as it was; failure report: {failed / REPORT}")

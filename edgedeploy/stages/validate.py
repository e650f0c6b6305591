"""ParityFromGoldens: run every artifact of the build on the golden inputs, compare with PyTorch, time it.

Backends: the TorchScript capture, ONNX Runtime on the FP32 model and on the FP16 / INT8 variants when
the precision stage wrote them, and the TensorRT engine when there is one and TensorRT imports (else
the candidate is listed as ``skipped: no TensorRT``). Each runs through a polygraphy runner
(``edgedeploy.validate.runners``) on the goldens' inputs (min / opt / max shapes and ``validate.data``);
each output is judged with the tolerance of the backend's precision (``[tolerance.<precision>]``) by the one
rule of :func:`edgedeploy.validate.parity.judge_goldens` (FP16/INT8 agreement on real samples only).
A batch made of one row repeated must give the same output in every row. A failing ONNX candidate is
traced back to the first layer where it departs from PyTorch (``edgedeploy.validate.localize``).
All failures are collected, then reported in one ParityError.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from edgedeploy import runtimes
from edgedeploy import stagenames as names
from edgedeploy.artifacts import GOLDENS, ONNX_DATA, deploy_model_name
from edgedeploy.errors import DeployError, ParityError
from edgedeploy.modelio.goldens import load_goldens
from edgedeploy.precision.golden_feeds import reference_calls
from edgedeploy.stages.base import BuildContext, Stage, StageResult
from edgedeploy.validate.latency import measure
from edgedeploy.validate.parity import (
    NON_FINITE,
    add_to_histogram,
    batch_consistency,
    empty_histogram,
    judge_goldens,
    where,
)
from edgedeploy.validate.repeated_rows import batch_major_outputs, repeated_row_batch
from edgedeploy.validate.runners import (
    ENGINE_FILES,
    ONNX_MODELS,
    TORCHSCRIPT,
    Backend,
    discover_backends,
    infer_calls,
    make_runner,
    quiet_polygraphy,
    short_error,
    tensorrt_available,
)

REFERENCE = "pytorch-eager"


def _worst_failure(checks: list[dict[str, Any]]) -> dict[str, Any]:
    """The failing parity row to localize: non-finite output first, then the largest max abs error."""
    rows = [c for c in checks if not c["passed"] and c.get("check") == "parity"] or checks
    return max(rows, key=lambda c: (NON_FINITE in c.get("failure", []), c.get("max_abs", float("inf"))))


def _reference(ctx: BuildContext) -> str:
    """What the goldens' outputs came from: eager PyTorch, or ONNX Runtime FP32 of a model given as ONNX."""
    return REFERENCE if not ctx.cfg.model.onnx else "onnxruntime-fp32 (the given ONNX model)"


class ParityFromGoldens(Stage):
    name = names.VALIDATE
    # 3: integer outputs judged by exact agreement (a verdict a cached entry must not replay); 4: TorchScript runs
    # on input copies (a model writing its input in place); 5: batch consistency only on outputs whose leading
    # axis follows the batch size
    version = "5"
    consumes = (GOLDENS,)
    # every artifact of the build is validated when present (capture and precision may not run)
    optional = (TORCHSCRIPT, *dict.fromkeys(ONNX_MODELS.values()), ONNX_DATA, *ENGINE_FILES)

    def applies(self, ctx: BuildContext) -> str | None:
        if not ctx.target.builds_here:
            return "engine built on device: complete_bundle.py validates it there against the goldens"
        return None

    def config_key(self, ctx: BuildContext) -> Any:
        c = ctx.cfg
        return {
            "precision": ctx.precision,
            "tolerance": {p: c.tolerance_for(p).__dict__ for p in ONNX_MODELS},
            "validate": c.to_dict()["validate"],
            "outputs": list(c.outputs),
            "tensorrt": tensorrt_available(),
            "backends": list(runtimes.get(ctx.target.runtime).validation_backends),
        }

    def run(self, ctx: BuildContext) -> StageResult | dict[str, Any]:
        cfg = ctx.cfg
        goldens = load_goldens(ctx.path(GOLDENS))
        samples = [(point, s, pair) for point, by_sample in goldens.items() for s, pair in sorted(by_sample.items())]
        kinds = runtimes.get(ctx.target.runtime).validation_backends  # the ones that run this runtime's artifact
        backends, skipped = discover_backends(ctx.staging, ctx.precision, ctx.sha256, kinds)
        point = "opt" if "opt" in goldens else next(iter(goldens))  # validate.samples = 0: time the user's data
        opt_feeds = goldens[point][0]["in"]
        candidates: list[dict[str, Any]] = []
        timings: dict[str, Any] = {"status": "measured", "shape": point, "backends": {}, "skipped": {}}
        # when: a build that restores this stage from the cache shows these figures as measured then, not now
        timings["measured_at"] = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
        for backend in backends:
            cand, lat = self._validate_backend(ctx, backend, samples, opt_feeds)
            candidates.append(cand)
            if lat is not None:
                timings["backends"][backend.name] = lat
            else:
                timings["skipped"][backend.name] = cand.get("reason", "did not run")
        for skip in skipped:
            candidates.append({"name": skip.name, "status": "skipped", "reason": skip.reason, "checks": []})
            timings["skipped"][skip.name] = skip.reason
        failed = [c for c in candidates if c["status"] == "failed"]
        parity = {
            "status": "failed" if failed else "passed",
            "reference": _reference(ctx),
            "deploy_artifact": deploy_model_name(ctx.precision),
            "tolerance": cfg.tolerance_for(ctx.precision).__dict__,
            "tolerances": {c["precision"]: c["tolerance"] for c in candidates if "tolerance" in c},
            "shapes": sorted({p for p, _, _ in samples}),
            "candidates": candidates,
        }
        metrics = {"parity": parity, "latency": timings}
        if failed:
            error = self._error(
                failed, against="PyTorch" if not ctx.cfg.model.onnx else "the given ONNX model's FP32 run"
            )
            error.partial = StageResult(metrics)
            raise error
        return StageResult(metrics)

    def _validate_backend(
        self, ctx: BuildContext, backend: Backend, samples: list[tuple[str, int, Any]], opt_feeds: dict[str, Any]
    ) -> tuple[dict[str, Any], dict[str, Any] | None]:
        cfg = ctx.cfg
        tol = cfg.tolerance_for(backend.precision)
        cand: dict[str, Any] = {
            "name": backend.name,
            "backend": backend.kind,
            "precision": backend.precision,
            "artifact": backend.artifact,
            "sha256": ctx.sha256(backend.artifact),  # the exact file these checks judged (the gate binds it)
            "deploy": backend.artifact == deploy_model_name(ctx.precision),
            "tolerance": tol.__dict__,
            "checks": [],
        }
        runner = make_runner(backend, ctx.staging, cfg)
        with quiet_polygraphy():
            try:
                runner.activate()  # loaded once for every check and the latency below (each input run once)
                inputs = [pair["in"] for _, _, pair in samples]
                # the held-out batches in the reference's own calls: fewer, larger runs, the same inputs
                outputs = infer_calls(runner, inputs, reference_calls(cfg, [p for p, _, _ in samples], inputs))
            except DeployError:
                _deactivate(runner)
                raise
            except Exception as exc:  # the backend cannot load or run the model: a failed candidate, reported
                _deactivate(runner)
                cand.update(status="failed", failure=["cannot run"], reason=f"cannot run: {short_error(exc)}")
                return cand, None
        hist = {name: empty_histogram() for name in cfg.outputs}
        for (_, _, pair), got in zip(samples, outputs):
            for out_name in cfg.outputs:
                if out_name in got and out_name in pair["out"] and out_name not in pair.get("sparse", {}):
                    add_to_histogram(hist[out_name], pair["out"][out_name], got[out_name])
        rows = judge_goldens(
            [(point, s, pair) for point, s, pair in samples],
            outputs,
            backend.precision,
            tol.__dict__,
            outputs=list(cfg.outputs),
            topk=cfg.validate.topk,
            classifier_outputs=list(cfg.validate.classifier_outputs),
        )
        for row in rows:
            row.setdefault("check", "parity")
        cand["checks"] += rows  # one judge: the precision stage and the device bundle apply the same
        informational = [r for r in rows if r.get("informational")]
        if informational:
            cand["informational"] = (
                f"{len(informational)} spec-random golden row(s) outside tolerance.{backend.precision}: reported, "
                "not judged (task agreement of reduced precision is judged on real samples)"
            )
        cand["histograms"] = hist
        lat = None
        with quiet_polygraphy(), _active(runner):
            repeated = repeated_row_batch(cfg, opt_feeds)
            if repeated is None:
                cand["batch_consistency"] = "skipped: no dynamic batch dim with max > 1"
            else:
                feeds, n = repeated
                got = {k: np.asarray(v) for k, v in runner.infer(feeds).items()}
                batched = batch_major_outputs(runner.infer, cfg, opt_feeds, got, n)
                for row in batch_consistency(
                    got, n, atol=tol.atol, rtol=tol.rtol, min_cosine=tol.min_cosine, batch_major=batched
                ):
                    if "skipped" not in row:
                        row.update(check="batch_consistency", shape=f"x{n}", sample=0)
                        cand["checks"].append(row)
            lat = measure(runner, opt_feeds, warmup=cfg.validate.latency_warmup, iters=cfg.validate.latency_iters)
        failing = [c for c in cand["checks"] if not c["passed"]]
        cand["status"] = "failed" if failing else "passed"
        if any(c["check"] == "parity" for c in failing):
            cand["localization"] = self._localize(ctx, backend, samples, _worst_failure(failing))
        return cand, lat

    def _localize(
        self, ctx: BuildContext, backend: Backend, samples: list[tuple[str, int, Any]], row: dict[str, Any]
    ) -> dict[str, Any]:
        if not backend.onnx:
            return {"status": "not localized", "reason": f"localization needs an ONNX candidate, not {backend.kind}"}
        if not ctx.cfg.model.factory:
            return {"status": "not localized", "reason": "localization needs the PyTorch model (built from ONNX)"}
        from edgedeploy.validate.localize import localize

        feeds = next(pair["in"] for p, s, pair in samples if p == row["shape"] and s == row["sample"])
        try:
            result = localize(ctx.path(backend.artifact), ctx.model(), ctx.cfg, feeds, precision=backend.precision)
        except DeployError:
            raise
        except Exception as exc:  # a diagnostic must not hide the parity failure it explains
            return {"status": "not localized", "reason": short_error(exc)}
        result["sample"] = {"shape": row["shape"], "sample": row["sample"], "output": row["output"]}
        return result

    def _error(self, failed: list[dict[str, Any]], against: str = "PyTorch") -> ParityError:
        from edgedeploy.validate.localize import describe

        lines = []
        rows = []
        for cand in failed:
            if not cand["checks"]:
                lines.append(f"{cand['name']}: {cand.get('reason')}")
                continue
            bad = [c for c in cand["checks"] if not c["passed"]]
            rows += [dict(c, candidate=cand["name"]) for c in bad]
            groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
            for c in cand["checks"]:
                groups.setdefault((c["check"], c["output"]), []).append(c)
            for (check, output), group in groups.items():  # one line per failing output: its worst row
                failing = [c for c in group if not c["passed"]]
                if failing:
                    worst = _worst_failure(failing)
                    lines.append(
                        f"{cand['name']} {check} {output}: {len(failing)} of {len(group)} fail, worst "
                        f"{where(worst)}: {worst.get('reason')}"
                    )
            if "localization" in cand:
                lines.append(f"{cand['name']}: {describe(cand['localization'])}")
        names = ", ".join(c["name"] for c in failed)
        return ParityError(
            f"{len(failed)} backend(s) disagree with {against} ({names}): " + "; ".join(lines),
            failures=rows or failed,
            hint="see report.html / report.json; loosen [tolerance.<precision>] only if intended",
        )


def _deactivate(runner: Any) -> None:
    if getattr(runner, "is_active", False):
        runner.deactivate()


@contextlib.contextmanager
def _active(runner: Any) -> Iterator[Any]:
    """The already active ``runner``, deactivated on the way out."""
    try:
        yield runner
    finally:
        _deactivate(runner)

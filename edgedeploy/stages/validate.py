"""ParityFromGoldens: run the built artifact on the golden inputs, compare with PyTorch, time it."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from edgedeploy.errors import ParityError
from edgedeploy.pipeline.context import BuildContext
from edgedeploy.pipeline.parity import compare_output
from edgedeploy.stages.base import Stage
from edgedeploy.stages.build_ort import ort_session
from edgedeploy.stages.precision import PRECISION_MODELS, deploy_model_name
from edgedeploy.stages.reference import GOLDENS, load_goldens


def latency(run: Any, feeds: dict[str, np.ndarray], *, warmup: int, iters: int) -> dict[str, Any]:
    """Warm up, then time ``iters`` calls of ``run(feeds)``; p50/p90/p99 in ms and samples/s."""
    for _ in range(warmup):
        run(feeds)
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        run(feeds)
        times.append((time.perf_counter() - t0) * 1e3)
    batch = next(iter(feeds.values())).shape[0] if feeds and next(iter(feeds.values())).ndim else 1
    p50 = float(np.percentile(times, 50))
    return {
        "p50_ms": p50,
        "p90_ms": float(np.percentile(times, 90)),
        "p99_ms": float(np.percentile(times, 99)),
        "throughput": batch * 1e3 / p50 if p50 > 0 else 0.0,
        "iters": iters,
        "warmup": warmup,
        "shape": {k: list(v.shape) for k, v in feeds.items()},
    }


class ParityFromGoldens(Stage):
    name = "validate"
    version = "1"
    consumes = (GOLDENS, *dict.fromkeys(PRECISION_MODELS.values()))

    def applies(self, ctx: BuildContext) -> str | None:
        if not ctx.target.builds_here:
            return f"no {ctx.target.runtime} here: validation runs on the device against the goldens"
        return None

    def config_key(self, ctx: BuildContext) -> Any:
        c = ctx.cfg
        return {
            "precision": ctx.precision,
            "tolerance": c.tolerance_for(ctx.precision).__dict__,
            "validate": c.to_dict()["validate"],
        }

    def run(self, ctx: BuildContext) -> dict[str, Any]:
        cfg = ctx.cfg
        model = deploy_model_name(ctx.precision)
        sess = ort_session(str(ctx.path(model)))
        goldens = load_goldens(ctx.path(GOLDENS))
        tol = cfg.tolerance_for(ctx.precision)
        names = [o.name for o in sess.get_outputs()]

        def run(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            return dict(zip(names, sess.run(names, feeds)))

        checks = []
        for point, samples in goldens.items():
            for s, pair in sorted(samples.items()):
                got = run(pair["in"])
                for out_name in cfg.outputs:
                    row = compare_output(
                        pair["out"][out_name],
                        got[out_name],
                        atol=tol.atol,
                        rtol=tol.rtol,
                        min_cosine=tol.min_cosine,
                        min_topk_agreement=tol.min_topk_agreement,
                        topk=cfg.validate.topk,
                        classifier=out_name in cfg.validate.classifier_outputs,
                    )
                    row.update(shape=point, sample=s, output=out_name)
                    checks.append(row)
        candidate = {
            "name": f"onnxruntime-{ctx.precision}",
            "artifact": model,
            "checks": checks,
            "passed": all(c["passed"] for c in checks),
        }
        parity = {
            "status": "passed" if candidate["passed"] else "failed",
            "reference": "pytorch-eager",
            "tolerance": tol.__dict__,
            "candidates": [candidate],
        }
        opt = goldens["opt"][0]["in"]
        lat = {
            "status": "measured",
            "backends": {
                candidate["name"]: latency(
                    run, opt, warmup=cfg.validate.latency_warmup, iters=cfg.validate.latency_iters
                )
            },
        }
        ctx.metrics[self.name] = {"parity": parity, "latency": lat}
        failures = [c for c in checks if not c["passed"]]
        if failures:
            table = "; ".join(
                f"{candidate['name']} {c['shape']}#{c['sample']} {c['output']}: {c.get('reason')}" for c in failures[:6]
            )
            more = f" (+{len(failures) - 6} more)" if len(failures) > 6 else ""
            raise ParityError(
                f"{len(failures)} of {len(checks)} parity checks failed: {table}{more}",
                failures=failures,
                hint="see report.json; loosen [tolerance] only if intended",
            )
        return {"parity": parity, "latency": lat}

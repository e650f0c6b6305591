"""GateFromReport: the release gate as the last stage of ``deploy build`` when the build has a policy."""

from __future__ import annotations

from edgedeploy import stagenames as names
from edgedeploy.stages.base import BuildContext, Stage, StageResult
from edgedeploy.validate.gate import evaluate, judged_view, load_baseline, policy_for_build


class GateFromReport(Stage):
    """The release gate at the end of ``deploy build`` (before publishing), appended when the build has a policy.

    It judges the build's report as it stands after validation (integrity is not checked here: the runner
    writes the manifest right after). The verdict is the stage's metrics, in report.json either way.
    """

    name = names.GATE
    version = "1"
    cacheable = False  # a verdict on this build and its baseline, never replayed

    def run(self, ctx: BuildContext) -> StageResult:
        """Judge the build against its policy.

        Raises:
            ParityError, PerformanceRegressionError, StageError: a policy rule failed (all listed in the log),
                with the verdict attached as the partial result.
            InputError: the policy's baseline report is missing or unreadable.
        """
        policy = policy_for_build(ctx.cfg)
        if policy is None:
            return StageResult({"status": "skipped", "reason": "no policy"})
        report = judged_view(ctx.metrics)
        baseline = load_baseline(policy.baseline, policy) if policy.baseline else None
        result = evaluate(report, policy, baseline=baseline)
        if ctx.log:
            for check in result.failures:
                ctx.log(f"  gate {check.line()}")
        if not result.passed:
            error = result.error()
            error.partial = StageResult(result.to_dict())
            raise error
        return StageResult(result.to_dict())

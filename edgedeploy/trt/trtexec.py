"""The ``trtexec`` command line equivalent to a build plan, for the plan's TensorRT version.

Flag spellings follow NVIDIA's trtexec migration guides and each release's ``trtexec.cpp`` /
``sampleOptions.cpp``: ``--workspace=N`` up to 8.3 and ``--memPoolSize=workspace:N`` (MiB) from 8.4
(``--workspace`` is gone in 10); the precision flags (``--fp16``, ``--int8``, ``--calib``) do not
exist in 11, and ``--stronglyTyped`` is accepted there as a no-op (every network is strongly typed),
so the 11 line leaves it out; ``--builderOptimizationLevel`` from 8.6; ``--precisionConstraints``
exists in 8.2.1 already, but ``--layerPrecisions`` / ``--layerOutputTypes`` (the per-layer pins it
obeys) come with 8.4, so an 8.2 line cannot pin layers and says so.
"""

from __future__ import annotations

import shlex

from edgedeploy.trt.plan import BuildPlan

TRTEXEC_SCRIPT = "trtexec.sh"
DEFAULT_TRTEXEC = "/usr/src/tensorrt/bin/trtexec"  # where JetPack and the TensorRT tarball put it


def _version(text: str) -> tuple[int, int]:
    parts = [int(p) for p in text.split(".")[:2] if p.isdigit()]
    return (parts + [0, 0])[0], (parts + [0, 0])[1]


def _shapes(plan: BuildPlan, which: str) -> str:
    return ",".join(f"{i.name}:{'x'.join(str(d) for d in getattr(i, which))}" for i in plan.inputs)


def trtexec_args(plan: BuildPlan, *, trtexec: str = "trtexec") -> tuple[list[str], list[str]]:
    """The trtexec argument vector for ``plan`` and notes on what it cannot express.

    Returns:
        (argv, notes): ``argv[0]`` is ``trtexec``; notes name plan settings this TensorRT
        version's trtexec has no flag for (the Python build path honours them).
    """
    major, minor = _version(plan.trt_version)
    v = (major, minor)
    argv = [trtexec, f"--onnx={plan.onnx}", f"--saveEngine={plan.engine}"]
    notes: list[str] = []
    if plan.dynamic:
        argv += [f"--minShapes={_shapes(plan, 'min')}", f"--optShapes={_shapes(plan, 'opt')}"]
        argv += [f"--maxShapes={_shapes(plan, 'max')}"]
    argv.append(f"--memPoolSize=workspace:{plan.workspace_mib}" if v >= (8, 4) else f"--workspace={plan.workspace_mib}")
    if plan.precision == "fp32":
        # TF32 is on by default from TensorRT 7.1 (trtexec: --noTF32 to disable); FP32 engines must
        # not run TF32 math on Ampere / Orin. The Python build clears BuilderFlag.TF32 likewise.
        argv.append("--noTF32")
    if major < 11:
        if plan.strongly_typed:
            argv.append("--stronglyTyped")
        elif plan.strategy == "fp16-flag":
            argv.append("--fp16")
        elif plan.precision == "int8":
            argv += ["--int8", "--fp16"]  # as the Python build: unquantized layers in FP16, not FP32
            if plan.calib_cache:
                argv.append(f"--calib={plan.calib_cache}")
                notes.append(
                    f"{plan.calib_cache}'s header names TensorRT {plan.trt_version}; TensorRT ignores a cache "
                    "from another patch release (complete_bundle.py rewrites the header, trtexec does not)"
                )
    if plan.fp32_layers:
        if v >= (8, 4):
            argv.append("--layerPrecisions=" + ",".join(f"{name}:fp32" for name in plan.fp32_layers))
            if plan.fp32_output_layers:  # float outputs only: an index/shape output cannot be typed fp32
                argv.append("--layerOutputTypes=" + ",".join(f"{name}:fp32" for name in plan.fp32_output_layers))
            argv.append("--precisionConstraints=obey")
        else:
            notes.append(f"trtexec {plan.trt_version} cannot pin layers to FP32 ({len(plan.fp32_layers)} pins)")
    if v >= (8, 6):
        argv.append(f"--builderOptimizationLevel={plan.optimization_level}")
    argv.append(f"--timingCacheFile={plan.timing_cache}")
    if plan.dla_core is not None:
        argv.append(f"--useDLACore={plan.dla_core}")
        if plan.gpu_fallback:
            argv.append("--allowGPUFallback")
    return argv, notes


def trtexec_script(plan: BuildPlan) -> str:
    """A POSIX shell script that builds ``plan.engine`` with trtexec from inside the bundle folder."""
    argv, notes = trtexec_args(plan, trtexec="$TRTEXEC")
    quoted = ['"$TRTEXEC"'] + [shlex.quote(a) for a in argv[1:]]
    lines = [
        "#!/bin/sh",
        f"# Build {plan.engine} for target {plan.target} (TensorRT {plan.trt_version}), {plan.precision}"
        f" via {plan.strategy}.",
        "# Equivalent to the Python build in complete_bundle.py, which also validates the engine against the goldens.",
        *[f"# NOTE: {n}; use complete_bundle.py for an exact build." for n in notes],
        "set -eu",
        'cd "$(dirname "$0")"',
        f'TRTEXEC="${{TRTEXEC:-{DEFAULT_TRTEXEC}}}"',
        " \\\n    ".join(quoted),
        "",
    ]
    return "\n".join(lines)

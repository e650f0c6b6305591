"""OnnxFromFile: a model given as ONNX (``model.onnx``) becomes the build's model.onnx.

Its outputs are renamed to ``outputs`` when the config names them otherwise, the build's input spec goes
into ``metadata_props`` as an exported model's does, and it passes the same checks: the ONNX checker,
strict shape inference, and every named dim symbolic on the inputs.
"""

from __future__ import annotations

import json
from typing import Any

from edgedeploy import stagenames as names
from edgedeploy.artifacts import CHECKPOINT, MODEL_CODE, ONNX_MODEL
from edgedeploy.errors import StageError
from edgedeploy.onnxtools.export import check_onnx
from edgedeploy.onnxtools.outputs import rename_outputs
from edgedeploy.stages.base import BuildContext, Stage


class OnnxFromFile(Stage):
    name = names.EXPORT
    version = "1"
    produces = (ONNX_MODEL,)

    def inputs(self, ctx: BuildContext) -> tuple[str, ...]:
        # the given model's external-data files are in the model-code group (pipeline/runner.py)
        return (CHECKPOINT,) + ((MODEL_CODE,) if ctx.has_input(MODEL_CODE) else ())

    def config_key(self, ctx: BuildContext) -> Any:
        c = ctx.cfg.to_dict()
        return {"inputs": c["inputs"], "dims": c["dims"], "outputs": c["outputs"], "max_opset": ctx.target.max_opset}

    def run(self, ctx: BuildContext) -> dict[str, Any]:
        import onnx

        cfg = ctx.cfg
        source = ctx.path(CHECKPOINT)
        try:
            proto = onnx.load(str(source))  # external data, if any, from beside the file
        except Exception as exc:  # DecodeError, missing external data: the file is not a usable model
            why = f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
            raise StageError(self.name, f"{source} does not load as an ONNX model ({why})") from None
        opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 0)
        if opset > ctx.target.max_opset:
            raise StageError(
                self.name,
                f"{source.name} uses opset {opset}; target {ctx.target.name} runs opset {ctx.target.max_opset} at most",
                hint=f"export the model again with opset <= {ctx.target.max_opset}",
            )
        renamed = rename_outputs(proto, list(cfg.outputs))
        meta = {
            "edgedeploy.inputs": json.dumps(cfg.to_dict()["inputs"]),
            "edgedeploy.dims": json.dumps(cfg.to_dict()["dims"]),
            "edgedeploy.outputs": json.dumps(list(cfg.outputs)),
            "edgedeploy.source_onnx_sha256": ctx.sha256(CHECKPOINT),
            "edgedeploy.exporter": "given",
        }
        kept = [p for p in proto.metadata_props if not p.key.startswith("edgedeploy.")]
        del proto.metadata_props[:]
        proto.metadata_props.extend(kept)
        for key, value in meta.items():
            entry = proto.metadata_props.add()
            entry.key, entry.value = key, value
        onnx.save(proto, str(ctx.staging / ONNX_MODEL))
        check_onnx(ctx.staging / ONNX_MODEL, cfg, self.name)
        return {
            "exporter": "given",
            "source": str(source),
            "opset": opset,
            "renamed_outputs": renamed,
            "nodes": len(proto.graph.node),
            "ops": sorted({n.op_type for n in proto.graph.node}),
        }

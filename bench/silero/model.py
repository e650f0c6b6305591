"""Silero VAD v5 (16 kHz branch) as a PyTorch module over a whole waveform, real weights from its ONNX file.

The published model (``silero_vad.onnx``, shipped inside the ``livekit-plugins-silero`` wheel) is a streaming
graph: one call takes 512 new samples plus the last 64 samples of the previous call (576 in all) and the LSTM
state (h, c), and returns one speech probability. Its 16 kHz branch, read from the graph:

- STFT as a Conv1d with a fixed basis: reflection pad 64 on the right (576 -> 640), Conv1d(1 -> 258, kernel
  256, stride 128, no bias) -> 4 frames; channels 0..128 are the real parts, 129..257 the imaginary parts;
  magnitude sqrt(re^2 + im^2) -> (129, 4);
- encoder: four Conv1d(k=3, pad 1) + ReLU: 129 -> 128, 128 -> 64 (stride 2), 64 -> 64 (stride 2), 64 -> 128
  -> (128, 1);
- decoder: LSTMCell(128, 128) on that one vector with the carried (h, c), then ReLU, Conv1d(128, 1, 1), Sigmoid,
  and a mean over the single remaining frame.

Here the same computation runs on a batch of whole waveforms (B, T), T a multiple of 512: every 512-sample chunk
gets its 64 samples of context (zeros before the first), STFT and encoder run on all chunks at once, and an
``nn.LSTM`` (the LSTMCell's weights) runs over the chunk sequence from a zero state. The output is the per-chunk
speech probability (B, T / 512), equal to calling the ONNX model chunk by chunk with its state
(``bench/vad_silero.py`` prints the difference).

The factory builds the architecture with random weights; the real ones come in through edgedeploy's checkpoint
stage (``model.checkpoint``), written from the ONNX file by :func:`write_checkpoint`.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

CHUNK = 512  # new samples per call at 16 kHz
CONTEXT = 64  # samples of the previous chunk each call sees again
# The ONNX graph's constant names (16 kHz branch) -> this module's state-dict keys.
ONNX_WEIGHTS = {
    "stft.forward_basis_buffer": "stft_basis",
    "encoder.0.reparam_conv.weight": "encoder.0.weight",
    "encoder.0.reparam_conv.bias": "encoder.0.bias",
    "encoder.1.reparam_conv.weight": "encoder.2.weight",
    "encoder.1.reparam_conv.bias": "encoder.2.bias",
    "encoder.2.reparam_conv.weight": "encoder.4.weight",
    "encoder.2.reparam_conv.bias": "encoder.4.bias",
    "encoder.3.reparam_conv.weight": "encoder.6.weight",
    "encoder.3.reparam_conv.bias": "encoder.6.bias",
    "decoder.rnn.weight_ih": "lstm.weight_ih_l0",
    "decoder.rnn.weight_hh": "lstm.weight_hh_l0",
    "decoder.rnn.bias_ih": "lstm.bias_ih_l0",
    "decoder.rnn.bias_hh": "lstm.bias_hh_l0",
    "decoder.decoder.2.weight": "head.weight",
    "decoder.decoder.2.bias": "head.bias",
}


class SileroVad(nn.Module):
    """Per-chunk speech probability of 16 kHz waveforms: (B, T) -> (B, ceil(T / 512))."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("stft_basis", torch.zeros(258, 1, 256))
        self.encoder = nn.Sequential(
            nn.Conv1d(129, 128, 3, padding=1),
            nn.ReLU(),
            nn.Conv1d(128, 64, 3, stride=2, padding=1),
            nn.ReLU(),
            nn.Conv1d(64, 64, 3, stride=2, padding=1),
            nn.ReLU(),
            nn.Conv1d(64, 128, 3, padding=1),
            nn.ReLU(),
        )
        self.lstm = nn.LSTM(128, 128, batch_first=True)
        self.head = nn.Conv1d(128, 1, 1)

    def forward(self, audio: torch.Tensor) -> torch.Tensor:
        batch = audio.shape[0]
        # A last partial chunk is zero-padded (as silero-vad's own get_speech_timestamps does): any length works.
        audio = F.pad(audio, (0, (-audio.shape[1]) % CHUNK))
        chunks = audio.reshape(batch, -1, CHUNK)  # (B, N, 512)
        # Each chunk's context is the tail of the chunk before it (zeros before the first). Built by reshape and
        # concat rather than Tensor.unfold: the same frames, with a dynamic chunk count that every exporter keeps.
        previous = torch.cat([torch.zeros_like(chunks[:, :1, -CONTEXT:]), chunks[:, :-1, -CONTEXT:]], dim=1)
        frames = torch.cat([previous, chunks], dim=2).reshape(-1, 1, CONTEXT + CHUNK)  # (B*N, 1, 576)
        frames = F.pad(frames, (0, CONTEXT), mode="reflect")  # (B*N, 1, 640)
        spec = F.conv1d(frames, self.stft_basis, stride=128)  # (B*N, 258, 4)
        magnitude = torch.sqrt(spec[:, :129] ** 2 + spec[:, 129:] ** 2)
        features = self.encoder(magnitude)  # (B*N, 128, 1)
        sequence = features.reshape(batch, -1, 128)  # (B, N, 128)
        hidden, _ = self.lstm(sequence)
        logits = self.head(torch.relu(hidden).transpose(1, 2))  # (B, 1, N)
        return torch.sigmoid(logits[:, 0])


def build() -> SileroVad:
    """The model factory named in the bench's deploy config (``model:build``)."""
    return SileroVad().eval()


def onnx_weights(onnx_path: Path) -> dict[str, torch.Tensor]:
    """This module's state dict, read from the 16 kHz branch of ``silero_vad.onnx`` (weights are Constant nodes
    inside the top-level If's ``then_branch``, the ``sr == 16000`` side).

    Raises:
        ValueError: the graph is not the expected Silero VAD v5 layout (a weight is missing).
    """
    import onnx
    from onnx import numpy_helper

    graph = onnx.load(str(onnx_path)).graph
    branch = next(a.g for n in graph.node if n.op_type == "If" for a in n.attribute if a.name == "then_branch")
    found: dict[str, torch.Tensor] = {}
    prefix = "If_0_then_branch__Inline_0__"
    for node in branch.node:
        if node.op_type != "Constant" or not node.output[0].startswith(prefix):
            continue
        name = node.output[0][len(prefix) :]
        if name in ONNX_WEIGHTS:
            found[ONNX_WEIGHTS[name]] = torch.from_numpy(numpy_helper.to_array(node.attribute[0].t).copy())
    missing = sorted(set(ONNX_WEIGHTS.values()) - set(found))
    if missing:
        raise ValueError(f"{onnx_path}: not the Silero VAD v5 layout, missing {missing}")
    # The LSTMCell's gate order (i, f, g, o) is nn.LSTM's: its weights carry over unchanged.
    return found


def write_checkpoint(onnx_path: Path, path: Path) -> Path:
    """The ONNX file's weights as a safetensors checkpoint for :class:`SileroVad`. Returns ``path``.

    Raises:
        ValueError: the graph is not the expected layout.
    """
    from safetensors.torch import save_file

    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in onnx_weights(onnx_path).items()}, str(path))
    return path

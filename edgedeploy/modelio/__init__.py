"""The model side of a build: checkpoints, input specs, the PyTorch model and what it accepts."""

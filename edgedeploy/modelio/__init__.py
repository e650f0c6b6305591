"""Tools over PyTorch models and their inputs: capture routes, tracer-warning attribution, typed input
generators and Hugging Face model folders as a model source."""

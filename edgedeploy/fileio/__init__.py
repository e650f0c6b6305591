"""File handling shared by the pipeline: the output folder as a unit, confined paths, copies."""

"""Tools over PyTorch models and their inputs (layer 1).

Owns: checkpoint reading and model construction (``checkpoint``), seeded inputs (``inputs``)
and their typed generators (``generators``), goldens I/O (``goldens``), the one loader of user
code (``usercode``) and which loaded modules are the user's files (``userfiles``), torch helpers
(``torchutil``: quiet_torch, root_cause, flatten), capture routes (``capture``) and TracerWarning
attribution (``tracing``), Hugging Face model folders (``hf``), and what a model must satisfy before
a build runs it (``admission``: checkpoint dtypes, a dry forward at the min shape). May import
layer 0 (errors, config, artifacts, targets, hfspec), ``fileio`` and other ``modelio`` modules;
never stages, pipeline or domain packages.
"""

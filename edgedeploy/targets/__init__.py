"""Target profiles: frozen, typed data describing what each deployment target supports.

Plain data (layer 0): may import ``errors``, ``schema`` and ``runtimes`` only.
"""

from edgedeploy.targets.profiles import TargetProfile, all_targets, get_target, load_target_file

__all__ = ["TargetProfile", "all_targets", "get_target", "load_target_file"]

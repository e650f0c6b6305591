"""Running a build (layer 4): the runner, early refusals (``early``), library output to build.log
(``quiet``), the stage cache, manifest.json and the reports.

May import ``stages`` and everything below; only ``api`` and ``commands`` import this package.
"""

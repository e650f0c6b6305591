"""Code that runs on the deployment device (copied into bundles): no torch, no edgedeploy imports.

Layer 0: imports only the standard library (and numpy / polygraphy / tensorrt on the device), so it
also runs on the device's Python 3.6; the host imports it for the shared constants.
"""

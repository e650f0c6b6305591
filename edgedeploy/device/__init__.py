"""Code that runs on the deployment device (copied into bundles): no torch, no edgedeploy imports."""

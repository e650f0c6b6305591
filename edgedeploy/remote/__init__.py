"""The device step run from the build host: a bundle copied to a device over SSH, completed there, its results
fetched and checked (``deploy device run``).

``hosts``: ``[TARGET=]user@host[:port]`` specs and which output folder each completes; ``ssh``: one SSH
connection (paramiko; host keys only from known_hosts, key authentication only, timeouts), upload, a streamed
command, download; ``results``: what the device sent back, checked against the bundle the host built (a forged
or inconsistent result is an integrity error); ``step``: one host's whole device step.
"""

"""One module per ``deploy`` subcommand; each defines ``register(subparsers)`` (layer 5, the top).

May import anything below: ``pipeline``, ``stages``, domain packages, tools and plain data.
"""

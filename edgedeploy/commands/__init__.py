"""One module per ``deploy`` subcommand; each defines ``register(subparsers)``."""

"""Subcommands: each module has `register(subparsers)` and `main(args) -> int`."""

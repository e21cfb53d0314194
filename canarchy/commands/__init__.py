"""Command modules: each exposes ``add_parser(subparsers, parent)`` (see ``canarchy.cli``)."""

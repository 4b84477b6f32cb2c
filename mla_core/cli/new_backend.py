"""``mla-core new-backend NAME``: placeholder replaced below."""


def add_parser(subparsers) -> None:
    pass

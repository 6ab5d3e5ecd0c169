"""`python -m reconcile_host` and the `reconcile` console script."""

import sys


def main() -> None:
    args = sys.argv[1:]
    # The handshake of --host/--via (doors/remote.py) asks every target this before an apply:
    # answered without importing click and the CLI, a third of the interpreter's start-up.
    if args == ["version", "--json"]:
        import json

        from reconcile_host import version_document

        print(json.dumps(version_document()), flush=True)
        return
    # The audit run again and again (CI, the post-merge hook, an operator): its plain forms
    # (`diff [FILE] [--format F] [-v]`) without click either; everything else goes to click.
    if args[:1] == ["diff"]:
        import os

        from reconcile_host import commands

        plain = commands.read_plain_diff(args[1:], os.environ)
        if plain is not None:
            commands.diff_without_click(plain)
            return
    from reconcile_host.cli import main as cli_main

    cli_main()


if __name__ == "__main__":
    main()

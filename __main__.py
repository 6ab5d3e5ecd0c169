"""`python -m reconcile_host` and the `reconcile` console script."""

import sys


def main() -> None:
    # The handshake of --host/--via (machines/remote.py) asks every target this before an apply:
    # answered without importing click and the CLI, a third of the interpreter's start-up.
    if sys.argv[1:] == ["version", "--json"]:
        import json

        from reconcile_host import version_document

        print(json.dumps(version_document()), flush=True)
        return
    from reconcile_host.cli import main as cli_main

    cli_main()


if __name__ == "__main__":
    main()

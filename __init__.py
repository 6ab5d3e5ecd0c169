"""reconcile: declarative state reconciliation for GPU / ML hosts."""

__version__ = "0.1.0"
# The JSON report contract; minor changes are additive only.
FORMAT_VERSION = "1"


def version_document() -> dict[str, str]:
    """What `reconcile version --json` prints: the handshake of --host/--via (doors/remote.py).
    Here, not in cli.py, so that __main__.py answers it without importing click."""
    import os

    from .core.paths import default_journal_path

    return {"reconcile_version": __version__, "format_version": FORMAT_VERSION,
            "hostname": os.uname().nodename, "journal": str(default_journal_path())}

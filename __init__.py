"""reconcile: declarative state reconciliation for GPU / ML hosts."""

__version__ = "0.1.0"
# The JSON report contract; minor changes are additive only.
FORMAT_VERSION = "1"

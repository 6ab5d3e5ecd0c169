"""A stand-in for a GPU process: sets its process name (comm), optionally holds a
device-like file open and ignores SIGTERM, prints "ready", then waits to be killed.

    holder.py NAME TAG [--hold PATH] [--ignore-term]

TAG only has to appear in the command line: the fake NVML matches holders by it.
"""

import ctypes
import signal
import sys


def main() -> None:
    name, _tag = sys.argv[1], sys.argv[2]
    args = sys.argv[3:]
    # PR_SET_NAME (15): what /proc/PID/comm, ps and the kill globs see.
    ctypes.CDLL(None).prctl(15, name.encode()[:15], 0, 0, 0)
    held = []
    if "--hold" in args:
        held.append(open(args[args.index("--hold") + 1], "rb"))  # noqa: SIM115 - held until death
    if "--ignore-term" in args:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    print("ready", flush=True)
    while True:
        signal.pause()


if __name__ == "__main__":
    main()

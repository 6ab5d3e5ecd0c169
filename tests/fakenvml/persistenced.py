"""A stand-in nvidia-persistenced for the namespaced systemd, acting on the fake libnvidia-ml.

What the real daemon does to the GPUs (nvidia-persistenced(1)): it starts with persistence mode
enabled for all devices, unless `--no-persistence-mode` (as Ubuntu's packaged unit passes), and
forks into the background (NVIDIA's sample unit is Type=forking with a PID file); when it stops,
the GPUs' persistence goes with it.

    persistenced.py PIDFILE [--no-persistence-mode]
"""

import ctypes
import os
import signal
import sys

lib = ctypes.CDLL("libnvidia-ml.so.1")
pidfile = sys.argv[1]
if "--no-persistence-mode" not in sys.argv[2:] and lib.fake_nvml_persistenced(1) != 0:
    sys.exit("persistenced: the fake NVML has no configuration")
read, write = os.pipe()
if os.fork():  # the parent: exits once the daemon has written its PID file (Type=forking)
    os.close(write)
    os.read(read, 1)
    sys.exit(0)
os.setsid()
with open(pidfile, "w") as fh:
    fh.write(f"{os.getpid()}\n")
os.write(write, b"x")


def stop(*_):
    lib.fake_nvml_persistenced(0)
    os._exit(0)


signal.signal(signal.SIGTERM, stop)
while True:
    signal.pause()

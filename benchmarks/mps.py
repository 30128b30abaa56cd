"""A private CUDA MPS daemon for one emulation run (FINDINGS.md, "One GPU, many ranks").

Under MPS, several processes on one GPU run their kernels side by side instead of
time-slicing the GPU (measured on one H200: 4 NCCL ranks, 256 MiB, 435 ms -> 110 ms).
The daemon is private: its pipe and log folders live in /tmp/rr-mps-<pid> and reach
the ranks through CUDA_MPS_PIPE_DIRECTORY / CUDA_MPS_LOG_DIRECTORY, so it never meets
another user's daemon, and no GPU setting (compute mode included) is changed.

    with mps_daemon() as env:      # start; stopped on exit, error or SIGINT/SIGTERM
        subprocess.run(cmd, env={**os.environ, **env})

A run that was killed leaves its folder, and perhaps its daemon, behind; the next
start stops the daemon of every /tmp/rr-mps-<pid> whose pid is gone and removes the
folder.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

#: Where the lent GPU machines keep it (FINDINGS.md); PATH is the fallback.
CONTROL = "/usr/local/nvidia/bin/nvidia-cuda-mps-control"
PREFIX = "rr-mps-"


def control_binary() -> str | None:
    return CONTROL if os.access(CONTROL, os.X_OK) else shutil.which("nvidia-cuda-mps-control")


def folder_env(folder: Path) -> dict[str, str]:
    return {"CUDA_MPS_PIPE_DIRECTORY": str(folder / "pipe"),
            "CUDA_MPS_LOG_DIRECTORY": str(folder / "log")}


def quit_daemon(control: str, folder: Path) -> None:
    """Ask the daemon of ``folder`` to quit (it ends its servers first), then remove
    the folder. A folder without a live daemon just goes."""
    pipe = folder / "pipe"
    if pipe.is_dir() and any(pipe.iterdir()):  # a daemon made its pipes there
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            subprocess.run([control], input="quit\n", text=True, capture_output=True,
                           env={**os.environ, **folder_env(folder)}, timeout=30)
    shutil.rmtree(folder, ignore_errors=True)


def clean_leftovers(control: str) -> list[Path]:
    """Stop the daemons of killed runs: folders whose owner pid no longer exists."""
    gone = []
    for folder in Path(tempfile.gettempdir()).glob(PREFIX + "*"):
        pid = folder.name[len(PREFIX):]
        if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
            quit_daemon(control, folder)
            gone.append(folder)
    return gone


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's live process
    return True


@contextlib.contextmanager
def mps_daemon(control: str | None = None) -> Iterator[dict[str, str]]:
    """Start a private daemon (``control``: the nvidia-cuda-mps-control to use, default
    :func:`control_binary`); yield the variables every rank needs; stop it after,
    whatever happened (the caller turns SIGTERM into SystemExit so this runs)."""
    control = control or control_binary()
    if control is None:
        raise SystemExit(f"CUDA MPS requested but {CONTROL} is not there (nor "
                         "nvidia-cuda-mps-control on PATH); run without --mps on, or on a "
                         "GPU machine with the NVIDIA driver's MPS binaries")
    for folder in clean_leftovers(control):
        print(f"# mps: stopped the daemon of a killed run ({folder})", flush=True)
    folder = Path(tempfile.gettempdir()) / f"{PREFIX}{os.getpid()}"
    shutil.rmtree(folder, ignore_errors=True)
    for sub in ("pipe", "log"):
        (folder / sub).mkdir(parents=True)
    env = folder_env(folder)
    try:
        subprocess.run([control, "-d"], env={**os.environ, **env}, check=True)
        up = _wait_for_pipes(folder / "pipe")
        print(f"# mps: private daemon {'up' if up else 'started (no pipes seen yet)'}, "
              f"{folder}", flush=True)
        yield env
    finally:
        quit_daemon(control, folder)


def _wait_for_pipes(pipe: Path, seconds: float = 5.0) -> bool:
    """Whether the daemon (forked by ``-d``) made its pipes within ``seconds``; the
    ranks would otherwise start without MPS, silently time-slicing the GPU."""
    deadline = time.monotonic() + seconds
    while not any(pipe.iterdir()):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True

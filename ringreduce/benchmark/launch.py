"""Where this process sits in a job, as each launcher tells it (for the benchmark).

Launchers export rank and size under different names. This module maps them in one
place, in this order (the first that matches wins, so torchrun started inside an
``mpirun`` or ``srun`` allocation is still read as torchrun):

==========  =====================  ====================  ==========================
launcher    rank / world size      local rank / size     rendezvous
==========  =====================  ====================  ==========================
torchrun    RANK, WORLD_SIZE       LOCAL_RANK,           MASTER_ADDR, MASTER_PORT
                                   LOCAL_WORLD_SIZE
openmpi     OMPI_COMM_WORLD_RANK,  OMPI_COMM_WORLD_      see below
            OMPI_COMM_WORLD_SIZE   LOCAL_RANK/_SIZE
mpich       PMI_RANK, PMI_SIZE     MPI_LOCALRANKID,      see below
(Hydra,                            MPI_LOCALNRANKS
Intel MPI)
slurm       SLURM_PROCID,          SLURM_LOCALID,        see below
            SLURM_NTASKS           SLURM_(N)TASKS_PER_NODE
none        standalone: the benchmark spawns its own processes
==========  =====================  ====================  ==========================

MPI and Slurm jobs meet, in this order: at MASTER_ADDR/MASTER_PORT when both are
exported; else rank 0's host name and a free port broadcast with mpi4py when it is
installed (``pip install ringreduce[mpi]``); else, when every rank runs on this host
(local size == world size), in a FileStore under the temp folder named after the job
(``OMPI_MCA_ess_base_jobid``, ``PMIX_NAMESPACE``, ``PMI_JOBID`` or ``SLURM_JOB_ID``.
``SLURM_STEP_ID``; without any, the launcher's pid, the ranks' common parent); else the
error names both fixes. So a plain
``mpirun -np 4 python -m ringreduce.bench`` works on one host with nothing exported.

Slurm exports SLURM_NTASKS (and SLURM_PROCID=0) to every shell of an allocation, so
a plain ``python`` in an ``sbatch`` script or ``salloc`` shell would wait forever for
ranks that never start. Slurm counts as the launcher only when SLURM_PROCID is set,
SLURM_NTASKS > 1 and SLURM_STEP_ID is set (srun sets it; sbatch and salloc do not).
This module (not ringreduce.config) reads these variables because they describe the
benchmark's launch, not the library.

:func:`run_ranks` then joins the process group (nccl with one GPU per local rank, else
gloo) and runs a function on every rank; without a launcher it spawns the ranks itself.
"""

from __future__ import annotations

import importlib.util
import os
import pickle
import re
import socket
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

R = TypeVar("R")

#: (launcher, rank, world size, local rank, local size) variable names, in match order.
_LAUNCHERS = (
    ("torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"),
    ("openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
     "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"),
    ("mpich", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
    ("slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"),
)


@dataclass(frozen=True)
class Launch:
    """This process's place in the job; ``launcher == "standalone"`` when none."""

    launcher: str
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_size: int = 1
    master_addr: str | None = None
    master_port: int | None = None
    job_id: str = ""
    """What names this job among others on the host (for the file rendezvous)."""


def detect(environ: Mapping[str, str] | None = None) -> Launch:
    """Read the launcher's variables from ``environ`` (default: ``os.environ``)."""
    env = os.environ if environ is None else environ
    for name, rank, size, local_rank, local_size in _LAUNCHERS:
        if rank not in env or size not in env:
            continue
        if name == "slurm" and (_int(env, size) <= 1 or "SLURM_STEP_ID" not in env):
            continue
        return Launch(
            launcher=name,
            rank=_int(env, rank),
            world_size=_int(env, size),
            local_rank=_int(env, local_rank),
            local_size=_slurm_local_size(env) if name == "slurm" else _int(env, local_size),
            master_addr=env.get("MASTER_ADDR") or None,
            master_port=_int(env, "MASTER_PORT") if env.get("MASTER_PORT") else None,
            job_id=_job_id(name, env),
        )
    return Launch(launcher="standalone")


def init_method(launch: Launch) -> str:
    """The ``init_process_group`` URL for a launched job.

    torchrun gets ``env://`` because its agent already hosts the store on MASTER_PORT
    (workers must join it, not open their own). MPI and Slurm jobs: MASTER_ADDR /
    MASTER_PORT when exported, else mpi4py, else a file rendezvous on one host.
    """
    if launch.launcher == "torchrun":
        return "env://"
    if launch.master_addr and launch.master_port:
        return f"tcp://{launch.master_addr}:{launch.master_port}"
    if _has_mpi4py():
        addr, port = _mpi4py_rendezvous(launch)
        return f"tcp://{addr}:{port}"
    if launch.local_size == launch.world_size:
        return "file://" + rendezvous_file(launch)
    raise RuntimeError(
        f"{launch.launcher} job over several hosts ({launch.world_size} ranks, "
        f"{launch.local_size} on this one) without MASTER_ADDR/MASTER_PORT and without "
        "mpi4py, so rank 0's address cannot be shared; either `pip install mpi4py` "
        "(ringreduce[mpi]), or export both, e.g. `mpirun -x MASTER_ADDR=$(hostname) "
        "-x MASTER_PORT=29500 ...`")


def rendezvous_file(launch: Launch) -> str:
    """The FileStore path of a one-host MPI job: the same for every rank of the job,
    different for two jobs at once. The launcher's job id names it; without one, the
    ranks' common parent (the launcher, when it starts them directly). torch removes
    the file when the last rank leaves; a killed job can leave it behind, which only
    a later job with the same id would meet."""
    key = re.sub(r"[^A-Za-z0-9_.-]", "_", launch.job_id or f"ppid{os.getppid()}")
    return os.path.join(tempfile.gettempdir(),
                        f"ringreduce-{launch.launcher}-{os.getuid()}-{key}.store")


def _job_id(launcher: str, env: Mapping[str, str]) -> str:
    """The launcher's name for this job (Slurm: job and step, a job runs many steps)."""
    if launcher == "slurm":
        return ".".join(env.get(n, "") for n in ("SLURM_JOB_ID", "SLURM_STEP_ID"))
    names = {"openmpi": ("OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE"),
             "mpich": ("PMI_JOBID", "PMIX_NAMESPACE")}.get(launcher, ())
    return next((env[n] for n in names if env.get(n)), "")


def _has_mpi4py() -> bool:
    return importlib.util.find_spec("mpi4py") is not None


def nccl_variables(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The ``NCCL_*`` variables in effect, for the benchmark header: they change
    NCCL's numbers (sockets, host ids, protocols) as much as the code does."""
    env = os.environ if environ is None else environ
    return {k: v for k, v in sorted(env.items()) if k.startswith("NCCL_")}


def _mpi4py_rendezvous(launch: Launch) -> tuple[str, int]:
    """Rank 0 picks its host name and a free port; mpi4py broadcasts them."""
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    if comm.Get_size() != launch.world_size:
        raise RuntimeError(
            f"mpi4py sees {comm.Get_size()} ranks but the {launch.launcher} variables say "
            f"{launch.world_size}; export MASTER_ADDR/MASTER_PORT to skip mpi4py"
        )
    payload = (socket.gethostname(), free_port()) if comm.Get_rank() == 0 else None
    addr, port = comm.bcast(payload, root=0)
    return addr, port


def free_port() -> int:
    """A TCP port that was free a moment ago (the OS picks it: no fixed ports)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def _slurm_local_size(env: Mapping[str, str]) -> int:
    """Tasks on this node. SLURM_NTASKS_PER_NODE is set only with --ntasks-per-node;
    SLURM_TASKS_PER_NODE is always set, as "2(x3),1" (one entry per node, in
    SLURM_NODEID order)."""
    if env.get("SLURM_NTASKS_PER_NODE"):
        return _int(env, "SLURM_NTASKS_PER_NODE")
    raw = env.get("SLURM_TASKS_PER_NODE", "")
    counts: list[int] = []
    for count, repeat in re.findall(r"(\d+)(?:\(x(\d+)\))?", raw):
        counts += [int(count)] * int(repeat or 1)
    node = _int(env, "SLURM_NODEID") if "SLURM_NODEID" in env else 0
    if node >= len(counts):
        raise ValueError(
            f"cannot tell the tasks on this node from SLURM_TASKS_PER_NODE={raw!r} and "
            f"SLURM_NODEID={node}; launch with `srun --ntasks-per-node=N`"
        )
    return counts[node]


def _int(env: Mapping[str, str], name: str) -> int:
    raw = env.get(name)
    if raw is None:
        raise ValueError(f"{name} is not set but the other variables of its launcher are; "
                         "export it or launch with torchrun")
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not an integer") from None


def default_nprocs() -> int:
    """Ranks to spawn without a launcher: one per GPU, else 4 (2 machines x 2 on CPU)."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 4


def run_ranks(fn: Callable[[Launch, torch.device], R], nprocs: int | None = None, *,
              backend: str | None = None, cuda: bool | None = None) -> R:
    """Run ``fn(launch, device)`` on every rank inside an initialised process group and
    return rank 0's result (this rank's own under a launcher). ``backend`` replaces the
    default (nccl with CUDA, else gloo), e.g. ``"cpu:gloo,cuda:ringreduce"``;
    ``cuda=False`` keeps the ranks on CPU on a GPU host (default: CUDA when there)."""
    cuda = torch.cuda.is_available() if cuda is None else cuda
    launch = detect()
    if launch.launcher != "standalone":
        if nprocs is not None:
            raise ValueError(f"nprocs={nprocs} needs a run without a launcher; "
                             f"{launch.launcher} already started {launch.world_size} ranks")
        return _joined(fn, launch, init_method(launch), None, backend, cuda)
    n = nprocs or (default_nprocs() if cuda else 4)
    # A FileStore in a private folder, not TCP: no port to pick, none to collide.
    with tempfile.TemporaryDirectory(prefix="ringreduce-") as folder:
        mp.spawn(_spawned, args=(fn, n, folder, backend, cuda), nprocs=n)
        with open(os.path.join(folder, "result.pickle"), "rb") as f:
            return pickle.load(f)


def _spawned(index: int, fn: Callable[[Launch, torch.device], R], n: int, folder: str,
             backend: str | None, cuda: bool) -> None:
    store = dist.FileStore(os.path.join(folder, "store"), n)
    result = _joined(fn, Launch("standalone", index, n, index, n), None, store, backend, cuda)
    if index == 0:
        with open(os.path.join(folder, "result.pickle"), "wb") as f:
            pickle.dump(result, f)


def _joined(fn: Callable[[Launch, torch.device], R], launch: Launch, url: str | None,
            store: dist.Store | None, backend: str | None, cuda: bool) -> R:
    """nccl on GPU ``local_rank`` with CUDA, else gloo (or ``backend``); always torn down."""
    if cuda:
        if launch.local_rank >= torch.cuda.device_count():
            raise ValueError(f"local rank {launch.local_rank} but only "
                             f"{torch.cuda.device_count()} visible GPUs; start at most one "
                             "process per GPU (emulate.py shares GPUs across machines)")
        device = torch.device("cuda", launch.local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
        torch.set_num_threads(1)  # the ranks share the host's cores: avoid oversubscription
    # device_id binds (and eagerly connects) NCCL; a mixed backend string connects lazily.
    dist.init_process_group(backend or ("nccl" if cuda else "gloo"), init_method=url,
                            store=store, rank=launch.rank, world_size=launch.world_size,
                            device_id=device if cuda and backend is None else None)
    try:
        return fn(launch, device)
    finally:
        dist.destroy_process_group()

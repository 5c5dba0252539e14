"""Where this process sits in a run, read from the variables a launcher sets.

Pure logic over a mapping of environment variables, so it is tested in-process. It understands
``torch.distributed.run`` and ``accel launch`` (``RANK``/``WORLD_SIZE``/...), SLURM (``SLURM_*``)
and MPI launchers (Open MPI ``OMPI_COMM_WORLD_*``, MPICH/Intel MPI ``PMI_*``, MVAPICH ``MV2_*``).
`launch_topology()` reads what a scheduler (SLURM, a Kubernetes PyTorchJob) tells ``accel launch``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

DEFAULT_MASTER_ADDR = "127.0.0.1"
DEFAULT_MASTER_PORT = 29500


@dataclass(frozen=True)
class ProcessEnvironment:
    """Rank, world and rendezvous address of this process; ``source`` says which launcher set them.

    Args:
        rank: Global index of this process.
        world_size: Number of processes in the run.
        local_rank: Index of this process on its machine.
        local_world_size: Number of processes on this machine.
        master_addr: Address of the rendezvous host (process 0's machine).
        master_port: Port of the rendezvous.
        source: Which launcher set these values (`torchrun`, `mpi`, `slurm`, `single`, ...).
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    master_addr: str = DEFAULT_MASTER_ADDR
    master_port: int = DEFAULT_MASTER_PORT
    source: str = "single"

    def __post_init__(self) -> None:
        if self.world_size < 1:
            raise ValueError(f"world size must be at least 1, got {self.world_size} (from {self.source})")
        if not 0 <= self.rank < self.world_size:
            raise ValueError(
                f"rank {self.rank} is outside the world of {self.world_size} processes (from {self.source})"
            )
        if not 0 <= self.local_rank < max(self.local_world_size, 1):
            raise ValueError(
                f"local rank {self.local_rank} is outside the {self.local_world_size} local processes "
                f"(from {self.source})"
            )

    @property
    def is_distributed(self) -> bool:
        """True when more than one process takes part."""
        return self.world_size > 1

    def torch_variables(self) -> dict[str, str]:
        """The ``torch.distributed`` ``env://`` variables describing this process."""
        return {
            "RANK": str(self.rank),
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_RANK": str(self.local_rank),
            "LOCAL_WORLD_SIZE": str(self.local_world_size),
            "MASTER_ADDR": self.master_addr,
            "MASTER_PORT": str(self.master_port),
        }


def _int(env: Mapping[str, str], *keys: str, default: int | None = None) -> int | None:
    for key in keys:
        raw = env.get(key)
        if raw not in (None, ""):
            try:
                return int(str(raw).split("(")[0])
            except ValueError:
                raise ValueError(f"environment variable {key}={raw!r} must be an integer") from None
    return default


def first_slurm_host(nodelist: str) -> str:
    """First host name of a SLURM node list such as ``node[03-05,07],gpu1`` (here ``node03``)."""
    nodelist = nodelist.strip()
    match = re.match(r"^([^\[,]+)(?:\[([^\]]+)\])?", nodelist)
    if not match:
        raise ValueError(f"cannot read the SLURM node list {nodelist!r}")
    prefix, ranges = match.group(1), match.group(2)
    if ranges is None:
        return prefix
    first = ranges.split(",")[0].split("-")[0]
    return prefix + first


def detect(env: Mapping[str, str]) -> ProcessEnvironment:
    """The `ProcessEnvironment` described by ``env`` (a copy of ``os.environ``)."""
    addr = env.get("MASTER_ADDR") or DEFAULT_MASTER_ADDR
    port = _int(env, "MASTER_PORT", default=DEFAULT_MASTER_PORT) or DEFAULT_MASTER_PORT

    world = _int(env, "WORLD_SIZE")
    if world is not None and "RANK" in env:
        rank = _int(env, "RANK", default=0) or 0
        local_rank = _int(env, "LOCAL_RANK", default=rank if world == 1 else 0) or 0
        local_world = _int(env, "LOCAL_WORLD_SIZE", default=world) or world
        return ProcessEnvironment(rank, world, local_rank, local_world, addr, port, "torch")

    mpi_world = _int(env, "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MV2_COMM_WORLD_SIZE")
    if mpi_world is not None and mpi_world > 1:
        rank = _int(env, "OMPI_COMM_WORLD_RANK", "PMI_RANK", "MV2_COMM_WORLD_RANK", default=0) or 0
        local_rank = (
            _int(env, "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "MV2_COMM_WORLD_LOCAL_RANK", default=0) or 0
        )
        local_world = (
            _int(env, "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "MV2_COMM_WORLD_LOCAL_SIZE", default=mpi_world)
            or mpi_world
        )
        return ProcessEnvironment(rank, mpi_world, local_rank, local_world, addr, port, "mpi")

    slurm_world = _int(env, "SLURM_NTASKS")
    if slurm_world is not None and slurm_world > 1 and "SLURM_PROCID" in env:
        rank = _int(env, "SLURM_PROCID", default=0) or 0
        local_rank = _int(env, "SLURM_LOCALID", default=0) or 0
        per_node = _int(env, "SLURM_NTASKS_PER_NODE", default=None)
        nodes = _int(env, "SLURM_NNODES", "SLURM_JOB_NUM_NODES", default=1) or 1
        slurm_local_world = per_node if per_node is not None else max(slurm_world // nodes, 1)
        if not env.get("MASTER_ADDR") and env.get("SLURM_JOB_NODELIST"):
            addr = first_slurm_host(env["SLURM_JOB_NODELIST"])
        return ProcessEnvironment(rank, slurm_world, local_rank, slurm_local_world, addr, port, "slurm")

    return ProcessEnvironment(master_addr=addr, master_port=port)


@dataclass(frozen=True)
class LaunchTopology:
    """What a scheduler tells a launcher about the run it starts: machines, this machine's rank, where
    rank 0 listens, processes per machine. ``None`` where the scheduler says nothing; ``sources`` names
    the variable each value was read from (``{"num_machines": "PET_NNODES", ...}``).
    """

    scheduler: str
    num_machines: int | None = None
    machine_rank: int | None = None
    main_process_ip: str | None = None
    main_process_port: int | None = None
    nproc_per_machine: int | None = None
    job_id: str | None = None
    sources: Mapping[str, str] = field(default_factory=dict)
    #: True for the plain ``MASTER_ADDR``/``MASTER_PORT`` outside a known scheduler: they only fill in
    #: the address of a run that already has several machines and no address.
    fallback: bool = False


def _read(env: Mapping[str, str], out: dict[str, object], sources: dict[str, str], name: str, *keys: str) -> None:
    for key in keys:
        raw = env.get(key)
        if raw in (None, ""):
            continue
        if name == "main_process_ip":
            out[name] = str(raw).strip()
        elif name == "nproc_per_machine" and not str(raw).strip().isdigit():
            return  # torchrun's "auto", "gpu", "cpu": the launcher counts itself
        else:
            out[name] = _int(env, key)
        sources[name] = key
        return


def launch_topology(env: Mapping[str, str]) -> LaunchTopology | None:
    """The run a scheduler set up for ``accel launch``, or None outside one.

    Kubernetes (the Kubeflow training operator's PyTorchJob): ``PET_NNODES``, ``PET_NODE_RANK``,
    ``PET_NPROC_PER_NODE``, ``PET_MASTER_ADDR``/``PET_MASTER_PORT`` with the plain ``MASTER_ADDR``/
    ``MASTER_PORT`` as fall-back. SLURM (inside an allocation, ``SLURM_JOB_ID`` set): ``SLURM_NNODES``,
    ``SLURM_NODEID`` and the first host of ``SLURM_JOB_NODELIST``. ``PET_NNODES`` may be a range
    (``2:4``, elastic): its upper end is taken. Elsewhere, an exported ``MASTER_ADDR``/``MASTER_PORT``
    is returned as a fall-back (``fallback=True``) for a several-machine run given no address.

    Args:
        env: the environment to read (a copy of ``os.environ``).

    Returns:
        The `LaunchTopology`, or None when none of these variables is there.

    Raises:
        ValueError: a variable that must be a number is not one (the message names it).
    """
    out: dict[str, object] = {}
    sources: dict[str, str] = {}
    if env.get("PET_NNODES") not in (None, ""):
        nnodes = str(env["PET_NNODES"]).split(":")[-1]
        env = {**env, "PET_NNODES": nnodes}
        _read(env, out, sources, "num_machines", "PET_NNODES")
        _read(env, out, sources, "machine_rank", "PET_NODE_RANK")
        _read(env, out, sources, "main_process_ip", "PET_MASTER_ADDR", "MASTER_ADDR")
        _read(env, out, sources, "main_process_port", "PET_MASTER_PORT", "MASTER_PORT")
        _read(env, out, sources, "nproc_per_machine", "PET_NPROC_PER_NODE")
        return LaunchTopology("kubernetes", sources=sources, **out)  # type: ignore[arg-type]
    if env.get("SLURM_JOB_ID") not in (None, "") and env.get("SLURM_NNODES") not in (None, ""):
        _read(env, out, sources, "num_machines", "SLURM_NNODES")
        _read(env, out, sources, "machine_rank", "SLURM_NODEID")
        if env.get("SLURM_JOB_NODELIST"):
            out["main_process_ip"] = first_slurm_host(env["SLURM_JOB_NODELIST"])
            sources["main_process_ip"] = "SLURM_JOB_NODELIST"
        if env.get("MASTER_PORT"):
            _read(env, out, sources, "main_process_port", "MASTER_PORT")
        return LaunchTopology("slurm", job_id=str(env["SLURM_JOB_ID"]), sources=sources, **out)  # type: ignore[arg-type]
    if env.get("MASTER_ADDR") not in (None, ""):
        _read(env, out, sources, "main_process_ip", "MASTER_ADDR")
        _read(env, out, sources, "main_process_port", "MASTER_PORT")
        return LaunchTopology("environment", sources=sources, fallback=True, **out)  # type: ignore[arg-type]
    return None


def requeue_command(env: Mapping[str, str]) -> list[str] | None:
    """The command that puts this SLURM job back in the queue (``scontrol requeue $SLURM_JOB_ID``), or
    None outside a SLURM job. For a job array's task, the task's own id (``<array>_<task>``).

    Args:
        env: the environment to read (a copy of ``os.environ``).
    """
    array, task = env.get("SLURM_ARRAY_JOB_ID"), env.get("SLURM_ARRAY_TASK_ID")
    job = f"{array}_{task}" if array and task else env.get("SLURM_JOB_ID")
    if not job:
        return None
    return ["scontrol", "requeue", str(job)]

"""The launch a training process is part of, checked before anything loads, and the rendezvous that joins it.

A launcher environment that cannot be right used to end in silence or in a wait without end: `RANK=5
WORLD_SIZE=2` trained nothing and exited 0 (this process thought it was rank 5, Lightning trained it as rank 0
of 1), `num_nodes: 2` with no launcher waited for a node nobody would start. Here each such mistake is one
line naming the variables and the params key, and a launch that can be right meets its peers first thing,
within `trainer.rendezvous_timeout_s`, naming who did not arrive.

Launchers (docs/scaling.md): Lightning itself (no variables: it starts `devices` processes on this one node),
torchrun (`TORCHELASTIC_RUN_ID`, `RANK`, `WORLD_SIZE`, `LOCAL_WORLD_SIZE`), SLURM's srun (`SLURM_PROCID`,
`SLURM_NTASKS`, `SLURM_NTASKS_PER_NODE`), and any launcher that sets `LOCAL_RANK` (the deepspeed launcher:
`RANK`, `WORLD_SIZE`, `LOCAL_SIZE`, no `NODE_RANK`; the processes Lightning starts: `NODE_RANK`, `WORLD_SIZE`).
"""

from __future__ import annotations

import errno
import os
import socket
from dataclasses import dataclass
from datetime import timedelta
from typing import Mapping

import torch

from pipeline.config.trainer_config import TrainerConfig
from pipeline.errors import DraftlineError
from pipeline.process_tree import die_with_parent
from train.strategies import uses_gpu

INTEGER_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "LOCAL_SIZE", "NODE_RANK", "GROUP_RANK",
                     "SLURM_PROCID", "SLURM_NTASKS", "SLURM_NTASKS_PER_NODE", "MASTER_PORT")
FIX = "launch as docs/scaling.md shows, or unset them to train in one process"


class LaunchError(DraftlineError):
    """A launcher environment that cannot be right, or a rendezvous that did not complete."""


@dataclass(frozen=True)
class Launch:
    """Where this process sits: `launcher` is None when Lightning starts the processes itself."""

    launcher: str | None
    rank: int
    world_size: int  # the processes the params make: devices x num_nodes
    devices: int

    @property
    def external(self) -> bool:
        return self.launcher is not None


def _integers(env: Mapping[str, str]) -> dict[str, int]:
    values = {}
    for name in INTEGER_VARIABLES:
        if name in env:
            try:
                values[name] = int(env[name])
            except ValueError:
                raise LaunchError(f"{name}={env[name]!r} is not an integer; {FIX}") from None
    return values


def _devices(cfg: TrainerConfig) -> int:
    """`devices` as Lightning resolves it: 'auto' is every visible GPU, or one CPU process."""
    if isinstance(cfg.devices, int):
        return cfg.devices
    return max(1, torch.cuda.device_count()) if uses_gpu(cfg) else 1


def _launcher(env: Mapping[str, str]) -> str | None:
    if "TORCHELASTIC_RUN_ID" in env:
        return "torchrun"
    if "SLURM_NTASKS" in env and env.get("SLURM_JOB_NAME") not in ("bash", "interactive"):  # Lightning's srun test
        return "srun"
    if "LOCAL_RANK" in env:
        return "a launcher (LOCAL_RANK is set)"
    return None


def read_launch(cfg: TrainerConfig, section: str, env: Mapping[str, str] = os.environ) -> Launch:
    """This process's launch, or LaunchError naming what cannot be right about it."""
    values = _integers(env)
    for rank_name, size_name in (("RANK", "WORLD_SIZE"), ("SLURM_PROCID", "SLURM_NTASKS"),
                                 ("LOCAL_RANK", "LOCAL_WORLD_SIZE"), ("LOCAL_RANK", "LOCAL_SIZE")):
        rank, size = values.get(rank_name), values.get(size_name)
        if rank is not None and (rank < 0 or (size is not None and rank >= size)):
            raise LaunchError(f"{rank_name}={rank} with {size_name}={size}: a rank must be >= 0 and below the world "
                              f"size, so no process can have it; {FIX}")
    devices = _devices(cfg)
    expected = devices * cfg.num_nodes
    made = f"{section}.trainer makes devices {devices} x num_nodes {cfg.num_nodes} = {expected}"
    launcher = _launcher(env)
    if launcher is None:
        stray = [name for name in ("RANK", "WORLD_SIZE") if name in env]
        if stray:
            raise LaunchError(f"{' and '.join(f'{name}={env[name]}' for name in stray)} set, but no launcher started "
                              "this process (torchrun, srun and the deepspeed launcher also set LOCAL_RANK or their "
                              f"own variables), so Lightning would train it alone as rank 0; {FIX}")
        if cfg.num_nodes > 1:
            raise LaunchError(f"{section}.trainer.num_nodes is {cfg.num_nodes}, but no launcher started this process "
                              f"(no torchrun, srun or deepspeed variables), so the other {cfg.num_nodes - 1} node(s) "
                              "can never join; start every node with a launcher as docs/scaling.md shows, or set "
                              "num_nodes: 1")
        return Launch(None, 0, expected, devices)
    for local_name in ("LOCAL_WORLD_SIZE", "LOCAL_SIZE", "SLURM_NTASKS_PER_NODE"):
        if local_name in values and values[local_name] != devices:
            raise LaunchError(f"the launcher started {values[local_name]} processes on this node ({local_name}), but "
                              f"{section}.trainer.devices is {devices}; set devices: {values[local_name]}")
    world_name = "SLURM_NTASKS" if launcher == "srun" else "WORLD_SIZE"
    if world_name in values and values[world_name] != expected:
        raise LaunchError(f"the launcher started {values[world_name]} processes in all ({world_name}), but {made}; "
                          "set devices to the processes per node and num_nodes to the nodes")
    if launcher == "torchrun":
        rank = values["RANK"]
    elif launcher == "srun":
        rank = values["SLURM_PROCID"]
    else:
        # Lightning ranks these processes NODE_RANK x devices + LOCAL_RANK, whatever RANK says
        node = values.get("NODE_RANK", values.get("GROUP_RANK", 0))
        rank = node * devices + values["LOCAL_RANK"]
        if "RANK" in values and values["RANK"] != rank:
            raise LaunchError(f"RANK={values['RANK']}, but Lightning would train this process as rank {rank} "
                              f"(NODE_RANK {node} x devices {devices} + LOCAL_RANK {values['LOCAL_RANK']}), so two "
                              "processes would share a rank; set NODE_RANK on every node (the deepspeed launcher "
                              "does not)")
    return Launch(launcher, rank, expected, devices)


def check_port_free(env: Mapping[str, str] = os.environ) -> None:
    """The rendezvous port rank 0 will listen on (MASTER_PORT, when set) must not be taken already: otherwise
    the bind fails deep in torch.distributed, or a stale server from another run answers the peers."""
    if "MASTER_PORT" not in env:
        return  # Lightning picks a free one
    port = int(env["MASTER_PORT"])
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a port in TIME_WAIT is free to listen on
        try:
            probe.bind(("", port))
        except OSError as error:
            if error.errno != errno.EADDRINUSE:
                raise
            raise LaunchError(f"MASTER_PORT {port} is already in use on this machine (another training, or "
                              "another program, listens there); pick a free port for MASTER_PORT") from None


def _cluster_environment(launch: Launch):
    from lightning.fabric.plugins.environments import (
        LightningEnvironment,
        SLURMEnvironment,
        TorchElasticEnvironment,
    )

    if launch.launcher == "torchrun":
        return TorchElasticEnvironment()
    if launch.launcher == "srun":
        return SLURMEnvironment()
    environment = LightningEnvironment()
    environment.set_world_size(launch.world_size)
    environment.set_global_rank(launch.rank)
    return environment


def rendezvous(launch: Launch, cfg: TrainerConfig, section: str) -> None:
    """Join the process group now, before minutes of loading, so that a peer that never comes is one line
    after `rendezvous_timeout_s` rather than a wait without end. Only for externally launched processes:
    the ones Lightning starts itself do not exist yet (it starts them in `fit`, and watches them). Lightning
    and DeepSpeed then find the group initialized and use it; collectives get torch's default timeout back,
    since rank 0 alone evaluates while the others wait."""
    if not launch.external or launch.world_size == 1 or torch.distributed.is_initialized():
        return
    from lightning.fabric.plugins.collectives.torch_collective import default_pg_timeout
    from lightning.fabric.utilities.distributed import _init_dist_connection

    environment = _cluster_environment(launch)
    where = f"{environment.main_address}:{environment.main_port}"
    timeout = cfg.rendezvous_timeout_s
    try:
        _init_dist_connection(environment, "nccl" if uses_gpu(cfg) else "gloo", launch.rank, launch.world_size,
                              timeout=timedelta(seconds=timeout))
    except (torch.distributed.DistError, RuntimeError) as error:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise LaunchError(
            f"rank {launch.rank} of {launch.world_size}: the rendezvous at {where} did not complete within "
            f"{timeout:g} s ({reason}); every process of the {launch.world_size} ({section}.trainer: devices "
            f"{launch.devices} x num_nodes {cfg.num_nodes}) must start with the same MASTER_ADDR/MASTER_PORT: start "
            f"the missing node(s), or raise {section}.trainer.rendezvous_timeout_s") from None
    torch.distributed.distributed_c10d._set_pg_timeout(default_pg_timeout)


def join_launch(cfg: TrainerConfig, section: str) -> Launch:
    """Check this process's launch and meet its peers: what training does before anything else.

    A process an external launcher started dies with it: torchrun starts its workers in sessions of their own,
    so a SIGKILLed torchrun (the OOM killer, `kill -9`, a lost node's agent) used to leave them training on as
    orphans, holding the checkpoint lock and writing outputs for a run nobody waits for."""
    launch = read_launch(cfg, section)
    if launch.external:
        die_with_parent()
    if launch.world_size > 1 and launch.rank == 0 and launch.launcher != "torchrun":  # torchrun's agent holds it
        check_port_free()
    rendezvous(launch, cfg, section)
    return launch

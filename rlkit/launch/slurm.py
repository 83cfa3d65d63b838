"""`rlkit train CONFIG --slurm`: one sbatch job that runs every role of a run on its nodes.

The job allocates `trainer_nodes + inference_nodes` nodes. The first `trainer_nodes` run the
trainer (one `rlkit train --role trainer` per node, torchrun's c10d rendezvous at the first
node's address, `[trainer] nnodes / node_rank / rdzv_endpoint`); the orchestrator runs beside the
trainer on that head node; the other nodes run `--role inference` (`inference.num_servers`
servers each, from `inference.base_port`, bound to all interfaces), and the orchestrator gets
their URLs. Every role reads the same resolved config from the run directory, which must be on a
filesystem all nodes share (batches, weights and checkpoints go through it).

The servers listen on the cluster network, so each refuses every request without the run's
token: `launch` creates it (`run_dir/token`, mode 0600, or `inference.token_file`) before
submitting, every role reads it from there, and neither the script nor any command line holds
it.

`render_sbatch` only builds text; `launch` writes the script and the config into
`run_dir/slurm/` and calls `sbatch` (a clear error when it is not installed).
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path

from rlkit.errors import SystemRequirementError, UsageError
from rlkit.launch.config import RLJobConfig
from rlkit.launch.slurm_config import SlurmConfig
from rlkit.orchestrator.config import run_token_file
from rlkit.orchestrator.state import check_fresh_run_dir
from rlkit.protocol.credentials import ensure_token_file, read_token
from rlkit.protocol.layout import RunLayout

DEFAULT_INFERENCE_PORT = 8000
DEFAULT_SANDBOX_PORT = 8790  # each inference node's sandbox service with `[sandbox] serve`


def _q(value: str | Path) -> str:
    return shlex.quote(str(value))


def srun_prefix(slurm: SlurmConfig, nodes: str, count: str | int, *, gpus: bool) -> str:
    """The `srun` launching one task per node on `nodes` (a shell expression)."""
    parts = [
        "srun",
        f"--nodes={count}",
        f"--ntasks={count}",  # one per node (the job's own SLURM_NTASKS would apply otherwise)
        "--ntasks-per-node=1",
        f'--nodelist="{nodes}"',
        "--overlap",
        "--kill-on-bad-exit=1",
    ]
    if slurm.cpus_per_node:
        parts.append(f"--cpus-per-task={slurm.cpus_per_node}")
    if gpus and slurm.gres:
        parts.append(f"--gres={slurm.gres}")
    if slurm.container_image:
        parts.append(f"--container-image={_q(slurm.container_image)}")
        if slurm.container_mounts:
            parts.append(f"--container-mounts={_q(','.join(slurm.container_mounts))}")
        parts.append('--container-workdir="$RLKIT_WORKDIR"')
    return " ".join(parts)


def render_sbatch(
    cfg: RLJobConfig, config_path: Path, *, workdir: Path, resume: bool = False
) -> str:
    """The sbatch script for `cfg`, whose resolved config is at `config_path`."""
    slurm = cfg.slurm
    run_dir = Path(cfg.log.run_dir)
    inf = cfg.inference
    port = inf.base_port or DEFAULT_INFERENCE_PORT
    nodes = slurm.trainer_nodes + slurm.inference_nodes
    header = [
        "#!/bin/bash",
        f"#SBATCH --job-name={slurm.job_name}",
        f"#SBATCH --nodes={nodes}",
        "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --time={slurm.time}",
        f"#SBATCH --chdir={workdir}",
        f"#SBATCH --output={run_dir}/slurm/%j.out",
    ]
    if slurm.partition:
        header.append(f"#SBATCH --partition={slurm.partition}")
    if slurm.account:
        header.append(f"#SBATCH --account={slurm.account}")
    if slurm.gres:
        header.append(f"#SBATCH --gres={slurm.gres}")
    if slurm.cpus_per_node:
        header.append(f"#SBATCH --cpus-per-task={slurm.cpus_per_node}")
    if slurm.exclusive:
        header.append("#SBATCH --exclusive")
    header += [f"#SBATCH {arg}" for arg in slurm.sbatch_args]

    env = {"PYTHONUNBUFFERED": "1", **slurm.env}
    setup = [f"cd {_q(workdir)}", f"export RLKIT_WORKDIR={_q(workdir)}"]
    setup += [f"export {key}={_q(value)}" for key, value in env.items()]
    if slurm.venv:
        setup.append(f"source {_q(Path(slurm.venv) / 'bin' / 'activate')}")
    setup += slurm.setup
    resume_flag = " --resume" if resume else ""
    # every role reads the same trainer layout (the config is checked whole in each of them);
    # the node rank is the trainer node's own
    rlkit_cmd = (
        f"rlkit train {_q(config_path)} --trainer.nnodes={slurm.trainer_nodes} "
        '--trainer.rdzv_endpoint="$RLKIT_RDZV_ENDPOINT"'
    )
    trainer_cmd = f"exec {rlkit_cmd} --role trainer{resume_flag} --trainer.node_rank=$SLURM_NODEID"
    inference_cmd = (
        f"{rlkit_cmd} --role inference --inference.host=0.0.0.0 --inference.base_port={port}"
    )
    orchestrator_cmd = (
        f'{rlkit_cmd} --role orchestrator{resume_flag} --inference.urls="$RLKIT_INFERENCE_URLS"'
    )
    # `[sandbox] serve`: each inference node's role starts that node's sandbox service too (on
    # every interface, the run's sandbox token), and the orchestrator's programs go to its own
    # and to those
    sandbox_port = cfg.sandbox.serve_port or DEFAULT_SANDBOX_PORT
    sandbox_urls = ""
    if cfg.sandbox.serve:
        inference_cmd += f" --sandbox.serve_host=0.0.0.0 --sandbox.serve_port={sandbox_port}"
        orchestrator_cmd += ' --sandbox.service_urls="$RLKIT_SANDBOX_URLS"'
        sandbox_urls = f'  sandbox_urls+=("\\"http://$address:{sandbox_port}\\"")\n'
    trainer_srun = srun_prefix(slurm, "$TRAINER_NODES", slurm.trainer_nodes, gpus=True)
    inference_srun = srun_prefix(slurm, "$INFERENCE_NODES", slurm.inference_nodes, gpus=True)
    head_srun = srun_prefix(slurm, "$HEAD_NODE", 1, gpus=False)
    token_file = run_token_file(cfg)
    body = f"""
# rlkit train {run_dir} on {nodes} nodes: trainer on {slurm.trainer_nodes}, inference on \
{slurm.inference_nodes}; the orchestrator beside the trainer on the head node.
# Rendered by `rlkit train --slurm`; the config every role reads: {config_path}
# The servers bind every interface and answer only holders of the run's token
# ({token_file}, mode 0600, never in this script); every role reads it there.
set -uo pipefail
{chr(10).join(setup)}

mapfile -t NODES < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
TRAINER_NODES=$(IFS=,; echo "${{NODES[*]:0:{slurm.trainer_nodes}}}")
INFERENCE_NODES=$(IFS=,; echo "${{NODES[*]:{slurm.trainer_nodes}:{slurm.inference_nodes}}}")
HEAD_NODE=${{NODES[0]}}
node_address() {{  # the node's first IP address (node names need not resolve everywhere)
  srun --nodes=1 --ntasks=1 --overlap --nodelist="$1" hostname -I | awk '{{print $1}}'
}}
export RLKIT_RDZV_ENDPOINT="$(node_address "$HEAD_NODE"):{slurm.rdzv_port}"
urls=()
sandbox_urls=()
for node in "${{NODES[@]:{slurm.trainer_nodes}:{slurm.inference_nodes}}}"; do
  address=$(node_address "$node")
  for ((i = 0; i < {inf.num_servers}; i++)); do
    urls+=("\\"http://$address:$(({port} + i))\\"")
  done
{sandbox_urls}done
export RLKIT_INFERENCE_URLS="[$(IFS=,; echo "${{urls[*]}}")]"
export RLKIT_SANDBOX_URLS="[$(IFS=,; echo "${{sandbox_urls[*]}}")]"
echo "trainer nodes: $TRAINER_NODES (rendezvous $RLKIT_RDZV_ENDPOINT)"
echo "inference nodes: $INFERENCE_NODES ($RLKIT_INFERENCE_URLS)"

{inference_srun} \\
  {inference_cmd} &
INFERENCE_PID=$!
{trainer_srun} \\
  bash -c '{trainer_cmd}' &
TRAINER_PID=$!
{head_srun} \\
  {orchestrator_cmd}
status=$?
if [ $status -ne 0 ]; then kill $TRAINER_PID 2>/dev/null; fi
wait $TRAINER_PID
trainer_status=$?
kill $INFERENCE_PID 2>/dev/null  # the servers serve until stopped
wait $INFERENCE_PID
if [ $status -eq 0 ]; then status=$trainer_status; fi
exit $status
"""
    return "\n".join(header) + "\n" + body


def job_paths(run_dir: Path) -> tuple[Path, Path]:
    """Where the resolved config and the sbatch script go: `run_dir/slurm/`."""
    return run_dir / "slurm" / "config.toml", run_dir / "slurm" / "job.sbatch"


def check_slurm(cfg: RLJobConfig) -> None:
    """What a cluster job cannot do, as usage errors naming the field."""
    if cfg.inference.urls:
        raise UsageError(
            "inference.urls: a --slurm job starts its own servers on the inference nodes; "
            "leave it empty"
        )
    if cfg.slurm.venv and cfg.slurm.container_image:
        raise UsageError("slurm.venv: set either slurm.venv or slurm.container_image, not both")


def launch(cfg: RLJobConfig, *, resume: bool = False, dry_run: bool = False) -> str:
    """`rlkit train --slurm`: the script (dry run), or write it and submit it with sbatch."""
    check_slurm(cfg)
    workdir = Path(cfg.slurm.workdir or Path.cwd()).resolve()
    run_dir = workdir / cfg.log.run_dir  # where the roles will see it (they start in workdir)
    config_path, script = job_paths(run_dir)
    text = render_sbatch(cfg, config_path, workdir=workdir, resume=resume)
    if dry_run:
        return text
    if not resume:
        check_fresh_run_dir(run_dir)
    sbatch = sbatch_path(script)  # before writing: a machine without SLURM gets nothing written
    RunLayout(run_dir).create()
    script.parent.mkdir(exist_ok=True)
    if cfg.inference.token_file:  # the roles' credential, before any of them starts
        read_token(cfg.inference.token_file)
    else:
        ensure_token_file(RunLayout(run_dir).token)
    config_path.write_text(cfg.to_toml())
    script.write_text(text)
    return f"{submit(sbatch, script)} ({script})"


def sbatch_path(script: Path) -> str:
    sbatch = shutil.which("sbatch")
    if sbatch is None:
        raise SystemRequirementError(
            "sbatch not found: --slurm needs a SLURM client on this machine (Debian/Ubuntu: "
            f"apt-get install slurm-client); add --dry-run to print the job script {script}"
        )
    return sbatch


def submit(sbatch: str, script: Path) -> str:
    """`sbatch SCRIPT`; returns sbatch's reply ("Submitted batch job N")."""
    done = subprocess.run([sbatch, str(script)], capture_output=True, text=True)
    if done.returncode != 0:
        raise UsageError(f"sbatch {script} failed: {(done.stderr or done.stdout).strip()}")
    return done.stdout.strip()

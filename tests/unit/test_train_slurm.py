"""`rlkit train CONFIG --slurm`: the sbatch script of the multi-node examples, run for real.

The rendered script is executed by bash with stand-ins for the SLURM tools on PATH: `scontrol`
lists the job's nodes, `srun` runs its command once per node of `--nodelist` (with the
`SLURMD_NODENAME` / `SLURM_NODEID` SLURM sets) and answers `hostname -I` with a per-node address,
and `rlkit` records its arguments and environment. So the test sees the commands each node
would run: roles, node lists, rendezvous address, server URLs, environment. A real one-machine
SLURM cluster runs a job end to end in tests/integration/test_slurm_cluster.py.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

import pytest

from rlkit.config import load_config
from rlkit.launch.config import RLJobConfig
from rlkit.protocol.credentials import read_token
from tests.helpers.cli import ROOT, run_cli

TWO_NODE = ROOT / "examples/multi-node/two-node.toml"
EIGHT_NODE = ROOT / "examples/multi-node/eight-node.toml"

FAKE_SRUN = r"""#!/usr/bin/env python3
import json, os, re, subprocess, sys
args = sys.argv[1:]
opts = {}
while args and args[0].startswith("--"):
    key, _, value = args.pop(0)[2:].partition("=")
    opts[key] = value
nodes = opts["nodelist"].split(",")
assert len(nodes) == int(opts["nodes"]), (nodes, opts)
if args[:2] == ["hostname", "-I"]:
    print("10.0.0.%s 172.17.0.1" % re.sub(r"\D", "", nodes[0]))
    sys.exit(0)
with open(os.environ["FAKE_SLURM_LOG"], "a") as log:
    log.write(json.dumps({"srun": opts, "command": args}) + "\n")
for rank, node in enumerate(nodes):
    env = {**os.environ, "SLURMD_NODENAME": node, "SLURM_NODEID": str(rank)}
    subprocess.run(args, env=env, check=True)
"""

FAKE_RLKIT = r"""#!/usr/bin/env python3
import json, os, sys, time
keep = ("SLURMD_NODENAME", "PYTHONUNBUFFERED", "HF_HOME", "NCCL_DEBUG", "VENV_ACTIVATED", "PWD")
path = os.environ["FAKE_SLURM_LOG"]
with open(path, "a") as log:
    env = {k: os.environ.get(k) for k in keep}
    log.write(json.dumps({"rlkit": sys.argv[1:], "env": env, "cwd": os.getcwd()}) + "\n")
if sys.argv[sys.argv.index("--role") + 1] == "orchestrator":
    # a real orchestrator runs until training ends, long after every server started; the
    # stand-in returns at once, so it waits for the servers before the script stops them
    servers, deadline = int(os.environ["FAKE_SLURM_SERVERS"]), time.monotonic() + 30
    while time.monotonic() < deadline:
        with open(path) as log:
            argvs = [json.loads(line).get("rlkit") or [] for line in log if line.endswith("\n")]
        roles = [a[a.index("--role") + 1] for a in argvs if "--role" in a]
        if roles.count("inference") >= servers:
            break
        time.sleep(0.05)
"""


def executable(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def fake_cluster(tmp_path: Path, nodes: list[str], servers: int) -> tuple[dict[str, str], Path]:
    """PATH with fake scontrol / srun / rlkit, a fake venv; returns (environment, log path).

    `servers`: how many inference stand-ins the stand-in orchestrator waits for.
    """
    bin_dir = tmp_path / "fakebin"
    bin_dir.mkdir()
    executable(bin_dir / "scontrol", "#!/bin/sh\nprintf '%s\\n' " + " ".join(nodes) + "\n")
    executable(bin_dir / "srun", FAKE_SRUN)
    venv_bin = tmp_path / "venv" / "bin"
    venv_bin.mkdir(parents=True)
    executable(venv_bin / "rlkit", FAKE_RLKIT)
    (venv_bin / "activate").write_text(f'export VENV_ACTIVATED=1\nexport PATH="{venv_bin}:$PATH"\n')
    log = tmp_path / "calls.jsonl"
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "FAKE_SLURM_LOG": str(log),
        "SLURM_JOB_NODELIST": "ignored-by-fake-scontrol",
        "FAKE_SLURM_SERVERS": str(servers),
    }
    return env, log


def render(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, config: Path, *overrides: str
) -> str:
    code, out = run_cli(
        monkeypatch, capsys, "train", str(config), "--slurm", "--dry-run", *overrides
    )
    assert code in (0, None), out
    return out


def run_script(script: str, tmp_path: Path, env: dict[str, str]) -> None:
    path = tmp_path / "job.sbatch"
    path.write_text(script)
    done = subprocess.run(["bash", str(path)], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def calls(log: Path) -> tuple[list[dict], list[dict]]:
    records = [json.loads(line) for line in log.read_text().splitlines()]
    return [r for r in records if "srun" in r], [r for r in records if "rlkit" in r]


def by_role(rlkit_calls: list[dict]) -> dict[str, list[dict]]:
    roles: dict[str, list[dict]] = {}
    for call in rlkit_calls:
        argv = call["rlkit"]
        roles.setdefault(argv[argv.index("--role") + 1], []).append(call)
    return roles


def test_two_node_example_script(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, tmp_path: Path
) -> None:
    workdir = tmp_path / "work"
    workdir.mkdir()
    env, log = fake_cluster(tmp_path, ["gpu1", "gpu2"], servers=1)
    run_dir = tmp_path / "run"
    script = render(
        monkeypatch,
        capsys,
        TWO_NODE,
        f"--log.run_dir={run_dir}",
        f"--slurm.workdir={workdir}",
        f"--slurm.venv={tmp_path / 'venv'}",
        "--slurm.time=02:30:00",  # TOML reads a time here: sbatch gets the text
    )
    assert not run_dir.exists(), "--dry-run wrote something"
    header = [line for line in script.splitlines() if line.startswith("#SBATCH")]
    for option in (
        "--nodes=2",
        "--partition=gpu",
        "--account=my-project",
        "--time=02:30:00",
        "--gres=gpu:8",
        "--exclusive",
        f"--output={run_dir}/slurm/%j.out",
        f"--chdir={workdir}",
    ):
        assert f"#SBATCH {option}" in header

    run_script(script, tmp_path, env)
    sruns, rlkit_calls = calls(log)
    assert sorted(s["srun"]["nodelist"] for s in sruns) == ["gpu1", "gpu1", "gpu2"]
    roles = by_role(rlkit_calls)
    config = str(run_dir / "slurm" / "config.toml")
    (trainer,) = roles["trainer"]
    assert trainer["env"]["SLURMD_NODENAME"] == "gpu1"  # the head node
    assert trainer["rlkit"][:2] == ["train", config]
    assert "--trainer.nnodes=1" in trainer["rlkit"]
    assert "--trainer.node_rank=0" in trainer["rlkit"]
    assert "--trainer.rdzv_endpoint=10.0.0.1:29500" in trainer["rlkit"]  # gpu1: the head node
    (server,) = roles["inference"]
    assert server["env"]["SLURMD_NODENAME"] == "gpu2"
    assert "--inference.host=0.0.0.0" in server["rlkit"]
    assert "--inference.base_port=8000" in server["rlkit"]
    (orchestrator,) = roles["orchestrator"]
    assert orchestrator["env"]["SLURMD_NODENAME"] == "gpu1"
    urls = [f"http://10.0.0.2:{8000 + i}" for i in range(8)]  # 8 servers on gpu2
    assert (
        orchestrator["rlkit"][-1] == f"--inference.urls={json.dumps(urls, separators=(',', ':'))}"
    )
    for call in rlkit_calls:  # every role sees the same trainer layout
        assert "--trainer.nnodes=1" in call["rlkit"]
        assert "--trainer.rdzv_endpoint=10.0.0.1:29500" in call["rlkit"]
        assert call["cwd"] == str(workdir)
        assert call["env"]["VENV_ACTIVATED"] == "1"
        assert call["env"]["HF_HOME"] == "/shared/hf"
        assert call["env"]["NCCL_DEBUG"] == "WARN"
        assert call["env"]["PYTHONUNBUFFERED"] == "1"
    gpu_sruns = [s for s in sruns if s["srun"].get("gres") == "gpu:8"]
    assert len(gpu_sruns) == 2  # trainer and inference steps; the orchestrator needs no GPU
    # every role reads the same resolved config: the one the CLI resolved
    resolved = load_config(RLJobConfig, TWO_NODE, [f"--log.run_dir={run_dir}"])
    assert resolved.orchestrator.schedulers["c3po"]["capacity"] == 1024


def run_eight_node_example(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, tmp_path: Path, *extra: str
) -> tuple[str, dict[str, list[dict]]]:
    """The eight-node example's script (with `extra` overrides), run on a fake cluster without
    its container options (no pyxis here): the script and the rlkit calls by role."""
    nodes = [f"n{i}" for i in range(1, 9)]
    env, log = fake_cluster(tmp_path, nodes, servers=4)
    script = render(
        monkeypatch,
        capsys,
        EIGHT_NODE,
        f"--log.run_dir={tmp_path / 'run'}",
        f"--slurm.workdir={tmp_path}",
        *extra,
    )
    plain = script.replace("--container-image=/shared/images/rlkit.sqsh", "")
    plain = plain.replace("--container-mounts=/shared:/shared", "")
    plain = plain.replace('--container-workdir="$RLKIT_WORKDIR"', "")
    env["PATH"] = f"{tmp_path / 'venv' / 'bin'}:{env['PATH']}"
    run_script(plain, tmp_path, env)
    return script, by_role(calls(log)[1])


def test_eight_node_example_script(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, tmp_path: Path
) -> None:
    script, roles = run_eight_node_example(monkeypatch, capsys, tmp_path)
    assert "#SBATCH --nodes=8" in script
    assert "--container-image=/shared/images/rlkit.sqsh" in script
    trainers = sorted(roles["trainer"], key=lambda c: c["env"]["SLURMD_NODENAME"])
    assert [c["env"]["SLURMD_NODENAME"] for c in trainers] == ["n1", "n2", "n3", "n4"]
    ranks = [next(a for a in c["rlkit"] if a.startswith("--trainer.node_rank=")) for c in trainers]
    assert ranks == [f"--trainer.node_rank={i}" for i in range(4)]
    for call in trainers:
        assert "--trainer.nnodes=4" in call["rlkit"]
        assert "--trainer.rdzv_endpoint=10.0.0.1:29500" in call["rlkit"]
    servers = sorted(c["env"]["SLURMD_NODENAME"] for c in roles["inference"])
    assert servers == ["n5", "n6", "n7", "n8"]
    (orchestrator,) = roles["orchestrator"]
    urls = [f"http://10.0.0.{i}:8000" for i in range(5, 9)]  # one data-parallel server per node
    assert (
        orchestrator["rlkit"][-1] == f"--inference.urls={json.dumps(urls, separators=(',', ':'))}"
    )


def test_sandbox_serve_starts_a_service_on_every_inference_node(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, tmp_path: Path
) -> None:
    """`[sandbox] serve`: each inference node's role serves its sandbox service on every
    interface, and the orchestrator sends programs to those (besides its own)."""
    _, roles = run_eight_node_example(monkeypatch, capsys, tmp_path, "--sandbox.serve=true")
    for call in roles["inference"]:
        assert "--sandbox.serve_host=0.0.0.0" in call["rlkit"]
        assert "--sandbox.serve_port=8790" in call["rlkit"]
    (orchestrator,) = roles["orchestrator"]
    urls = [f"http://10.0.0.{i}:8790" for i in range(5, 9)]
    assert (
        f"--sandbox.service_urls={json.dumps(urls, separators=(',', ':'))}" in orchestrator["rlkit"]
    )
    assert not any("--sandbox.serve_host" in arg for arg in orchestrator["rlkit"])


def test_submit_writes_the_job_and_calls_sbatch(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, tmp_path: Path
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    executable(
        bin_dir / "sbatch",
        f'#!/bin/sh\necho "$@" > {tmp_path}/sbatch.args\necho "Submitted batch job 42"\n',
    )
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    run_dir = tmp_path / "run"
    code, out = run_cli(
        monkeypatch, capsys, "train", str(TWO_NODE), "--slurm", f"--log.run_dir={run_dir}"
    )
    assert code in (0, None), out
    script = run_dir / "slurm" / "job.sbatch"
    assert "Submitted batch job 42" in out and str(script) in out
    assert (tmp_path / "sbatch.args").read_text().split() == [str(script)]
    assert "--role trainer" in script.read_text()
    # the servers on the cluster network answer only the run's token, created before submitting
    token = read_token(run_dir / "token")
    assert (run_dir / "token").stat().st_mode & 0o777 == 0o600
    assert run_dir.stat().st_mode & 0o777 == 0o700  # weights, rollouts: the run's alone
    assert "--inference.host=0.0.0.0" in script.read_text() and "run's token" in script.read_text()
    assert (
        token not in script.read_text() and token not in (run_dir / "slurm/config.toml").read_text()
    )
    written = load_config(RLJobConfig, run_dir / "slurm" / "config.toml", [])
    assert written.log.run_dir == str(run_dir) and written.slurm.trainer_nodes == 1

    # a second submission into the same run directory would mix two runs
    (run_dir / "metrics.jsonl").write_text("")
    code, out = run_cli(
        monkeypatch, capsys, "train", str(TWO_NODE), "--slurm", f"--log.run_dir={run_dir}"
    )
    assert code == 2 and "already holds a run" in out


def test_sbatch_rejection_is_reported(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, tmp_path: Path
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    executable(
        bin_dir / "sbatch",
        "#!/bin/sh\necho 'sbatch: error: invalid partition specified: gpu' >&2\nexit 1\n",
    )
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    code, out = run_cli(
        monkeypatch, capsys, "train", str(TWO_NODE), "--slurm", f"--log.run_dir={tmp_path}/r"
    )
    assert code == 2
    assert "invalid partition specified: gpu" in out


def test_without_sbatch_nothing_is_written(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no sbatch anywhere
    run_dir = tmp_path / "run"
    code, out = run_cli(
        monkeypatch, capsys, "train", str(TWO_NODE), "--slurm", f"--log.run_dir={run_dir}"
    )
    assert code == 1
    assert "sbatch not found" in out and "--dry-run" in out
    assert not run_dir.exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (['--inference.urls=["http://x:8000"]'], "inference.urls"),
        (["--slurm.container_image=img.sqsh"], "slurm.venv"),  # the example sets a venv
        (["--slurm.trainer_nodes=0"], "slurm.trainer_nodes"),
        (["--role", "trainer"], "--role"),
    ],
)
def test_bad_slurm_settings_are_usage_errors(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
    tmp_path: Path,
    args: list[str],
    message: str,
) -> None:
    code, out = run_cli(monkeypatch, capsys, "train", str(TWO_NODE), "--slurm", "--dry-run", *args)
    assert code == 2, out
    assert message in out

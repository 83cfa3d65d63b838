"""The run directory: every file the processes of one `rlkit train` run hand each other.

The orchestrator, the trainer, the launcher and `rlkit runs` meet only in `run_dir` (a shared
filesystem works across machines), so its layout is the contract between them, written here
once. Per-step files are named `step_{N:06d}` (`step_name`), so they sort by step:

    config.toml                 the resolved job config (`rlkit train`)
    batches/step_N.pt           orchestrator -> trainer: the batch of step N (`protocol.batch`)
    weights/step_N/             trainer -> servers: policy version N, `STABLE` when complete
    checkpoints/step_N/         the trainer's resumable state; `checkpoints/latest` names one
    orchestrator/step_N.json    the orchestrator's state after step N (prompt sampler, ledger)
    metrics.jsonl, metrics.png  one orchestrator record per step (`rlkit runs show`), plotted
    trainer_metrics.jsonl       one trainer record per step, written before its weights
    trainer_costs.jsonl         seconds the trainer spent exporting, checkpointing, resuming
    samples.jsonl, eval.jsonl   sample rollouts, interleaved evaluations (`eval/step_N.jsonl`)
    STOP, TRAINER_FAILED        notes between the processes (`protocol.handoff`)
    COMPLETE                    the run trained to max_steps (`launch.resume`)
    resumes.jsonl               one line per `--resume`: the step it continued from
    .doorbells/                 wake-ups between the processes (`protocol.handoff`)
    logs/, pids.json            the launcher's per-process logs and process ids
    token                       the run's credential for its servers, mode 0600
    final/, sft_metrics.jsonl   `rlkit sft`'s trained model and its per-step records
    trainer.toml                the trainer process's own config (`trainer-nodeR.toml`)
"""

from __future__ import annotations

from pathlib import Path

STEP_PREFIX = "step_"


def step_name(step: int) -> str:
    """The stem of step `step`'s files and folders: `step_000012`."""
    return f"{STEP_PREFIX}{step:06d}"


def step_of(path: Path) -> int:
    """N of a run-directory file or folder named `step_N[.suffix]`."""
    return int(path.name.split(".")[0].removeprefix(STEP_PREFIX))


def _step_dirs(folder: Path) -> list[Path]:
    return sorted((p for p in folder.glob(f"{STEP_PREFIX}*") if p.is_dir()), key=step_of)


class RunLayout:
    """Paths of one run directory, the same on every side of the run: `RunLayout(run_dir)`."""

    def __init__(self, run_dir: str | Path) -> None:
        self.root = root = Path(run_dir)
        self.config = root / "config.toml"
        self.batches = root / "batches"  # orchestrator -> trainer
        self.weights = root / "weights"  # trainer -> inference servers
        self.checkpoints = root / "checkpoints"  # the trainer's resumable state
        self.latest_checkpoint_pointer = self.checkpoints / "latest"
        self.orchestrator_states = root / "orchestrator"  # the orchestrator's resumable state
        self.metrics = root / "metrics.jsonl"
        self.metrics_plot = root / "metrics.png"
        self.trainer_metrics = root / "trainer_metrics.jsonl"
        self.trainer_costs = root / "trainer_costs.jsonl"
        self.samples = root / "samples.jsonl"
        self.evals = root / "eval.jsonl"
        self.doorbells = root / ".doorbells"
        self.stop = root / "STOP"
        self.trainer_failed = root / "TRAINER_FAILED"
        self.complete = root / "COMPLETE"
        self.resumes = root / "resumes.jsonl"
        self.logs = root / "logs"
        self.pids = root / "pids.json"
        self.token = root / "token"  # the run's credential, mode 0600 (`protocol.credentials`)
        self.sandbox_token = root / "sandbox.token"  # `[sandbox] serve`'s service, mode 0600
        self.sft_metrics = root / "sft_metrics.jsonl"
        self.sft_model = root / "final"  # `rlkit sft`'s model, published like a weights version

    def create(self) -> Path:
        """The run directory, created private (0700): its weights, checkpoints, rollouts and
        token are the run's alone. One that exists keeps its mode (its owner chose it)."""
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        return self.root

    def batch(self, step: int) -> Path:
        return self.batches / f"{step_name(step)}.pt"

    def batch_files(self) -> list[Path]:
        """Every batch file, by step."""
        return sorted(self.batches.glob(f"{STEP_PREFIX}*.pt"), key=step_of)

    def weights_version(self, step: int) -> Path:
        """The folder of policy version `step` (complete once `handoff.is_published`)."""
        return self.weights / step_name(step)

    def weights_versions(self) -> list[Path]:
        """Every published (or partly written) weights folder, by step."""
        return _step_dirs(self.weights)

    def checkpoint(self, step: int) -> Path:
        return self.checkpoints / step_name(step)

    def checkpoint_dirs(self) -> list[Path]:
        """Every finished checkpoint folder, by step."""
        return _step_dirs(self.checkpoints)

    def latest_checkpoint(self) -> Path | None:
        """The checkpoint the `latest` pointer names (None when the run has none yet)."""
        if not self.latest_checkpoint_pointer.is_file():
            return None
        return self.checkpoints / self.latest_checkpoint_pointer.read_text().strip()

    def orchestrator_state(self, step: int) -> Path:
        return self.orchestrator_states / f"{step_name(step)}.json"

    def orchestrator_state_files(self) -> list[Path]:
        return sorted(self.orchestrator_states.glob(f"{STEP_PREFIX}*.json"), key=step_of)

    def eval_rollouts(self, step: int) -> Path:
        return self.root / "eval" / f"{step_name(step)}.jsonl"

    def process_log(self, name: str) -> Path:
        return self.logs / f"{name}.log"

    def process_config(self, name: str) -> Path:
        """The resolved config a launched process reads (`trainer.toml`)."""
        return self.root / f"{name}.toml"

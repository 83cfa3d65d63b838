"""The configuration of an eval run (what `rlkit eval` flags map to)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field

from rlkit.config import Config
from rlkit.envs.sampling import SamplingConfig, SamplingLayer, resolve_sampling
from rlkit.ports import INFERENCE_PORT
from rlkit.sandbox.config import SandboxConfig

# Fields that decide which results a run produces; `--resume` refuses a run where any differs.
# Where the model is served (base URL, key, timeouts, concurrency) can change between attempts.
RESULT_FIELDS = (
    "env_id",
    "env_args",
    "model",
    "num_examples",
    "rollouts_per_example",
    "max_tokens",
    "temperature",
    "sampling",
    "verifiers_version",
)


class EvalConfig(Config):
    """One evaluation of a model on an environment through an OpenAI-compatible API."""

    env_id: str = Field(
        "",
        description="Environment id, e.g. reverse-text, owner/name@1.0, or dist:package.module "
        "(the module that has load_environment).",
    )
    env_args: dict[str, Any] = Field(
        default_factory=dict, description="Keyword arguments for the environment's loader."
    )
    verifiers_version: str | None = Field(
        None,
        description="Exact verifiers version for a verifiers environment (None: the newest "
        "tested version its declared range allows).",
    )
    install: bool = Field(
        False,
        description="Install a NAME found nowhere from the package index (the user's consent; "
        "OWNER/NAME hub ids are always installed).",
    )
    model: str = Field("", description="Model name sent to the API.")
    base_url: str = Field(
        f"http://127.0.0.1:{INFERENCE_PORT}/v1", description="OpenAI-compatible base URL."
    )
    api_key_var: str = Field(
        "OPENAI_API_KEY", description="Environment variable holding the API key (unset: no key)."
    )
    token_file: str | None = Field(
        None,
        description="Token file of an `rlkit infer` server (mode 0600); its token is sent as "
        "the API key instead of api_key_var's.",
    )
    num_examples: int = Field(5, ge=1, description="Number of dataset rows to evaluate.")
    rollouts_per_example: int = Field(3, ge=1, description="Rollouts per row (k of avg@k).")
    max_concurrent: int = Field(
        32, ge=1, description="Maximum rollouts in flight (whole groups; at least one group)."
    )
    max_tokens: int | None = Field(None, ge=1, description="Max completion tokens per turn.")
    temperature: float | None = Field(None, ge=0, description="Sampling temperature.")
    sampling: SamplingConfig = Field(
        default_factory=SamplingConfig,
        description="Sampling arguments (-S); they override max_tokens/temperature and the "
        "environment's defaults.",
    )
    timeout: float = Field(600.0, gt=0, description="Per-request timeout in seconds.")
    max_retries: int = Field(5, ge=0, description="Retries on 429/5xx/timeouts per request.")
    pass_threshold: float = Field(1.0, description="A rollout passes when its score >= this.")
    pass_metric: str | None = Field(
        None, description="Metric used for pass@k instead of the reward."
    )
    output_dir: Path = Field(Path("runs/eval"), description="Folder that receives run folders.")
    sandbox: SandboxConfig = Field(
        default_factory=SandboxConfig, description="Sandbox for untrusted code the env runs."
    )

    def result_fields(self) -> dict[str, Any]:
        """The part of the config that must match for a run to be resumed."""
        return self.model_dump(mode="json", include=set(RESULT_FIELDS))

    def sampling_args(self, *below: SamplingLayer) -> dict[str, Any]:
        """`resolve_sampling`: the layers `below` (the environment's defaults, its package's)
        < -t/-T < the -S JSON."""
        flags = SamplingConfig(max_tokens=self.max_tokens, temperature=self.temperature)
        return resolve_sampling(*below, flags, self.sampling)


def layered_eval_config(
    flags: dict[str, Any],
    *,
    resume: Path | None = None,
    config_file: Path | None = None,
    overrides: list[str] | None = None,
) -> EvalConfig:
    """The eval's config from its layers, later ones winning: the resumed run's stored config,
    the `--config` TOML file, the flags given (None: not given), dotted `--field value`
    overrides. A UsageError names a bad field, or says that no environment is named."""
    from rlkit.config import apply_override, parse_overrides, read_toml, validate
    from rlkit.errors import UsageError
    from rlkit.eval.store import RunStore

    stored = RunStore(resume).read_metadata().config if resume is not None else {}
    from_file = read_toml(config_file) if config_file is not None else {}
    given = {key: value for key, value in flags.items() if value is not None}
    data = {**stored, **from_file, **given}
    for key, value in parse_overrides(overrides or []):
        apply_override(data, key, value)
    if not data.get("env_id"):
        raise UsageError(
            "missing ENV_ID: rlkit eval ENV_ID -m MODEL (or --config FILE, or --resume RUN_DIR)"
        )
    return validate(EvalConfig, data, source=str(config_file or "eval options"))

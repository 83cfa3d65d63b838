"""Deprecated: the verifiers adapter is `rlkit.envs.vf_adapter` (a module named like the package
it adapts shadowed it in tracebacks and `import verifiers` reasoning)."""

from rlkit.deprecated import moved_names

__getattr__ = moved_names(
    __name__,
    {
        name: f"rlkit.envs.vf_adapter:{name}"
        for name in ("SUPPORTED_VERSIONS", "VerifiersEnv", "is_verifiers_env", "wrap_verifiers_env")
    },
)

"""verifiers' own evaluation of one environment, run by a bridge venv's python (never rlkit's).

    <venv>/bin/python vf_reference.py MODULE FOLDER BASE_URL NUM_EXAMPLES

prints one JSON line: `[{"reward": r, "error": e}, ...]` per example in dataset order, from
`env.evaluate` as each verifiers era spells it (0.1.3 sync, 0.1.9 async with an `AsyncOpenAI`,
0.2/0.3 async with a `ClientConfig`). The tests compare rlkit's bridged rewards with these.
"""

import asyncio
import importlib
import inspect
import json
import sys


def _error(error: object) -> str | None:
    """A rollout's error as text (verifiers 0.1.9 keeps exception objects, often messageless)."""
    return None if error is None else repr(error)


def main() -> None:
    module_name, folder, base_url, num_examples = sys.argv[1:5]
    sys.path.insert(0, folder)
    env = importlib.import_module(module_name).load_environment()
    n = int(num_examples)
    from openai import AsyncOpenAI

    params = inspect.signature(env.evaluate).parameters
    client_type = str(params["client"].annotation)
    if "ClientConfig" in client_type:  # 0.1.10+ client layer (0.2, 0.3 legacy)
        import verifiers as vf

        client = vf.ClientConfig(api_base_url=base_url, api_key_var="RLKIT_REFERENCE_KEY")
    else:
        client = AsyncOpenAI(base_url=base_url, api_key="EMPTY")
    result = env.evaluate(client, "fake-model", {"max_tokens": 256}, num_examples=n)
    if inspect.iscoroutine(result):
        result = asyncio.run(result)
    if isinstance(result, dict) and "outputs" in result:  # 0.2+: one record per rollout
        rows = [{"reward": o["reward"], "error": _error(o.get("error"))} for o in result["outputs"]]
    else:
        rewards = result["reward"] if isinstance(result, dict) else result.reward
        states = result["state"] if isinstance(result, dict) else result.state
        pairs = zip(rewards, states, strict=True)
        rows = [{"reward": r, "error": _error((s or {}).get("error"))} for r, s in pairs]
    print(json.dumps(rows))


if __name__ == "__main__":
    main()

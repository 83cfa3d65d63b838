"""verifiers 0.3.x: the 0.2 state loop, moved under `verifiers.legacy`.

0.3 keeps the classic stack in `verifiers.legacy` (its `vf-init` template writes
`import verifiers.legacy as vf`) and answers the old top-level paths (`vf.Environment`,
`verifiers.clients`, ...) with the same legacy objects through an import alias, so the 0.2 shim's
checks and client wrapper hold for environments written either way. Rollouts, scoring and the
client layer are 0.2.0's (only import paths changed). `verifiers.v1` tasksets of this era are not
loaded (0.4's shim runs tasksets).
"""

from __future__ import annotations

import verifiers.legacy  # noqa: F401  (fails early, naming the module, if the venv is not 0.3)
from shim_v02 import Shim as V02Shim


class Shim(V02Shim):
    era = "0.3.x legacy"

"""The libraries some tests compare rlkernels with (its peers), and running the suite without them.

PEERS are the top-level packages of the `[integrations]` extra (TRL, Liger-Kernel, and what verl 0.9.1's
core_algos imports: ray, tensordict, omegaconf, codetiming, orjson), verl itself (installed with
`--no-deps`, README), and the other libraries tests compare with (cut-cross-entropy, vLLM). A test that needs
one skips, naming it, where it is not installed: `pytest.importorskip`, or `missing_peer` for code that
imports several modules (the README's examples).

`RLK_TEST_WITHOUT_PEERS=1` (read by conftest.py) runs the suite as on a machine without them, such as the
lent GPU machines (docs/testing.md): `block()` puts None under each name in `sys.modules`, which makes
`import verl` (and `import verl.<anything>`) raise ModuleNotFoundError and `importlib.util.find_spec("verl")`
return None, as for a package that is not installed. The processes that tests start (torchrun, mp.spawn)
do not inherit it; none of them imports a peer.
"""

from __future__ import annotations

import ast
import importlib
import os
import sys

PEERS = (
    "verl", "trl", "liger_kernel", "cut_cross_entropy", "vllm",
    "ray", "tensordict", "omegaconf", "codetiming", "orjson",
)  # fmt: skip
SWITCH = "RLK_TEST_WITHOUT_PEERS"


def requested() -> bool:
    """Whether this run is to behave as if the peers were not installed (RLK_TEST_WITHOUT_PEERS=1)."""
    return os.environ.get(SWITCH, "") not in ("", "0")


def block() -> None:
    """Make every peer unimportable for the rest of this process. Raises RuntimeError if one is already
    imported (too late to hide it)."""
    loaded = sorted({m.split(".")[0] for m in sys.modules if m.split(".")[0] in PEERS})
    if loaded:
        raise RuntimeError(f"{SWITCH}: {', '.join(loaded)} already imported before the switch took effect")
    for name in PEERS:
        sys.modules[name] = None


def missing_peer(source: str) -> str | None:
    """The first peer that the Python code `source` needs and cannot import (directly, or through a module
    of its own imports that imports it), or None. A missing module that is not a peer raises: the code
    is broken, not skippable."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules = [node.module]
        else:
            continue
        for module in modules:
            try:
                importlib.import_module(module)
            except ModuleNotFoundError as e:
                top = (e.name or "").split(".")[0]
                if top in PEERS:
                    return top
                raise
    return None

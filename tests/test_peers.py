"""tests/peers.py: RLK_TEST_WITHOUT_PEERS's block() hides every peer as an uninstalled package is hidden,
and the adapters that import a peer then fail with an ImportError that names what to install; missing_peer
finds the peer a piece of code needs and does not mistake a broken import for a missing peer."""

import pathlib
import subprocess
import sys

import pytest
from peers import PEERS, missing_peer

TESTS = pathlib.Path(__file__).resolve().parent

WITHOUT_PEERS = """
import importlib.util
import peers

peers.block()
for name in peers.PEERS:
    assert importlib.util.find_spec(name) is None, name
    try:
        __import__(name + ".sub")
    except ModuleNotFoundError as e:
        assert e.name.split(".")[0] == name, e
    else:
        raise AssertionError(name + " imported")
assert peers.missing_peer("import torch\\nfrom verl.trainer.ppo import core_algos") == "verl"
assert peers.missing_peer("from rlkernels.integrations.trl_grpo import GRPOTrainer") == "trl"
try:
    import rlkernels.integrations.trl_grpo
except ModuleNotFoundError as e:
    assert e.name == "trl" and "pip install 'rlkernels[integrations]'" in str(e), e
else:
    raise AssertionError("trl_grpo imported without TRL")
from rlkernels.integrations import verl as rk_verl  # its functions need no verl; install() does
try:
    rk_verl.install()
except ModuleNotFoundError as e:
    assert e.name == "verl" and "verl==0.9.1" in str(e) and "rlkernels[integrations]" in str(e), e
else:
    raise AssertionError("install() ran without verl")
print("ok")
"""


def test_block_hides_every_peer_and_the_adapters_say_what_to_install():
    """In a fresh process (block() lasts for the process): each peer's modules raise ModuleNotFoundError
    (for a submodule: "'verl' is not a package"), find_spec returns None, and the adapters raise theirs."""
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_PEERS], capture_output=True, text=True, cwd=TESTS, timeout=300
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]


def test_block_refuses_when_a_peer_is_already_imported():
    code = "import sys, peers; sys.modules['verl'] = type(sys)('verl'); peers.block()"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=TESTS, timeout=60)
    assert done.returncode != 0 and "verl already imported" in done.stderr


def test_missing_peer():
    assert missing_peer("import math\nfrom os import path\nx = 1") is None
    with pytest.raises(ModuleNotFoundError, match="rlk_no_such_module"):
        missing_peer("import rlk_no_such_module")  # not a peer: the code is broken, not skippable
    assert "rlk_no_such_module" not in PEERS

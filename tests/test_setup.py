"""setup.py's decisions and its progress, without building: when the CUDA sources are compiled (not on a
machine without a GPU unless RLKERNELS_CUDA=1), and the lines that reach the terminal past pip's captured
output (ninja's steps in short, a heartbeat, the raw output still on stdout for `pip install -v`)."""

import importlib.util
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def setup_py():
    spec = importlib.util.spec_from_file_location("rlkernels_setup", ROOT / "setup.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # not __main__: defines the helpers, builds nothing
    return module


def _never():
    raise AssertionError("gpu_visible() asked where the environment decides")


def test_cuda_sources_need_a_gpu_unless_forced(setup_py):
    plan = setup_py.cuda_plan
    toolkit = dict(torch_cuda="13.0", cuda_home="/usr/local/cuda")
    assert plan({}, **toolkit, gpu_visible=lambda: True)[0] is True
    with_cuda, line = plan({}, **toolkit, gpu_visible=lambda: False)
    assert (
        with_cuda is False and "no GPU is visible" in line and "RLKERNELS_CUDA=1 builds them anyway" in line
    )
    assert plan({"RLKERNELS_CUDA": "1"}, **toolkit, gpu_visible=_never) == (
        True, "rlkernels: building the CPU and CUDA kernels (RLKERNELS_CUDA=1)"
    )  # fmt: skip
    assert plan({"RLKERNELS_CUDA": "0"}, **toolkit, gpu_visible=_never)[0] is False
    with_cuda, line = plan({}, torch_cuda=None, cuda_home="/usr/local/cuda", gpu_visible=_never)
    assert with_cuda is False and line.endswith("torch is a CPU-only build")
    with pytest.raises(RuntimeError, match="RLKERNELS_CUDA=1 but .* no CUDA toolkit"):
        plan({"RLKERNELS_CUDA": "1"}, torch_cuda="13.0", cuda_home=None, gpu_visible=_never)


def test_setup_py_states_its_plan_for_this_machine(setup_py):
    """`python setup.py --name` runs the same decision as pip's build: its line is cuda_plan's for this
    machine's torch, toolkit and GPU."""
    env = {k: v for k, v in os.environ.items() if k not in ("RLKERNELS_CUDA", "RLKERNELS_NO_EXT")}
    out = subprocess.run(
        [sys.executable, "setup.py", "--name"], cwd=ROOT, env=env, capture_output=True, text=True, check=True
    ).stdout
    _, line = setup_py.cuda_plan(env, torch.version.cuda, setup_py._find_cuda_home(), torch.cuda.is_available)
    assert out.splitlines()[0] == line


def test_ninja_steps_in_short(setup_py):
    """ninja's lines as torch's build writes them (its flags end in -c, then the rule's own -c)."""
    step = setup_py.ninja_step
    src = ROOT / "csrc" / "cpu" / "kl.cpp"
    assert step(f"[rlkernels 3/13, 45.2s] c++ -MMD -MF x.o.d -O3 -c -c {src} -o /b/kl.o -std=c++20") == (
        "rlkernels: [3/13, 45 s] compiled csrc/cpu/kl.cpp"
    )  # fmt: skip
    cu = ROOT / "csrc" / "cuda" / "kl.cu"
    assert step(f"[rlkernels 1/31, 0.0s] /usr/local/cuda/bin/nvcc -O3 -c {cu} -o k.cuda.o") == (
        "rlkernels: [1/31, 0 s] compiled csrc/cuda/kl.cu"
    )  # fmt: skip
    assert step("[rlkernels 2/2, 9.0s] touch stamp") == "rlkernels: [2/2, 9 s] touch"
    assert step("csrc/cpu/kl.cpp:12: warning: unused variable") is None


def test_progress_reaches_the_terminal_and_stdout_keeps_everything(setup_py, tmp_path, capfd):
    """A stand-in for ninja writing to file descriptor 1, as torch runs it: each step reaches the terminal
    (here a file) as one short line, a silence longer than the heartbeat as a 'still compiling' line, and
    everything it wrote still reaches descriptor 1."""
    fake_ninja = textwrap.dedent(f"""
        import time
        print("kl.cpp:1: warning: something", flush=True)
        print("[rlkernels 1/2, 0.1s] c++ -c -c {ROOT}/csrc/cpu/kl.cpp -o kl.o", flush=True)
        time.sleep(0.6)
        print("[rlkernels 2/2, 0.7s] c++ -c -c {ROOT}/csrc/cpu/gae.cpp -o gae.o", flush=True)
    """)  # fmt: skip
    terminal = setup_py.Terminal(str(tmp_path / "tty"))
    with setup_py.ninja_progress(terminal, heartbeat_s=0.25):
        subprocess.run([sys.executable, "-c", fake_ninja], check=True)
    terminal.tty.close()
    text = (tmp_path / "tty").read_bytes().decode()
    # "\n" first, off pip's spinner line; then "\r" before each line, over the spinner's character.
    assert text.startswith("\nrlkernels: ") and text.count("\n\rrlkernels: ") == text.count("\n") - 2
    lines = text.replace("\r", "").strip("\n").split("\n")
    assert lines[0] == "rlkernels: [1/2, 0 s] compiled csrc/cpu/kl.cpp"
    assert lines[-1] == "rlkernels: [2/2, 1 s] compiled csrc/cpu/gae.cpp"
    assert any(line.startswith("rlkernels: still compiling, ") for line in lines[1:-1])
    assert not any("warning" in line for line in lines)
    out = capfd.readouterr().out
    assert "kl.cpp:1: warning: something" in out and "[rlkernels 2/2, 0.7s]" in out


def test_without_a_terminal_nothing_is_redirected(setup_py, tmp_path, capfd):
    terminal = setup_py.Terminal(str(tmp_path / "missing" / "tty"))  # cannot be opened: no terminal
    assert terminal.tty is None
    with setup_py.ninja_progress(terminal):
        os.write(1, b"[rlkernels 0/1, 0.0s] c++ -c x.cpp -o x.o\n")
    terminal.line("rlkernels: a plan")
    assert capfd.readouterr().out == "[rlkernels 0/1, 0.0s] c++ -c x.cpp -o x.o\nrlkernels: a plan\n"

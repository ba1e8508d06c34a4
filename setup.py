"""Build rlkernels' C++ extension `rlkernels._C`.

- The C++ CPU kernels (csrc/rlkernels.cpp, csrc/cpu/*.cpp) and the C++ autograd nodes over the native ops
  (csrc/autograd/*.cpp, device-agnostic) are always built.
- The CUDA kernels (csrc/cuda/*.cu + *_binding.cpp) are added when `nvcc`, a CUDA build of torch and a GPU
  are present. Without a GPU visible to torch they are left out, and the build says so: they could not run
  there, and compiling them for two architectures takes minutes. `RLKERNELS_CUDA=1` builds them anyway (CI,
  an image for GPUs built on a machine without one) and fails loudly if they cannot be built;
  `RLKERNELS_CUDA=0` leaves them out everywhere.
- `RLKERNELS_NO_EXT=1` installs pure Python (Triton + reference backends).
- `TORCH_CUDA_ARCH_LIST` picks the GPU architectures (default "8.0;9.0": A100 and H100).
- The objects go to a persistent `build/<python>-torch<version>[-cuda]/` (ninja rebuilds only what
  changed between installs) and compile on every core (`MAX_JOBS` overrides).
- Progress reaches the terminal under pip's default output, which hides a build's own output: what is
  built, each compile step as it ends (ninja's `[k/N, s]` count) and a line at least every
  HEARTBEAT_S seconds go to /dev/tty where there is one (else to stdout, e.g. CI's log). `pip install -v`
  also shows every compiler command.

Install with `pip install --no-build-isolation .` so that the extension is compiled against the torch
that will import it.
"""

import contextlib
import glob
import os
import re
import select
import shutil
import sys
import threading
import time

from setuptools import setup

ROOT = os.path.dirname(os.path.abspath(__file__))
DEFAULT_CUDA_ARCHS = "8.0;9.0"  # A100 and H100/H200: the GPUs RL post-training runs on
NINJA_STATUS = "[rlkernels %f/%t, %es] "  # ninja's prefix of each step: finished/total steps, seconds
# Longest silence while compiling: one source can take minutes on 2 busy cores.
HEARTBEAT_S = 30


def _flag(name):
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def _find_cuda_home():
    """CUDA_HOME as torch would find it, but following an `nvcc` wrapper to the real toolkit."""
    if os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH"):
        return os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    candidates = []
    nvcc = shutil.which("nvcc")
    if nvcc:
        candidates.append(os.path.dirname(os.path.dirname(os.path.realpath(nvcc))))
    candidates.append("/usr/local/cuda")
    for home in candidates:
        if os.path.exists(os.path.join(home, "include", "cuda_runtime.h")):
            return home
    return None


def _ninja_on_path():
    """torch looks for `ninja` on PATH; the pip package may live in a virtualenv that is not activated."""
    if shutil.which("ninja"):
        return True
    try:
        import ninja
    except ImportError:
        return False
    os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")
    return True


class Terminal:
    """Lines for whoever runs the install. pip shows a build's stdout and stderr only with -v or when it
    fails; /dev/tty, where the install has one, reaches them either way. Without one (CI, a pipe) the lines
    go to stdout."""

    def __init__(self, path: str = "/dev/tty"):
        try:
            self.tty = open(path, "w", buffering=1)  # noqa: SIM115  (open for the whole build)
        except OSError:
            self.tty = None
        self.lines = 0

    def line(self, text: str) -> None:
        if self.tty is None:
            print(text, flush=True)
            return
        # The first line leaves pip's "Building editable ... -" line; "\r" writes over the spinner's
        # character, which pip then draws at the start of each following line.
        self.tty.write(("\n" if self.lines == 0 else "\r") + text + "\n")
        self.tty.flush()
        self.lines += 1


def ninja_step(line: str) -> str | None:
    """A ninja status line ("[rlkernels 3/13, 45.2s] c++ ... -c -c /x/csrc/cpu/kl.cpp -o ...", printed as the
    step ends when ninja writes to a pipe) as a short one ("rlkernels: [3/13, 45 s] compiled
    csrc/cpu/kl.cpp"); None for any other line."""
    m = re.match(r"\[rlkernels (\d+)/(\d+), ([\d.]+)s\] (.*)", line)
    if m is None:
        return None
    done, total, seconds, command = m.groups()
    sources = re.findall(r"(?:^|\s)(\S+\.(?:cu|cpp|cc|cxx|c))(?=\s|$)", command)
    what = "compiled " + os.path.relpath(sources[-1], ROOT) if sources else command.split(" ")[0]
    return f"rlkernels: [{done}/{total}, {float(seconds):.0f} s] {what}"


@contextlib.contextmanager
def ninja_progress(terminal: Terminal, heartbeat_s: float = HEARTBEAT_S):
    """While the body runs, what the process writes to file descriptor 1 (torch runs ninja there) still
    reaches it, and each ninja step also reaches `terminal` as one short line, with a line every
    `heartbeat_s` seconds without a step. Without a terminal (no /dev/tty) nothing changes."""
    if terminal.tty is None:
        yield
        return
    sys.stdout.flush()
    read_fd, write_fd = os.pipe()
    saved = os.dup(1)
    os.dup2(write_fd, 1)
    os.close(write_fd)
    start = time.monotonic()

    def relay():
        pending, said = b"", time.monotonic()  # said: when the terminal last got a line
        while True:
            wait = max(0.0, said + heartbeat_s - time.monotonic())
            ready, _, _ = select.select([read_fd], [], [], wait)
            if not ready:
                terminal.line(f"rlkernels: still compiling, {time.monotonic() - start:.0f} s")
                said = time.monotonic()
                continue
            chunk = os.read(read_fd, 65536)
            if not chunk:
                break
            os.write(saved, chunk)
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for raw in lines:
                step = ninja_step(raw.decode(errors="replace"))
                if step is not None:
                    terminal.line(step)
                    said = time.monotonic()

    thread = threading.Thread(target=relay, daemon=True)
    thread.start()
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)  # closes the pipe's last write end: the relay reads to the end and stops
        thread.join()
        os.close(saved)
        os.close(read_fd)


def cuda_plan(env, torch_cuda: str | None, cuda_home: str | None, gpu_visible) -> tuple[bool, str]:
    """(build the CUDA sources?, the line that says why) from the environment `env`, torch's CUDA version
    (None for a CPU-only torch), the toolkit found and `gpu_visible()` (asked only when it decides).
    RuntimeError when RLKERNELS_CUDA=1 asks for what cannot be built."""
    flag = env.get("RLKERNELS_CUDA", "").strip().lower()
    force, skip = flag in ("1", "true", "yes", "on"), flag == "0"
    why_not = []
    if torch_cuda is None:
        why_not.append("torch is a CPU-only build")
    if cuda_home is None:
        why_not.append("no CUDA toolkit (nvcc) was found")
    if force and why_not:
        raise RuntimeError(
            f"RLKERNELS_CUDA=1 but the CUDA sources cannot be built: {' and '.join(why_not)}. Install a CUDA "
            "build of torch and the CUDA toolkit (nvcc), or set CUDA_HOME."
        )
    cpu_only = "rlkernels: building the C++ CPU kernels only"
    if skip:
        return False, f"{cpu_only} (RLKERNELS_CUDA=0)"
    if why_not:
        return False, f"{cpu_only}: {' and '.join(why_not)}"
    if force:
        return True, "rlkernels: building the CPU and CUDA kernels (RLKERNELS_CUDA=1)"
    if not gpu_visible():
        return False, (
            f"{cpu_only}: no GPU is visible, where the CUDA kernels could run. RLKERNELS_CUDA=1 builds them "
            "anyway (e.g. for GPU machines), minutes more"
        )
    return True, "rlkernels: building the CPU and CUDA kernels (a GPU is visible)"


def _build_ext_class(BuildExtension, with_cuda: bool, plan: str):
    """torch's BuildExtension with a persistent build directory (per Python, torch version and CUDA flag,
    so that a new torch rebuilds from scratch and an edit rebuilds one file), every core, and ninja status
    lines that count the steps."""
    import sys

    import torch

    tag = f"py{sys.version_info.major}{sys.version_info.minor}-torch{torch.__version__.split('+')[0]}"
    build_temp = os.path.join(ROOT, "build", tag + ("-cuda" if with_cuda else ""))

    class Build(BuildExtension.with_options(use_ninja=_ninja_on_path())):
        def finalize_options(self):
            super().finalize_options()
            self.build_temp = build_temp

        def build_extensions(self):
            os.environ.setdefault("MAX_JOBS", str(os.cpu_count() or 1))
            os.environ["NINJA_STATUS"] = NINJA_STATUS  # ninja_step() reads this prefix
            sources = sum(len(e.sources) for e in self.extensions)
            archs = os.environ.get("TORCH_CUDA_ARCH_LIST", "") if with_cuda else ""
            terminal = Terminal()
            terminal.line(plan)
            terminal.line(
                f"rlkernels: compiling {sources} sources{f' (CUDA for {archs})' if archs else ''} in "
                f"{os.path.relpath(build_temp, ROOT)} with {os.environ['MAX_JOBS']} jobs; unchanged sources "
                "are not rebuilt"
            )
            start = time.monotonic()
            with ninja_progress(terminal):
                super().build_extensions()
            terminal.line(f"rlkernels: extension built in {time.monotonic() - start:.0f} s")

    return Build


def _sources(pattern):
    return sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, pattern)))


def _extensions():
    if _flag("RLKERNELS_NO_EXT"):
        print("rlkernels: RLKERNELS_NO_EXT=1, installing pure Python (Triton + reference backends)")
        return [], {}

    cuda_home = _find_cuda_home()
    if cuda_home:
        os.environ["CUDA_HOME"] = cuda_home  # must be set before torch.utils.cpp_extension is imported
    import torch
    from torch.utils.cpp_extension import BuildExtension, CppExtension, CUDAExtension

    with_cuda, plan = cuda_plan(os.environ, torch.version.cuda, cuda_home, torch.cuda.is_available)

    sources = ["csrc/rlkernels.cpp"] + _sources("csrc/cpu/*.cpp") + _sources("csrc/autograd/*.cpp")
    # torch adds the C++ standard it needs (C++20 for torch 2.14). No FP traps or errno: lets gcc
    # vectorize branch-free ternaries and sqrt in the CPU loops (we never read FP exception flags).
    # -fopenmp: at::parallel_for is a header template; without it the CPU loops compile serial.
    # -g0: no debug information (Python's own CFLAGS ask for -g), which took a sixth of the template-heavy
    # sources' compile time and most of their objects' bytes (benchmarks/results/ci_time.md).
    cxx_flags = ["-O3", "-fno-trapping-math", "-fno-math-errno", "-fopenmp", "-g0"]
    link_flags = ["-fopenmp"]
    define_macros = [("RLK_VERSION", '"0.1.0"')]
    include_dirs = [os.path.join(ROOT, "csrc", "include")]
    if with_cuda:
        os.environ.setdefault("TORCH_CUDA_ARCH_LIST", DEFAULT_CUDA_ARCHS)
        sources += _sources("csrc/cuda/*.cpp") + _sources("csrc/cuda/*.cu")
        define_macros += [
            ("RLK_WITH_CUDA", None),
            ("RLK_CUDA_ARCHS", '"' + os.environ["TORCH_CUDA_ARCH_LIST"] + '"'),
        ]
        ext = CUDAExtension(
            "rlkernels._C",
            sources,
            include_dirs=include_dirs,
            define_macros=define_macros,
            extra_compile_args={"cxx": cxx_flags, "nvcc": ["-O3", "--expt-relaxed-constexpr"]},
            extra_link_args=link_flags,
        )
    else:
        ext = CppExtension(
            "rlkernels._C",
            sources,
            include_dirs=include_dirs,
            define_macros=define_macros,
            extra_compile_args={"cxx": cxx_flags},
            extra_link_args=link_flags,
        )
    print(plan)
    return [ext], {"build_ext": _build_ext_class(BuildExtension, with_cuda, plan)}


if __name__ == "__main__":  # pip's backend runs this file as __main__; tests import its helpers
    ext_modules, cmdclass = _extensions()
    setup(ext_modules=ext_modules, cmdclass=cmdclass)

"""Build rlkernels' C++ extension `rlkernels._C`.

- The C++ CPU kernels (csrc/rlkernels.cpp, csrc/cpu/*.cpp) are always built.
- The CUDA kernels (csrc/cuda/*.cu + *_binding.cpp) are added when `nvcc` and a CUDA build of torch
  are present. `RLKERNELS_CUDA=1` forces them and fails loudly if they cannot be built;
  `RLKERNELS_CUDA=0` leaves them out.
- `RLKERNELS_NO_EXT=1` installs pure Python (Triton + reference backends).
- `TORCH_CUDA_ARCH_LIST` picks the GPU architectures (default "8.0;9.0": A100 and H100).
- The objects go to a persistent `build/<python>-torch<version>[-cuda]/` (ninja rebuilds only what
  changed between installs) and compile on every core (`MAX_JOBS` overrides); `pip install -v` shows
  ninja's steps as `[rlkernels k/N, s] ...`.

Install with `pip install --no-build-isolation .` so that the extension is compiled against the torch
that will import it.
"""

import glob
import os
import shutil

from setuptools import setup

ROOT = os.path.dirname(os.path.abspath(__file__))
DEFAULT_CUDA_ARCHS = "8.0;9.0"  # A100 and H100/H200: the GPUs RL post-training runs on


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


def _build_ext_class(BuildExtension, with_cuda: bool):
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
            os.environ.setdefault("NINJA_STATUS", "[rlkernels %f/%t, %es] ")
            sources = sum(len(e.sources) for e in self.extensions)
            print(
                f"rlkernels: compiling {sources} sources{' (CUDA included)' if with_cuda else ''} in "
                f"{build_temp} with {os.environ['MAX_JOBS']} jobs; unchanged sources are not rebuilt",
                flush=True,
            )
            super().build_extensions()

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

    force_cuda = _flag("RLKERNELS_CUDA")
    skip_cuda = os.environ.get("RLKERNELS_CUDA", "").strip() == "0"
    can_cuda = torch.version.cuda is not None and cuda_home is not None
    if force_cuda and not can_cuda:
        raise RuntimeError(
            "RLKERNELS_CUDA=1 but the CUDA sources cannot be built: "
            f"torch {torch.__version__} is {'a CUDA' if torch.version.cuda else 'a CPU-only'} build and "
            f"CUDA_HOME={cuda_home!r}. Install a CUDA build of torch and the CUDA toolkit (nvcc), "
            "or set CUDA_HOME."
        )
    with_cuda = can_cuda and not skip_cuda

    sources = ["csrc/rlkernels.cpp"] + _sources("csrc/cpu/*.cpp")
    # torch adds the C++ standard it needs (C++20 for torch 2.14). No FP traps or errno: lets gcc
    # vectorize branch-free ternaries and sqrt in the CPU loops (we never read FP exception flags).
    # -fopenmp: at::parallel_for is a header template; without it the CPU loops compile serial.
    cxx_flags = ["-O3", "-fno-trapping-math", "-fno-math-errno", "-fopenmp"]
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
    print(f"rlkernels: building the C++ extension with{'' if with_cuda else 'out'} CUDA")
    return [ext], {"build_ext": _build_ext_class(BuildExtension, with_cuda)}


ext_modules, cmdclass = _extensions()
setup(ext_modules=ext_modules, cmdclass=cmdclass)

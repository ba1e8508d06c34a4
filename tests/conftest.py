"""Test configuration: Triton runs under its CPU interpreter when no GPU is present (compiled for the GPU
when one is), each test runs in its kernel flavor (oracle.Flavor: device and context), torch.compile uses a
private cache, and every uninitialized tensor is poisoned with NaN so that a kernel that skips an element of
its output is caught."""

import atexit
import os
import shutil
import tempfile

import torch  # noqa: E402  (torch does not import triton)

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything imports triton
if os.environ.get("TRITON_INTERPRET") == "1":
    import interpreter_dtype_table
    import interpreter_patch_once
    import interpreter_tree_combines

    interpreter_patch_once.install()  # the interpreter patches triton.language once per launch, not per call
    interpreter_tree_combines.install()  # scans and reductions with a combine: log2(n) steps, not n calls
    interpreter_dtype_table.install()  # its Triton-to-numpy dtype map kept, not rebuilt at every value
# A private inductor cache per test session: torch's shared on-disk cache outlives a change of an op's
# schema and then replays stale graphs ("missing value for argument").
if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
    _cache = tempfile.mkdtemp(prefix="rlkernels-inductor-")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = _cache
    atexit.register(shutil.rmtree, _cache, ignore_errors=True)

# RLK_TEST_WITHOUT_PEERS=1: the suite as without the [integrations] extra (verl, TRL, ...): tests/peers.py.
import peers  # noqa: E402

if peers.requested():
    peers.block()

import pytest  # noqa: E402
from cuda_on_cpu import flavor as cuda_on_cpu  # noqa: E402
from oracle import Flavor  # noqa: E402

# The CUDA C++ kernels on CPU tensors (tests/cuda_on_cpu), registered before the tests collect flavors.
cuda_on_cpu.register()


def pytest_terminal_summary(terminalreporter):
    for line in cuda_on_cpu.summary_lines():
        terminalreporter.write_line(line)


# Under pytest-xdist (`-n auto`, the README's test command): at most 4 workers (each holds torch and the
# tests' models in memory), each with its share of the cores for torch's threads; each worker's flavor
# counts reach the controller's summary above.
MAX_WORKERS = 4


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config):
    return max(1, min(MAX_WORKERS, os.cpu_count() or 1))


def pytest_collection_modifyitems(config, items):
    """The modules that hold a slow test run first, each in its own order. Under xdist the long tests (the
    trainers' torchrun runs, the selftest's subprocesses, the vocab-parallel spawns) then start while short
    tests remain to fill both workers at the end, instead of one worker finishing them alone."""
    slow = {item.nodeid.split("::")[0] for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.nodeid.split("::")[0] not in slow)  # a stable sort


def pytest_configure(config):
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if workers > 1:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))


def pytest_sessionfinish(session):
    workeroutput = getattr(session.config, "workeroutput", None)  # set in an xdist worker only
    if workeroutput is not None:
        workeroutput["cuda_on_cpu"] = cuda_on_cpu.STATS.as_dict()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    stats = getattr(node, "workeroutput", {}).get("cuda_on_cpu")
    if stats:
        cuda_on_cpu.STATS.add(stats)


def pytest_make_parametrize_id(config, val, argname):
    """A flavor's test id is its name ("triton-interpret", "cuda-on-cpu"), not its backend string; a dtype's
    is its name ("bfloat16"), so that test ids (and the selftest report) say what ran."""
    if isinstance(val, Flavor):
        return val.name
    if isinstance(val, torch.dtype):
        return str(val).removeprefix("torch.")
    return None


@pytest.fixture(autouse=True)
def _run_in_flavor(request):
    """Tests parametrized with a Flavor run on its device (torch's default device) inside its context. The
    fixture's value is that flavor (None without one)."""
    callspec = getattr(request.node, "callspec", None)
    flavors = [v for v in (callspec.params.values() if callspec else ()) if isinstance(v, Flavor)]
    if not flavors:
        yield None
        return
    with flavors[0].activate():
        yield flavors[0]


@pytest.fixture(autouse=True)
def _device_asserts_are_declared(request, _run_in_flavor):
    """A test that feeds a kernel a value it rejects fires that kernel's device-side assert on a GPU, which
    ends the process's CUDA context (the H200 run of 2026-11-30 lost 8 workers so). Such a test is marked
    `fires_device_asserts` and is skipped on CUDA tensors: its flag and its message are checked on the CPU
    flavors, the assert itself in a subprocess (tests/test_device_asserts.py). `fires_device_asserts(guarded=
    True)` says instead that its asserting calls run only where oracle.raises_on_host holds (CPU tensors),
    so it runs on a GPU without them. The cuda-on-cpu harness records the CUDA C++ kernels' asserts instead
    of failing, so an unmarked test that fires one fails here, naming the assert: what would end a GPU
    worker is caught on the CPU machine."""
    flavor = _run_in_flavor
    mark = request.node.get_closest_marker("fires_device_asserts")
    if (
        mark is not None
        and not mark.kwargs.get("guarded")
        and flavor is not None
        and flavor.device.type == "cuda"
    ):
        pytest.skip("fires a device-side assert by design: on a GPU it would end the CUDA context")
    harness = flavor is not None and flavor.name == "cuda-on-cpu"
    if harness:
        torch.ops.rlkernels_sim_stats.device_asserts()  # earlier tests' records
    yield
    if harness and mark is None:
        fired = list(torch.ops.rlkernels_sim_stats.device_asserts())
        assert not fired, (
            f"a kernel fired a device-side assert ({fired[0]!r}): on a GPU that ends the CUDA context; mark "
            "the test fires_device_asserts (pyproject.toml)"
        )


@pytest.fixture(autouse=True)
def _device_asserts_end_the_worker(request):
    """On a GPU: a device-side assert that fires in a test (a bad value reaching torch._assert_async on a
    CUDA tensor) ends the process's CUDA context, and every later CUDA call in it fails. The H200 run of
    6978e92 lost 207 tests so, without saying which test fired it. So after each test that used CUDA, wait
    for the device; if it asserted, end this worker: pytest-xdist reports the test as the one its worker
    crashed in, and starts a fresh worker for the rest."""
    yield
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        try:
            torch.cuda.synchronize()
        except Exception as e:  # torch.AcceleratorError: "CUDA error: device-side assert triggered"
            first = str(e).splitlines()[0]
            print(f"\n{request.node.nodeid}: the device failed ({first}); ending this worker", flush=True)
            os._exit(3)


@pytest.fixture(autouse=True)
def _poison_uninitialized_memory():
    """torch.empty (and the C++ at::empty) fill floats with NaN while this is on."""
    import torch.utils.deterministic

    prev_det = torch.are_deterministic_algorithms_enabled()
    prev_warn = torch.is_deterministic_algorithms_warn_only_enabled()
    prev_fill = torch.utils.deterministic.fill_uninitialized_memory
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = True
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(prev_det, warn_only=prev_warn)
        torch.utils.deterministic.fill_uninitialized_memory = prev_fill


@pytest.fixture
def seed(request):
    """A fresh seed per test, shown among the failing test's arguments; RLKERNELS_TEST_SEED=<seed> replays
    it (docs/testing.md)."""
    fixed = os.environ.get("RLKERNELS_TEST_SEED")
    s = int(fixed) if fixed else int.from_bytes(os.urandom(4), "little")
    torch.manual_seed(s)
    request.node.user_properties.append(("seed", s))
    return s


# The header names the kernel flavors that run here and why any are left out (tests/flavor_report.py): the
# test count depends on them.
def pytest_report_header(config):
    import flavor_report

    return flavor_report.header_lines()

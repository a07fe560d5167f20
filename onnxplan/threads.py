"""The thread policy of an onnxplan process: how many threads each pool gets, decided here only.

A process that runs a training step holds several thread pools: the BLAS numpy loaded
(OpenBLAS: our GEMMs), OpenMP (torch's intra-op pool: our kernels on torch operators, the
PyTorch peer), torch's inter-op pool, ONNX Runtime's pools in every session onnxplan creates
(verification, the ORT peer) and the swap I/O worker. Our executor runs one kernel at a time
(or two matrix products as one GEMM-pool job: executor/interop.py), so one pool works while the
others idle; the step is fast at N threads only if an idle pool's
workers sleep instead of spinning on the cores the working pool needs. Measured on 2 cores
(transformer b16, one step): BLAS 1 + torch 1 thread 28 ms; BLAS 2 + torch 2 with OpenMP's
default waiting 336 ms (an idle pool's workers spin: 3-4 runnable threads on 2 cores);
the same with idle OpenMP workers asleep (OMP_WAIT_POLICY=PASSIVE) 23 ms.

The policy, for `threads = N` (default: $ONNXPLAN_THREADS where set, else the cores this
process may run on: os.sched_getaffinity, capped by a cgroup CPU quota):
- BLAS (numpy's GEMMs): 1 thread. Our GEMM kernels cut each product into pieces of rows,
  columns or batches (kernels/matmul.split_matmul) whose BLAS calls run on the GEMM pool: N - 1
  C threads of the fused library (kernels/gemm_calls.py) that call numpy's OpenBLAS without the
  interpreter lock, where the calling thread runs every call no worker has started; after a job
  they spin 1 ms for the next one (a sleeping vCPU wakes ~40 us late), and sleep at once when
  onnxplan's Python kernel workers get pieces. Without the fused library: the Python workers. OpenBLAS splits a GEMM statically between the
  caller and its workers and the caller spins until every worker's part is done: when other
  processes keep the cores busy, each GEMM waits a scheduler time slice for a descheduled
  worker (mlp's step 30-300 ms instead of 1; reports/threads.md, session 10).
- OpenMP (through threadpoolctl) and torch's intra-op pool: 1 thread in onnxplan's step.
  OpenMP's split is static like OpenBLAS's: a parallel region's caller waits at the closing
  barrier for a worker the machine has not scheduled, and torch opens one even for mlp's
  64 x 10 log-softmax (3.7 ms median at 2 threads against 0.16 at 1 under load 10); at
  the sizes our kernels hand torch (gelu, softmax, norms' sums, transposes) its second thread
  gained nothing even in the least of 8 steps (reports/threads.md, session 10). Idle OpenMP
  workers sleep all the same: OMP_WAIT_POLICY=PASSIVE is set before torch loads libgomp
  (prepare_process, called when onnxplan is imported); where libgomp was loaded before that (a
  program imported torch before onnxplan) its workers spin (`note` says so).
  OpenMP's thread count belongs to each thread (an ICV): torch.set_num_threads sizes the teams
  of the thread that calls it, and a thread that never did opens a team of every core at its
  first torch operator. onnxplan's kernel workers run torch operators (a GELU's half), so each
  applies the policy to itself (`adopt_in_this_thread`) when the policy changes. A worker that
  did not ran each piece on a team of 2 at 2 threads; where OpenMP's idle workers spin (torch
  imported before onnxplan: a Python program's usual order) that team's second thread kept a
  core from the calling thread (the caller's half of a 512K-element GELU: 0.48 ms, 0.2 of it
  descheduled, against 0.25 alone), and transformer b16's 2-thread step took 46.5 ms instead of
  30.9 (medians; reports/threads.md, session 25). With idle workers asleep it cost nothing
  measurable.
- torch's inter-op pool: 1 (nothing onnxplan runs uses inter-op parallelism).
- ONNX Runtime sessions: intra-op N, inter-op 1, sequential execution. A session that runs
  between our kernels (verification) does not spin when idle (`session.intra_op.allow_spinning`
  0); a peer measured alone in its own process keeps ORT's default (spinning: its fastest).
- The PyTorch peer, alone in its process, runs as a PyTorch user's process: OpenMP's own
  waiting (peer_environment removes the policy onnxplan set; passive waiting made its
  transformer step 47 ms instead of 27) and torch at N (`torch_alone`).
- onnxplan's own kernel workers (kernels/parallel.py): N - 1 beside the calling thread,
  asleep on a lock of their own when idle; a kernel's pieces go to whichever thread is free first, and all
  to the calling thread while splits have been losing (workers descheduled by other processes
  while the caller waited for their pieces: kernels/parallel.py).
- With swaps in the plan the swap I/O worker runs beside the kernels, mostly waiting on the
  disk; the compute pools keep N, so a swapped run computes the same bits as the plain run at
  the same N (results depend on the thread count: a GEMM cut into N pieces may round
  differently from the whole, kernels/matmul.split_matmul).

`use_threads(n)` applies the policy to every pool this process has loaded (and to torch
when it loads later) and returns what each pool got: `ThreadSettings`, which `run --json`
and every bench row record.
"""

from __future__ import annotations

import os
import sys
from dataclasses import asdict, dataclass
from typing import Any

from onnxplan.settings import ENV, Settings
from onnxplan.settings import current as current_settings

__all__ = ["ThreadSettings", "adopt_in_this_thread", "available_cores", "current", "gemm_pool_found", "generation",
           "ort_session_options", "peer_environment", "prepare_process", "resolve_threads", "use_threads"]

WAIT_POLICY_ENV = "OMP_WAIT_POLICY"
KEEP_OPENMP_ENV = ENV["keep_openmp_wait"]  # "1": leave OpenMP's waiting as it is (a peer's process)
THREADS_ENV = ENV["threads"]  # the default of --threads, where set
_PASSIVE = "PASSIVE"
_gomp_spins: bool | None = None  # libgomp loaded before prepare_process with its workers spinning
_we_set_policy = False  # OMP_WAIT_POLICY=PASSIVE is ours, not the user's
_current: ThreadSettings | None = None
_torch_alone = False
_gemm_pool: bool | None = None  # whether the GEMM pool runs products here (gemm_pool_found); None: not known
_generation = 0  # counts the times the policy was applied (use_threads, torch_loaded): adopt_in_this_thread's cue


def _libgomp_loaded() -> bool:
    try:
        with open("/proc/self/maps") as f:
            return any("libgomp" in line or "libiomp" in line for line in f)
    except OSError:
        return "torch" in sys.modules


def prepare_process() -> None:
    """Before any OpenMP runtime loads: idle OpenMP workers sleep (OMP_WAIT_POLICY=PASSIVE,
    unless the user set a policy). Records whether an OpenMP runtime was already loaded with
    spinning workers (then torch gets one thread: see the module's docstring)."""
    global _gomp_spins, _we_set_policy
    if _gomp_spins is not None:
        return
    keep = Settings.from_environ().keep_openmp_wait  # at import: read now, not kept as the settings in force
    if not _libgomp_loaded() and not keep and WAIT_POLICY_ENV not in os.environ:
        os.environ[WAIT_POLICY_ENV] = _PASSIVE
        _we_set_policy = True
    # loaded before us, the policy in force is whatever the environment said then
    _gomp_spins = os.environ.get(WAIT_POLICY_ENV, "").upper() != _PASSIVE


def _cgroup_cpus(path: str = "/sys/fs/cgroup/cpu.max") -> int | None:
    """The CPU quota of this process's cgroup (v2 `cpu.max`: "QUOTA PERIOD"), rounded up; None
    when unlimited or unknown (a container's quota does not show in the affinity mask)."""
    try:
        with open(path) as f:
            quota, period = f.read().split()[:2]
    except (OSError, ValueError):
        return None
    if quota == "max":
        return None
    return max(1, -(-int(quota) // int(period)))


def available_cores() -> int:
    """The cores this process may run on: its CPU affinity, capped by its cgroup's CPU quota."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    quota = _cgroup_cpus()
    return max(1, min(cores, quota) if quota else cores)


def resolve_threads(threads: int | None) -> int:
    """`--threads`: None means $ONNXPLAN_THREADS if set, else every core this process may use;
    at least 1."""
    from onnxplan.errors import UsageError

    source = "--threads"
    if threads is None:
        env = current_settings().threads
        if not env:
            return available_cores()
        source = THREADS_ENV
        try:
            threads = int(env)
        except ValueError:
            raise UsageError(f"invalid {THREADS_ENV}={env!r}: must be an integer >= 1") from None
    if int(threads) < 1:
        raise UsageError(f"invalid {source} {threads}: must be >= 1")
    return int(threads)


@dataclass(frozen=True)
class ThreadSettings:
    """What each pool of this process got (None: that library is not loaded here)."""

    threads: int  # asked (--threads, or the cores available)
    compute: int  # what the compute pools were given
    blas: int | None  # numpy's BLAS, as threadpoolctl reads it back
    openmp: int | None  # the OpenMP runtime(s), as threadpoolctl reads them back
    torch_intra: int | None
    torch_interop: int | None
    ort_intra: int
    ort_inter: int
    swap_io: int  # I/O worker threads (0 without swaps)
    omp_wait_policy: str
    blas_library: str = ""  # e.g. "openblas 0.3.31 SkylakeX pthreads" (the kernel it dispatched to)
    note: str = ""

    gemm_pool: int | None = None  # the GEMM pool's C workers (kernels/gemm_calls.py); None: not looked up yet

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _pools() -> list[dict]:
    import threadpoolctl

    return threadpoolctl.threadpool_info()


def _pool_threads(pools: list[dict], api: str) -> int | None:
    got = [p["num_threads"] for p in pools if p.get("user_api") == api]
    return max(got) if got else None


def _blas_library(pools: list[dict]) -> str:
    return "; ".join(" ".join(str(p.get(k) or "") for k in ("internal_api", "version", "architecture",
                                                           "threading_layer")).strip()
                     for p in pools if p.get("user_api") == "blas")


def _torch_threads(compute: int) -> int:
    """torch's intra-op pool (OpenMP): 1 in onnxplan's step (the docstring), every compute thread
    in the PyTorch peer's process (torch alone)."""
    return compute if _torch_alone else 1


def _blas_threads(compute: int) -> int:
    """numpy's BLAS: 1 thread (our GEMMs split across kernels.parallel: the docstring), or every
    compute thread in a peer's process, where numpy's BLAS is not ours to split."""
    return compute if _torch_alone else 1


def _configure_torch(torch: Any, n: int) -> tuple[int, int]:
    torch.set_num_threads(n)
    try:
        torch.set_num_interop_threads(1)  # allowed once, before any inter-op work
    except RuntimeError:
        pass  # already set (or already used): keep what it has
    return torch.get_num_threads(), torch.get_num_interop_threads()


def use_threads(threads: int | None = None, *, swapping: bool = False, torch_alone: bool = False) -> ThreadSettings:
    """Apply the policy for `threads` (None: every available core) to every pool loaded in
    this process, and to torch when it loads later (onnxplan.kernels._torch.load). Returns
    what each pool got. `torch_alone`: torch's pool is the only one that works here (the
    PyTorch peer), so it gets every thread even where its idle workers spin."""
    global _current, _torch_alone, _generation
    import threadpoolctl

    prepare_process()
    _torch_alone = torch_alone
    n = resolve_threads(threads)
    compute = n  # the swap worker mostly waits on the disk: the pools keep every thread (docstring)
    torch_n = _torch_threads(compute)
    threadpoolctl.threadpool_limits(limits=_blas_threads(compute), user_api="blas")
    threadpoolctl.threadpool_limits(limits=torch_n, user_api="openmp")
    torch_intra = torch_interop = None
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "set_num_threads"):
        torch_intra, torch_interop = _configure_torch(torch, torch_n)
    note = ("an OpenMP runtime was loaded before onnxplan with spinning workers: torch gets 1 thread"
            if _gomp_spins and compute > 1 and not torch_alone else "")
    pools = _pools()
    _current = ThreadSettings(
        threads=n, compute=compute, blas=_pool_threads(pools, "blas"), openmp=_pool_threads(pools, "openmp"),
        torch_intra=torch_intra, torch_interop=torch_interop, ort_intra=compute, ort_inter=1,
        swap_io=1 if swapping else 0, omp_wait_policy=os.environ.get(WAIT_POLICY_ENV, "default"),
        blas_library=_blas_library(pools), note=note, gemm_pool=_gemm_pool_workers(compute))
    _generation += 1
    return _current


def generation() -> int:
    """How many times the policy was applied in this process: a thread that adopted it at one
    count adopts it again when the count moves (adopt_in_this_thread)."""
    return _generation


def adopt_in_this_thread() -> None:
    """Apply the policy's per-thread part to the calling thread: torch's intra-op (OpenMP)
    thread count, which torch.set_num_threads sets for its caller only (the docstring). For the
    threads onnxplan starts that run kernels; a no-op until torch is loaded."""
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "set_num_threads"):
        torch.set_num_threads(_torch_threads(current().compute))


def _gemm_pool_workers(compute: int) -> int | None:
    return None if _gemm_pool is None else max(0, compute - 1) if _gemm_pool else 0


def gemm_pool_found(available: bool) -> None:
    """Called by kernels/gemm_calls.py when it looks the GEMM pool up: whether the pool runs this
    process's products (its workers: the compute threads less the caller), recorded from now on."""
    global _gemm_pool, _current
    _gemm_pool = available
    if _current is not None:
        _current = ThreadSettings(**{**_current.as_dict(), "gemm_pool": _gemm_pool_workers(_current.compute)})


def current() -> ThreadSettings:
    """The settings in force (the policy at every core if nothing applied it yet)."""
    return _current if _current is not None else use_threads(None)


def torch_loaded(torch: Any) -> None:
    """Called by onnxplan.kernels._torch.load after importing torch: size its pools now."""
    global _current, _generation
    settings = current()
    intra, interop = _configure_torch(torch, _torch_threads(settings.compute))
    _generation += 1
    _current = ThreadSettings(**{**settings.as_dict(), "torch_intra": intra, "torch_interop": interop,
                                 "openmp": _pool_threads(_pools(), "openmp")})


def peer_environment() -> dict[str, str | None]:
    """The environment changes for a peer's process (onnxplan.memprobe's `env`): OpenMP waits
    as it does for a user of that library (the policy onnxplan set for itself removed)."""
    return {WAIT_POLICY_ENV: None, KEEP_OPENMP_ENV: "1"} if _we_set_policy else {}


def ort_session_options(options: Any = None, *, beside_our_kernels: bool = True) -> Any:
    """onnxruntime.SessionOptions with the policy's threads: intra-op as our compute pools,
    inter-op 1, sequential. `beside_our_kernels`: the session runs between our kernels in this
    process (verification), so its idle workers must not spin."""
    import onnxruntime

    settings = current()
    opts = options if options is not None else onnxruntime.SessionOptions()
    opts.intra_op_num_threads = settings.ort_intra
    opts.inter_op_num_threads = settings.ort_inter
    opts.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
    if beside_our_kernels:
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        opts.add_session_config_entry("session.inter_op.allow_spinning", "0")
    return opts

"""The process's thread policy (onnxplan.threads): every pool sized once, from one place, and what
each got recorded; idle OpenMP workers sleep so that two pools never fight for the cores."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from onnxplan import settings, threads
from onnxplan.errors import UsageError


@pytest.fixture
def restore_threads():
    before = threads.current().threads
    yield
    threads.use_threads(before)


def _child(code: str, env: dict | None = None) -> dict:
    """Run `code` in a fresh interpreter (it prints one JSON line); the environment without
    OMP_WAIT_POLICY unless `env` sets it."""
    child_env = {k: v for k, v in os.environ.items() if k != threads.WAIT_POLICY_ENV}
    child_env.update(env or {})
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=child_env, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_every_pool_gets_the_count_asked(restore_threads):
    torch = pytest.importorskip("torch")
    from onnxplan.kernels import _torch

    _torch.load()
    for n in (1, 2, 3):
        got = threads.use_threads(n)
        # BLAS and torch (OpenMP) at one thread: our GEMMs split across kernels.parallel's N
        # threads, since a static split stalls on a worker the machine has not scheduled
        assert (got.threads, got.compute, got.torch_intra, got.ort_intra, got.ort_inter) == (n, n, 1, n, 1)
        assert torch.get_num_threads() == 1 and got.torch_interop == torch.get_num_interop_threads()
        if got.blas is not None:  # read back from the library itself (threadpoolctl)
            assert got.blas == 1
        if got.openmp is not None:
            assert got.openmp == 1
        assert threads.current() == got


def test_a_peer_process_gives_blas_and_torch_every_thread(restore_threads):
    """BLAS and torch get one thread only in onnxplan's own step: a peer's process (torch alone)
    gives them every thread, as that library's user would."""
    torch = pytest.importorskip("torch")
    from onnxplan.kernels import _torch

    _torch.load()
    got = threads.use_threads(2, torch_alone=True)
    assert got.torch_intra == 2 and torch.get_num_threads() == 2
    if got.blas is not None:
        assert got.blas == 2
    got = threads.use_threads(2)
    assert got.torch_intra == 1 and torch.get_num_threads() == 1
    if got.blas is not None:
        assert got.blas == 1


def test_the_default_is_every_core_this_process_may_use(restore_threads, monkeypatch):
    monkeypatch.delenv(threads.THREADS_ENV, raising=False)
    settings.reload()  # the environment changed: read it again
    assert 1 <= threads.available_cores() <= len(os.sched_getaffinity(0))
    assert threads.use_threads(None).threads == threads.available_cores()
    assert threads.resolve_threads(None) == threads.available_cores()
    monkeypatch.setenv(threads.THREADS_ENV, "3")
    settings.reload()  # the environment changed: read it again
    assert threads.resolve_threads(None) == 3 and threads.resolve_threads(1) == 1
    monkeypatch.setenv(threads.THREADS_ENV, "many")
    settings.reload()  # the environment changed: read it again
    with pytest.raises(UsageError, match="ONNXPLAN_THREADS"):
        threads.resolve_threads(None)


@pytest.mark.parametrize("text, cpus", [("max 100000", None), ("200000 100000", 2), ("150000 100000", 2),
                                        ("50000 100000", 1), ("", None)])
def test_a_cgroup_quota_caps_the_cores(tmp_path, text, cpus):
    path = tmp_path / "cpu.max"
    path.write_text(text)
    assert threads._cgroup_cpus(str(path)) == cpus
    assert threads._cgroup_cpus(str(tmp_path / "absent")) is None


def test_a_swapped_run_keeps_every_thread_and_records_its_worker(restore_threads):
    """The compute pools keep N with swaps (a swapped run computes the plain run's bits at the
    same N); the I/O worker is recorded."""
    got = threads.use_threads(3, swapping=True)
    assert (got.threads, got.compute, got.swap_io, got.ort_intra) == (3, 3, 1, 3)
    assert threads.use_threads(3).swap_io == 0


@pytest.mark.parametrize("bad", [0, -2])
def test_a_count_below_one_is_a_usage_error(bad):
    with pytest.raises(UsageError, match="--threads"):
        threads.resolve_threads(bad)


def test_ort_sessions_get_the_policy(restore_threads):
    threads.use_threads(2)
    beside = threads.ort_session_options()
    assert (beside.intra_op_num_threads, beside.inter_op_num_threads) == (2, 1)
    assert beside.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    alone = threads.ort_session_options(beside_our_kernels=False)
    assert alone.intra_op_num_threads == 2
    with pytest.raises(RuntimeError, match="allow_spinning"):  # not set: ORT's default, which spins
        alone.get_session_config_entry("session.intra_op.allow_spinning")


def test_importing_onnxplan_first_makes_idle_openmp_workers_sleep():
    """Imported before torch, onnxplan sets OMP_WAIT_POLICY=PASSIVE (torch's pool gets 1 thread
    in onnxplan's step all the same: see onnxplan.threads)."""
    got = _child("import json, onnxplan, os, torch\n"
                 "from onnxplan import threads\n"
                 "s = threads.use_threads(2)\n"
                 "print(json.dumps({'policy': os.environ.get('OMP_WAIT_POLICY'), 'torch': s.torch_intra, 'note': s.note}))")
    assert got == {"policy": "PASSIVE", "torch": 1, "note": ""}


def test_a_user_policy_is_kept():
    got = _child("import json, onnxplan, os\nprint(json.dumps(os.environ.get('OMP_WAIT_POLICY')))",
                 env={threads.WAIT_POLICY_ENV: "ACTIVE"})
    assert got == "ACTIVE"


def test_torch_loaded_first_with_spinning_workers_gets_one_thread():
    """torch imported before onnxplan: its OpenMP workers spin when idle, so torch gets one thread
    (BLAS every one asked), and the settings say why."""
    got = _child("import json, torch, onnxplan\n"
                 "from onnxplan import threads\n"
                 "s = threads.use_threads(2)\n"
                 "print(json.dumps({'torch': s.torch_intra, 'compute': s.compute, 'note': s.note}))")
    assert got["torch"] == 1 and got["compute"] == 2 and "torch gets 1 thread" in got["note"]


def test_a_peer_process_waits_as_its_library_does():
    """The PyTorch peer runs as a PyTorch user's process: OpenMP's own waiting (onnxplan's
    PASSIVE removed), and torch keeps every thread since nothing else works beside it."""
    code = ("import json, os, onnxplan, torch\n"
            "from onnxplan import threads\n"
            "s = threads.use_threads(2, torch_alone=True)\n"
            "print(json.dumps({'policy': os.environ.get('OMP_WAIT_POLICY'), 'torch': s.torch_intra, 'note': s.note}))")
    # what bench hands the peer's probe when onnxplan set the policy itself
    env = {threads.KEEP_OPENMP_ENV: "1"}
    got = _child(code, env)
    assert got == {"policy": None, "torch": 2, "note": ""}
    assert threads.peer_environment() in ({}, {threads.WAIT_POLICY_ENV: None, threads.KEEP_OPENMP_ENV: "1"})


def test_probe_env_none_removes_a_variable(monkeypatch):
    from onnxplan.memprobe import probe_peak

    monkeypatch.setenv("ONNXPLAN_TEST_VAR", "x")
    res = probe_peak("tests.test_threads:_env_target", {}, env={"ONNXPLAN_TEST_VAR": None, "ONNXPLAN_OTHER": "y"})
    assert res.result == {"var": None, "other": "y"}


def _env_target() -> dict:
    return {"var": os.environ.get("ONNXPLAN_TEST_VAR"), "other": os.environ.get("ONNXPLAN_OTHER")}


def test_the_record_says_what_the_gemm_pool_got():
    """`gemm_pool`: unknown (None) until a product ran in the process, then the compute threads
    less the caller (the pool's C workers), or 0 where the pool cannot be had."""
    out = _child("import json, numpy as np\n"
                 "from onnxplan import threads\n"
                 "from onnxplan.kernels import matmul\n"
                 "before = threads.use_threads(3).as_dict()['gemm_pool']\n"
                 "a = np.ones((8, 8), np.float32)\n"
                 "matmul.split_matmul(np, a, a, np.empty((8, 8), np.float32))\n"
                 "print(json.dumps([before, threads.current().as_dict()['gemm_pool']]))")
    from onnxplan.kernels import gemm_calls

    assert out == [None, 2 if gemm_calls.pool() is not None else 0]
    off = _child("import json, numpy as np\n"
                 "from onnxplan import threads\n"
                 "from onnxplan.kernels import matmul\n"
                 "threads.use_threads(3)\n"
                 "a = np.ones((8, 8), np.float32)\n"
                 "matmul.split_matmul(np, a, a, np.empty((8, 8), np.float32))\n"
                 "print(json.dumps(threads.current().as_dict()['gemm_pool']))", {"ONNXPLAN_NATIVE_KERNELS": "0"})
    assert off == 0


_WORKER_OPENMP = """
import json, threading, threadpoolctl
import onnxplan
from onnxplan import threads
from onnxplan.kernels import _torch, parallel

def on_a_worker(read):
    # two like tasks: the one the calling thread claims waits for one on a worker, which reads
    main, seen, ready = threading.get_ident(), {}, threading.Event()
    def task():
        if threading.get_ident() == main:
            assert ready.wait(60)
        else:
            seen['value'] = read()
            ready.set()
    parallel.outcomes.score = 0.0  # hand pieces out
    parallel.run([task, task])
    return seen['value']

def icv():  # OpenMP's thread count as the calling thread sees it (threadpoolctl asks omp_get_max_threads)
    return [p['num_threads'] for p in threadpoolctl.threadpool_info() if p['user_api'] == 'openmp']

_torch.load()
threads.use_threads(2)
got = [on_a_worker(icv)]
libs = threadpoolctl.ThreadpoolController().select(user_api='openmp')
on_a_worker(lambda: libs.lib_controllers[0].set_num_threads(5))  # a worker's ICV gone stale
threads.use_threads(2)  # the policy applied again: the worker adopts it at its next wake
got.append(on_a_worker(icv))
print(json.dumps(got))
"""


def test_kernel_workers_run_torch_at_the_policys_threads():
    """OpenMP's thread count is per thread: a kernel worker that never set it would open a team
    of OMP_NUM_THREADS (here 3) at its first torch operator; each worker adopts the policy
    (torch at 1 thread in onnxplan's step), again when the policy is applied again."""
    pytest.importorskip("torch")
    got = _child(_WORKER_OPENMP, env={"OMP_NUM_THREADS": "3"})
    assert got == [[1], [1]]

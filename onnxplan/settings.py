"""Every ONNXPLAN_* environment variable, read in this one module (README: "Settings").

`current()` is the Settings in force: read from the environment on first use (never at
import), then kept. Code changes it with `override(...)` (a context manager) or `use(...)`;
`reload()` reads the environment again (a test that sets a variable calls it). Values whose
checking belongs to one command (ONNXPLAN_THREADS, ONNXPLAN_SWAP_BANDWIDTH) are kept as
text and checked where they are used, so a bad value fails only the commands that read it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

__all__ = ["ENV", "Settings", "current", "override", "reload", "use"]

# field -> environment variable
ENV = {
    "cache_dir": "ONNXPLAN_CACHE",
    "swap_bandwidth": "ONNXPLAN_SWAP_BANDWIDTH",
    "torch_kernels": "ONNXPLAN_TORCH_KERNELS",
    "bind_kernels": "ONNXPLAN_BIND_KERNELS",
    "threads": "ONNXPLAN_THREADS",
    "keep_openmp_wait": "ONNXPLAN_KEEP_OPENMP_WAIT",
    "probe_method": "ONNXPLAN_PROBE_METHOD",
    "probe_parent": "ONNXPLAN_PROBE_PARENT",
    "progress": "ONNXPLAN_PROGRESS",
    "debug": "ONNXPLAN_DEBUG",
    "parallel_min_elems": "ONNXPLAN_PARALLEL_MIN_ELEMS",
    "native_kernels": "ONNXPLAN_NATIVE_KERNELS",
    "split_kernels": "ONNXPLAN_SPLIT_KERNELS",
    "interop": "ONNXPLAN_INTEROP",
    "model_sources": "ONNXPLAN_MODEL_SOURCES",
    "profile_cache": "ONNXPLAN_PROFILE_CACHE",
}


@dataclass(frozen=True)
class Settings:
    """What the environment says (defaults: the variable unset)."""

    # artifacts, HF exports, swap rates
    cache_dir: Path = field(default_factory=lambda: Path.home() / ".cache" / "onnxplan" / "artifacts")
    swap_bandwidth: str = ""  # bytes/s swap transfers are priced at ("": measured); changes plans
    torch_kernels: bool = True  # torch's `out=` operators where they win ("0": numpy everywhere)
    native_kernels: bool = True  # fused C loops compiled on first use (kernels/native.py; "0": numpy)
    bind_kernels: bool = True  # kernels' bind rules ("0": every node calls its plain kernel)
    # the non-GEMM kernels cut across the compute threads (BatchNorm, LayerNorm, softmax, AdamW, a
    # convolution's chunk; "0": they run whole on the calling thread, as before; read when a kernel binds)
    split_kernels: bool = True
    # which independent nodes run two at once at 2+ compute threads (executor/interop.py; read when
    # an executor binds): "products" (two matrix products as one GEMM-pool job), "all" ("1": any
    # two of 1 MiB or more, through the Python pool), "off" ("0": one node at a time)
    interop: str = "products"
    threads: str = ""  # the default of --threads ("": every core this process may use)
    keep_openmp_wait: bool = False  # "1": leave OpenMP's wait policy as it is (a peer's process)
    probe_method: str = "clear_refs"  # how the memory probe resets the peak ("sampled": the fallback)
    probe_parent: str = ""  # internal: the probe parent's pid, set for its child
    progress: str = "auto"  # progress display: auto, bar, lines, off
    debug: bool = False  # tracebacks for internal errors (like `onnxplan --debug`)
    parallel_min_elems: int = 1 << 20  # elements below which a kernel does not split across threads
    # where named models come from: MODULE:ATTR of ModelSource objects, comma-separated (onnxplan.loading.zoo)
    model_sources: str = "onnxplan.models.source:SOURCE"
    profile_cache: bool = True  # "off" (or 0, no, false): planning profiles neither read from nor kept on disk

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """The settings an environment gives (None: this process's)."""
        env = os.environ if environ is None else environ
        raw = {f: env.get(var) for f, var in ENV.items()}
        base = cls()
        return cls(
            cache_dir=Path(raw["cache_dir"]).expanduser() if raw["cache_dir"] else base.cache_dir,
            swap_bandwidth=(raw["swap_bandwidth"] or "").strip(),
            torch_kernels=raw["torch_kernels"] != "0",
            native_kernels=raw["native_kernels"] != "0",
            bind_kernels=raw["bind_kernels"] != "0",
            split_kernels=raw["split_kernels"] != "0",
            interop=_interop(raw["interop"], base.interop),
            threads=(raw["threads"] or "").strip(),
            keep_openmp_wait=raw["keep_openmp_wait"] == "1",
            probe_method=raw["probe_method"] or base.probe_method,
            probe_parent=raw["probe_parent"] or "",
            progress=(raw["progress"] or base.progress).lower(),
            debug=(raw["debug"] or "") not in ("", "0"),
            parallel_min_elems=int(raw["parallel_min_elems"] or base.parallel_min_elems),
            model_sources=base.model_sources if raw["model_sources"] is None else raw["model_sources"].strip(),
            profile_cache=(raw["profile_cache"] or "").strip().lower() not in ("off", "0", "no", "false"),
        )


def _interop(raw: str | None, default: str) -> str:
    """ONNXPLAN_INTEROP's mode: "0"/"off", "products", "1"/"all" (anything else: the default)."""
    value = (raw or "").strip().lower()
    return {"0": "off", "off": "off", "products": "products", "1": "all", "all": "all"}.get(value, default)


_current: Settings | None = None


def current() -> Settings:
    """The settings in force (the environment's, read on first use, unless overridden)."""
    global _current
    if _current is None:
        _current = Settings.from_environ()
    return _current


def use(settings: Settings | None) -> None:
    """Put `settings` in force (None: read the environment again on next use)."""
    global _current
    _current = settings


def reload() -> Settings:
    """Read the environment again."""
    use(None)
    return current()


@contextlib.contextmanager
def override(**changes) -> Iterator[Settings]:
    """The settings in force with `changes` (field=value) inside the block."""
    unknown = set(changes) - {f.name for f in fields(Settings)}
    if unknown:
        raise TypeError(f"unknown settings: {', '.join(sorted(unknown))}")
    before = _current
    changed = replace(current(), **changes)
    use(changed)
    try:
        yield changed
    finally:
        use(before)

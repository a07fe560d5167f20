"""Matrix-product kernels: Gemm, MatMul, Einsum and ONNX Runtime's FusedMatMul/TransposeMatMul, straight into their outputs."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from onnxplan import settings, threads
from onnxplan.kernels import _xp, gemm_calls, parallel
from onnxplan.kernels.registry import PAIRABLE, KernelContext, KernelFn, kernel

__all__ = ["Product", "ProductPair", "ProductWork", "blas_matmul", "fused_matmul", "fused_operand", "gemm", "matmul", "matmul_into", "split_matmul"]

MS = "com.microsoft"
# A product splits across the compute threads from MIN_ELEMS * GEMM_MACS_PER_ELEM multiply-adds
# a piece (MIN_ELEMS: kernels.parallel's threshold, in elements, for a one-pass ufunc): a piece
# must outlast the hand-off to a worker by far. Measured: reports/threads.md, session 10.
GEMM_MACS_PER_ELEM = 16
# With ONNXPLAN_SPLIT_KERNELS on (the default), from half that: a transformer's 16.8 M
# multiply-add products (1024 x 128 x 128) split in two (session 10 left them whole: -0.05 ms
# each under load, a gain on a quiet machine); switched off, GEMM_MACS_PER_ELEM as before.
GEMM_MACS_PER_ELEM_SPLIT = 8
# Cut by its batch axis (each piece whole matrices: one BLAS call a matrix as in the whole
# product, the same bits, nothing packed twice), a product splits from 4 M multiply-adds a piece:
# transformer and GPT b16's attention products (64 batches of 64 x 64 x 32, 8.4 M, ~0.2 ms) in
# two. Cut by rows or columns from 4 M, mlp b64's 64 x 784 x 256 (12.8 M) took 1.4x its whole
# time at 2 threads, the least of 12 steps under load 3.5 (each piece packs the other operand
# whole; reports/threads.md, session 12): those stay at GEMM_MACS_PER_ELEM_SPLIT.
GEMM_MACS_PER_ELEM_BATCHES = 4
# On the GEMM pool (kernels/gemm_calls.py: a worker starts its calls without the interpreter
# lock) a product splits from 1 M multiply-adds a piece, by rows or columns alike: mlp b64's
# 64 x 784 x 256 (12.8 M) took 0.64x its whole time in two pieces on 2 idle vCPUs, its dW
# (784 x 64 x 256) 0.64x, 512 x 128 x 512 0.63x (reports/threads.md, session 21). Its 64 x 256 x
# 128 products (2.1 M, ~58 us) split too since session 26: 0.80x alone with a warm cache, 1.15x
# with 8 MB evicted before each (session 21), but within the step (the pool's workers spinning
# from the products before) mlp b64's step took 0.905-0.93x at 2 threads, transformer, GPT b16 and
# resnet18 b8 alike (in-process A/B, reports/threads.md, session 26).
GEMM_MACS_PER_ELEM_NATIVE = 1
# A product is cut by columns where each piece keeps this many (else by rows): one BLAS call per
# piece packs all of the other operand, and a piece of few rows against many columns (a
# convolution's 64 output channels x 25088 positions) runs its kernel on short panels. Least of 7,
# 2 pieces on 2 idle cores (ms; OpenBLAS's own 2 threads / rows / columns): resnet18 b8 layer1
# forward 64x576x25088 7.56 / 10.09 / 7.50, its dW 64x25088x576 8.16 / 9.15 / 7.50, a transformer's
# 1024x1024x256 1.33 / 2.74 / 1.51; VGG's last stage 512x4608x196 2.98 / 2.76 / 4.57 (98 columns a
# piece: rows). reports/threads.md, session 10.
MIN_PIECE_COLUMNS = 128
# One BLAS call computes at most this many rows of its output: OpenBLAS packs the left operand's
# rows of a call whole, 1.25 KiB a row (float32; measured 0.87 MiB at 256 rows, 1.81 at 1,024,
# 4.31 at 3,072, 8.06 at 6,144), in a buffer of each calling thread that stays resident, outside
# the plan. GPT-2 small's weight gradients (3,072 rows) put 8.5 MiB there at 2 threads; by blocks
# of 1,024 rows, at most 1.8 MiB a thread. Each block packs the right operand again: a row block
# of 1,024 does 2,048 multiply-adds per element it packs.
BLAS_ROW_BLOCK = 1024


def matmul_into(xp, a, b, out) -> None:
    """out = a @ b (numpy.matmul semantics), written into `out` without a full-size temporary.

    A batched left operand times a matrix is folded into one 2-D product when the batch
    dimensions of `a` and `out` collapse into rows (one BLAS call instead of one per batch).
    """
    a, b, out = _matmul_views(a, b, out)
    split_matmul(xp, a, b, out)


def _product_parts(a, b, out, native: bool = False) -> tuple[int, bool]:
    """(how many pieces out = a @ b is cut into, whether by its batch axis): by its multiply-adds,
    MIN_ELEMS times GEMM_MACS_PER_ELEM_NATIVE a piece on the GEMM pool (`native`), else
    GEMM_MACS_PER_ELEM_BATCHES where out has batches for every piece, else
    GEMM_MACS_PER_ELEM_SPLIT (GEMM_MACS_PER_ELEM with ONNXPLAN_SPLIT_KERNELS off)."""
    if a.ndim < 2 or b.ndim < 2:
        return 1, False
    macs = out.size * a.shape[-1]
    if not settings.current().split_kernels:
        return parallel.parts_for(macs, min_elems=parallel.MIN_ELEMS * GEMM_MACS_PER_ELEM), False
    per_batch = GEMM_MACS_PER_ELEM_NATIVE if native else GEMM_MACS_PER_ELEM_BATCHES
    if out.ndim >= 3:
        parts = parallel.parts_for(macs, min_elems=parallel.MIN_ELEMS * per_batch)
        if 1 < parts <= out.shape[0]:
            return parts, True
    per_piece = GEMM_MACS_PER_ELEM_NATIVE if native else GEMM_MACS_PER_ELEM_SPLIT
    return parallel.parts_for(macs, min_elems=parallel.MIN_ELEMS * per_piece), False


def _operand_batch(x, out_ndim: int, lo: int, hi: int):
    """x's slice for out's batch rows lo:hi (x broadcast against out's leading axis)."""
    axis = x.ndim - out_ndim
    if axis < 0 or x.shape[axis] == 1:
        return x
    return x[(slice(None),) * axis + (slice(lo, hi),)]


def _cut(out, parts: int, by_batches: bool) -> tuple[str, list[tuple[int, int]]] | None:
    """How split_matmul cuts out into `parts` pieces (its docstring): ("batches", "columns" or
    "rows", the (lo, hi) bounds), or None where it is not cut."""
    rows, cols = out.shape[-2], out.shape[-1]
    if by_batches or (out.ndim >= 3 and out.shape[0] >= parts):
        return "batches", parallel.bounds(out.shape[0], parts)
    if cols >= parts * MIN_PIECE_COLUMNS or (rows < parts <= cols):
        return "columns", parallel.bounds(cols, parts)
    if rows >= parts:
        return "rows", parallel.bounds(rows, parts)
    return None


def _piece_views(a, b, out, cut: str, lo: int, hi: int) -> tuple:
    """(a, b, out) of one piece of the cut."""
    if cut == "batches":
        return _operand_batch(a, out.ndim, lo, hi), _operand_batch(b, out.ndim, lo, hi), out[lo:hi]
    if cut == "columns":
        return a, b[..., lo:hi], out[..., lo:hi]
    return a[..., lo:hi, :], b, out[..., lo:hi, :]


def _piece_task(a, b, out, cut: str, lo: int, hi: int) -> Callable[[], None]:
    return lambda: blas_matmul(*_piece_views(a, b, out, cut, lo, hi))


def _policy() -> tuple[object, object]:
    """What a product's cut depends on: the thread policy and the settings in force (objects
    replaced, never changed, when either changes)."""
    return threads.current(), settings.current()


def _same(key: tuple[object, object] | None, now: tuple[object, object]) -> bool:
    return key is not None and key[0] is now[0] and key[1] is now[1]


class Product:
    """out = a @ b as split_matmul computes it, with the cut and the GEMM pool's calls worked out
    once for the thread policy and the settings in force (again when either changes): a bound
    kernel's views are the same every step."""

    def __init__(self, xp, a, b, out) -> None:
        self.xp, self.a, self.b, self.out = xp, a, b, out
        self._key: tuple[object, object] | None = None
        self._cut: tuple[str, list[tuple[int, int]]] | None = None
        self._gemm: gemm_calls.GemmPool | None = None
        self._calls: np.ndarray | None = None
        self._calls_at = 0  # the table's address (GemmPool.run's `address`)

    def _prepare(self) -> None:
        xp, a, b, out = self.xp, self.a, self.b, self.out
        gemm = gemm_calls.pool() if xp is np else None
        parts, by_batches = _product_parts(a, b, out, gemm is not None) if xp is np else (1, False)
        self._cut = _cut(out, parts, by_batches) if parts > 1 else None
        self._calls = None
        if gemm is not None and self._cut is not None:
            self._calls = gemm_calls.product_calls(a, b, out, *self._cut, BLAS_ROW_BLOCK)
        self._gemm = gemm if self._calls is not None else None
        self._calls_at = self._calls.ctypes.data if self._calls is not None else 0

    def _ready(self) -> None:
        now = _policy()
        if not _same(self._key, now):
            self._prepare()
            self._key = now

    def __call__(self) -> None:
        self._ready()
        xp, a, b, out = self.xp, self.a, self.b, self.out
        if self._cut is None:
            if xp is np:
                blas_matmul(a, b, out)
            else:
                xp.matmul(a, b, out=out)
        elif self._gemm is not None and self._calls is not None:
            gemm, calls, at = self._gemm, self._calls, self._calls_at
            parallel.run_elsewhere(lambda workers: gemm.run(calls, workers, address=at))
        else:
            cut, bounds = self._cut
            parallel.run([_piece_task(a, b, out, cut, lo, hi) for lo, hi in bounds])

    def pool_calls(self) -> np.ndarray | None:
        """The GEMM-pool calls that compute this product as __call__ does now (its pieces, or the
        whole product's calls where it is not cut: the same calls, the same bits), for a job it
        shares with another product (ProductPair); None where __call__ makes other calls (no
        pool, the Python pool's pieces, or numpy's own: gemm_calls.product_calls)."""
        self._ready()
        if self.xp is not np or (self._cut is not None and self._calls is None):
            return None
        if self._cut is not None:
            return self._calls
        return gemm_calls.product_calls(self.a, self.b, self.out, "rows", [(0, self.out.shape[-2])], BLAS_ROW_BLOCK)


@dataclass(frozen=True)
class ProductWork:
    """A bound product kernel's work as the executor may pair it (executor/interop.py): its
    Product, then `after` (alpha's scale, C's add; None: nothing)."""

    product: Product
    after: Callable[[], None] | None = None

    def __call__(self) -> None:
        self.product()
        self.finish()

    def finish(self) -> None:
        """What follows the product (`after`), where there is anything."""
        if self.after is not None:
            self.after()


class ProductPair:
    """Two independent products (executor/interop.py decides they are) as one job on the GEMM
    pool: every call of both, each product cut as it is alone (Product.pool_calls: the same
    calls, the same bits as running the two in turn), claimed by the calling thread and the
    workers as they come free. One hand-off instead of two, and no thread waits at the end of the
    first product for the other's last piece: mlp b64's dW and dX of fc2 (2 x 2.1 M
    multiply-adds) 112 -> 94 us, a transformer's 128 x 1024 x 512 pair 2.57 -> 2.31 ms, at 2
    threads (reports/threads.md, session 28). Cut for half the threads each instead (whole at 2:
    no operand packed twice) they took 82 us and 2.06 ms, but a product's bits would then depend
    on whether the plan's offsets let it pair: plans that differ only in their memory (a
    recomputation, a swap) must compute the same numbers. Made once per thread policy and
    settings."""

    def __init__(self, first: ProductWork, second: ProductWork) -> None:
        self.works = (first, second)
        self._key: tuple[object, object] | None = None
        self._job: tuple[gemm_calls.GemmPool, np.ndarray, int] | None = None

    def _prepare(self) -> None:
        self._job = None
        gemm = gemm_calls.pool()
        if threads.current().compute < 2 or gemm is None:
            return
        tables = [t for w in self.works if (t := w.product.pool_calls()) is not None]
        if len(tables) == len(self.works):
            table = np.concatenate(tables)
            self._job = (gemm, table, table.ctypes.data)

    def __call__(self) -> bool:
        """Both products, then each one's `after`; False, with nothing done, where they cannot
        run as one job (the caller runs the two nodes one after the other)."""
        now = _policy()
        if not _same(self._key, now):
            self._prepare()
            self._key = now
        if self._job is None:
            return False
        gemm, table, at = self._job
        parallel.run_elsewhere(lambda workers: gemm.run(table, workers, address=at))
        for w in self.works:
            w.finish()
        return True


def split_matmul(xp, a, b, out) -> None:
    """xp.matmul(a, b, out=out), cut for the compute threads (BLAS runs on one: onnxplan.threads)
    into pieces of out's leading batch axis, else of its columns when each piece keeps at least
    MIN_PIECE_COLUMNS of them, else of its rows, else of its columns; every piece one BLAS call
    (per matrix, per BLAS_ROW_BLOCK rows) into its own part of `out` (no copy, no scratch). The
    calls run on the GEMM pool (kernels/gemm_calls.py: no interpreter lock) where numpy would
    make them as cblas_sgemm calls, else the pieces on the Python pool (kernels.parallel); either
    way a call runs on whichever thread is free first, so a busy core never stalls the product.
    The bits may differ from one whole call's (OpenBLAS's kernel choice depends on the sizes), as
    they did between BLAS's own thread counts: GEMM results depend on the thread count. A bound
    kernel keeps a Product instead (its cut and calls worked out once)."""
    Product(xp, a, b, out)()


def blas_matmul(a, b, out) -> None:
    """np.matmul(a, b, out=out) by blocks of at most BLAS_ROW_BLOCK of out's rows, so BLAS's own
    packing buffer stays bounded. Like split_matmul's pieces, a block's bits may differ from the
    whole call's within its rounding (OpenBLAS's blocking depends on the sizes)."""
    rows = out.shape[-2] if out.ndim >= 2 and a.ndim >= 2 else 0
    if rows <= BLAS_ROW_BLOCK:
        np.matmul(a, b, out=out)
        return
    for lo, hi in parallel.bounds(rows, -(-rows // BLAS_ROW_BLOCK)):
        np.matmul(a[..., lo:hi, :], b, out=out[..., lo:hi, :])


def _matmul_views(a, b, out):
    """The (a, b, out) that matmul_into hands to one matmul call: a batched `a` times a matrix
    folded into rows where both `a` and `out` collapse, else the arrays as given."""
    if b.ndim == 2 and a.ndim > 2 and out.ndim == a.ndim:
        rows = out.size // out.shape[-1]
        a2, out2 = _rows_view(a, rows), _rows_view(out, rows)
        if a2 is not None and out2 is not None:
            return a2, b, out2
    return a, b, out


def _rows_view(x, rows: int):
    """x as a (rows, last) matrix when that is a view (leading dims contiguous), else None."""
    dims = [(n, st) for n, st in zip(x.shape[:-1], x.strides[:-1]) if n != 1]
    for (_n0, s0), (n1, s1) in itertools.pairwise(dims):
        if s0 != s1 * n1:
            return None
    return x.reshape(rows, x.shape[-1])


def _scale(xp, out, alpha: float) -> None:
    if alpha != 1.0:
        xp.multiply(out, out.dtype.type(alpha), out=out)


def _gemm_scratch(node, in_specs, out_specs) -> int:
    """beta*C with beta other than 0 or 1 and a C of more than 16 Ki elements: one C-sized buffer."""
    c = in_specs[2] if len(in_specs) > 2 else None
    beta = float(node.attrs.get("beta", 1.0))
    if c is None or beta in (0.0, 1.0) or c.numel <= 16384:
        return 0
    return c.nbytes


def _gemm_work(ctx: KernelContext, inputs, outputs) -> ProductWork:
    """Gemm's work with its views, attributes and scratch looked up now: the product, then alpha's
    scale and beta * C's add where there are any. The plain kernel runs it at once, the bind rule
    once per step."""
    xp, attrs = ctx.xp, ctx.attrs
    a, b = inputs[0], inputs[1]
    c = inputs[2] if len(inputs) > 2 else None
    y = outputs[0]
    a = a.T if attrs.get("transA", 0) else a
    b = b.T if attrs.get("transB", 0) else b
    alpha, beta = float(attrs.get("alpha", 1.0)), float(attrs.get("beta", 1.0))
    scaled = ctx.scratch_array(0, c.shape, c.dtype) if c is not None and beta not in (0.0, 1.0) \
        and c.size > 16384 else None
    if alpha == 1.0 and (c is None or beta == 0.0):
        return ProductWork(Product(xp, a, b, y))

    def after() -> None:
        _scale(xp, y, alpha)
        if c is None or beta == 0.0:
            return
        if beta == 1.0:
            xp.add(y, c, out=y)
        elif scaled is None:
            xp.add(y, c * y.dtype.type(beta), out=y)
        else:
            xp.multiply(c, c.dtype.type(beta), out=scaled)
            xp.add(y, scaled, out=y)

    return ProductWork(Product(xp, a, b, y), after)


def _bound(work: ProductWork) -> KernelFn:
    """A bound product kernel running `work`, which it carries for the executor's pairs
    (registry.PAIRABLE: executor/interop.py)."""
    def run(ctx_, inputs_, outputs_):
        work()

    setattr(run, PAIRABLE, work)
    return run


def _bind_gemm(ctx: KernelContext, inputs, outputs):
    """gemm's views and branches chosen once: the same calls, the same bits."""
    if ctx.xp is not np:
        return None
    return _bound(_gemm_work(ctx, inputs, outputs))


@kernel("Gemm", scratch=_gemm_scratch, bind=_bind_gemm)
def gemm(ctx: KernelContext, inputs, outputs) -> None:
    """Y = alpha * op(A) @ op(B) + beta * C (C unidirectionally broadcast to Y)."""
    _gemm_work(ctx, inputs, outputs)()


def _bind_matmul(ctx: KernelContext, inputs, outputs):
    """matmul_into's views chosen once: one matmul call per step, same bits."""
    if ctx.xp is not np:
        return None
    return _bound(ProductWork(Product(np, *_matmul_views(inputs[0], inputs[1], outputs[0]))))


@kernel("MatMul", bind=_bind_matmul)
def matmul(ctx: KernelContext, inputs, outputs) -> None:
    """Y = A @ B with numpy.matmul semantics (batch broadcasting, 1-D promotion)."""
    matmul_into(ctx.xp, inputs[0], inputs[1], outputs[0])


def fused_operand(x, trans: bool, trans_batch: bool):
    """A FusedMatMul operand as the plain-matmul view it stands for (never a copy).

    transBatch moves the leading axis to the row position ([b0, b1.., r, c] -> [b1.., b0, c]);
    trans then swaps the last two axes.
    """
    if x.ndim < 2:
        return x
    if trans_batch and x.ndim > 2:
        x = x.transpose(*range(1, x.ndim - 1), 0, x.ndim - 1)
    if trans:
        x = x.swapaxes(-1, -2)
    return x


def _bind_fused_matmul(ctx: KernelContext, inputs, outputs):
    """fused_matmul's operand views and matmul_into's choice made once: same calls, same bits."""
    if ctx.xp is not np:
        return None
    attrs = ctx.attrs
    a = fused_operand(inputs[0], bool(attrs.get("transA", 0)), bool(attrs.get("transBatchA", 0)))
    b = fused_operand(inputs[1], bool(attrs.get("transB", 0)), bool(attrs.get("transBatchB", 0)))
    y, alpha = outputs[0], float(attrs.get("alpha", 1.0))
    after = None if alpha == 1.0 else (lambda: _scale(np, y, alpha))
    return _bound(ProductWork(Product(np, *_matmul_views(a, b, y)), after))


@kernel("FusedMatMul", MS, bind=_bind_fused_matmul)
@kernel("TransposeMatMul", MS, bind=_bind_fused_matmul)
def fused_matmul(ctx: KernelContext, inputs, outputs) -> None:
    """Y = alpha * op(A) @ op(B), op = optional batch-axis move then transpose of the last two axes."""
    attrs = ctx.attrs
    a = fused_operand(inputs[0], bool(attrs.get("transA", 0)), bool(attrs.get("transBatchA", 0)))
    b = fused_operand(inputs[1], bool(attrs.get("transB", 0)), bool(attrs.get("transBatchB", 0)))
    matmul_into(ctx.xp, a, b, outputs[0])
    _scale(ctx.xp, outputs[0], float(attrs.get("alpha", 1.0)))


@kernel("Einsum")
def einsum(ctx: KernelContext, inputs, outputs) -> None:
    """numpy's einsum of the equation straight into the output (its sums of products, no BLAS)."""
    equation = ctx.attrs["equation"]
    equation = equation.decode() if isinstance(equation, bytes) else str(equation)
    operands = [x for x in inputs if x is not None]
    if _xp.is_cupy(ctx.xp):  # CuPy's einsum takes no out=
        ctx.xp.copyto(outputs[0], ctx.xp.einsum(equation.replace(" ", ""), *operands))
        return
    ctx.xp.einsum(equation.replace(" ", ""), *operands, out=outputs[0])

"""The rounding floors of normalisation statistics and their gradients (BatchNorm's running
statistics and saved mean, BatchNormalizationGrad, LayerNormalizationGrad) and of the loss: what float32
rounding on both sides may leave between two correct evaluations, growing with the reduction's
length (onnxplan.verification.step_check's docstring derives them)."""

from __future__ import annotations

import math

import numpy as np

__all__ = ["LAMBDA", "bn_floor", "bn_grad_floor", "ln_grad_floor", "loss_floor", "sum_rounding"]

_U32 = float(np.finfo(np.float32).eps) / 2  # float32 unit roundoff, 2^-24
LAMBDA = 6.0  # ... of a sum's rounding: exceeded with probability <= 2 exp(-LAMBDA^2 / 2) = 3e-8


def sum_rounding(k: float, extra: int) -> float:
    """c(K) = 2 (LAMBDA sqrt(K) + extra) u: c(K) sum|terms| bounds how far two independent float32
    evaluations of a sum of K terms (plus `extra` roundings of each term: products, divisions,
    stores) may differ. A float32 sum of K terms is off by <= gamma_K sum|terms| ~ K u sum|terms|
    whatever the order (Higham 3.1), but reaches that only adversarially; with the roundings
    independent and of mean zero it is off by <= LAMBDA sqrt(K) u sum|terms| with probability
    >= 1 - 2 exp(-LAMBDA^2 / 2) (Higham and Mary, SIAM J. Sci. Comput. 2019, Thm 2.4). That holds
    for any summation order, which matters: ONNX Runtime's BatchNorm and LayerNorm sum a row with
    Eigen in a few SIMD accumulators (sequential, ~K/16 terms each), not pairwise, so a log2(K)
    bound does not hold for them (at K = 100k: 17 u, against ~K/16 u worst case and 6 sqrt(K) u = 1900 u
    with the probabilistic bound). Used by every floor below, so they all grow as sqrt(K)."""
    return 2 * (LAMBDA * math.sqrt(max(float(k), 1.0)) + extra) * _U32


def bn_floor(x: np.ndarray, old_mean: np.ndarray, old_var: np.ndarray, momentum: float,
             rho: float = 0.0) -> dict[int, float]:
    """Output index -> the norm of an absolute error bound for a training BatchNorm's statistics
    (1: running mean, 2: running variance, 3: saved batch mean), per channel summed in L2.

    Each side sums a channel's N = batch x spatial float32 values (numpy here, Eigen's column sums
    in ONNX Runtime): off by <= c(N) sum|x| (sum_rounding: LAMBDA sqrt(N) u, so the floor grows with
    the reduction's length), with 4 roundings of each term besides: the division, x itself as
    stored, and two for the running update m*old + (1-m)*batch (each relative to its own term).
    The variance's terms (x - mean)^2 are bounded by x^2 (either way of computing it: E[(x-mu)^2]
    or E[x^2] - mu^2), times N/(N-1) where it is unbiased. x itself arrives with the relative
    error `rho` the reductions upstream left in it (the convolution before it; _Hooks._inherited),
    which moves the mean by up to rho mean|x| and the variance by 2 rho mean(x^2). So:
        running mean:  c (m |old_mean| + (1-m) mean|x|)         + rho (1-m) mean|x|
        running var:   c (m |old_var|  + (1-m) mean(x^2) N/(N-1)) + 2 rho (1-m) mean(x^2) N/(N-1)
        batch mean:    c mean|x|                                   + rho mean|x|
    Where a statistic is well above its rounding this is orders below 1e-4 of it and changes
    nothing; it only matters where the exact value cancels to ~0 (then it is what both sides'
    rounding may differ by)."""
    xd = x.astype(np.float64)
    axes = tuple(k for k in range(xd.ndim) if k != 1)
    n = max(xd.size // max(xd.shape[1], 1), 1) if xd.ndim >= 2 else max(xd.size, 1)
    c = sum_rounding(n, 4)
    m = float(momentum)
    abs_mean = np.mean(np.abs(xd), axis=axes) if xd.ndim >= 2 else np.abs(xd)
    sq_mean = np.mean(xd * xd, axis=axes) * (n / (n - 1) if n > 1 else 1.0) if xd.ndim >= 2 else xd * xd
    old_m, old_v = np.abs(np.asarray(old_mean, np.float64)), np.abs(np.asarray(old_var, np.float64))
    return {1: float(np.linalg.norm(c * (m * old_m + (1 - m) * abs_mean) + rho * (1 - m) * abs_mean)),
            2: float(np.linalg.norm(c * (m * old_v + (1 - m) * sq_mean) + 2 * rho * (1 - m) * sq_mean)),
            3: float(np.linalg.norm((c + rho) * abs_mean))}


def ln_grad_floor(dy: np.ndarray, x: np.ndarray, scale: np.ndarray, mean: np.ndarray, inv_std: np.ndarray,
                  axis: int = -1) -> dict[int, tuple[float, float]]:
    """bn_grad_floor's bound for LayerNormalizationGrad (0: dX, 1: dscale, 2: dbias), normalised over
    the axes from `axis` on (D elements per row): dX = inv_std (scale dY - mean_D(scale dY)
    - x^ mean_D(scale dY x^)) sums D terms per element, dscale = sum_rows(dY x^) and dbias =
    sum_rows(dY) sum R = rows terms per element (a batch x sequence long reduction): each sum
    off by <= c(K) sum|terms| (sum_rounding, 4 roundings of each term besides), the rounding of x^
    itself (x - mean cancels where a row is ~constant) included as in bn_grad_floor."""
    d, xd = dy.astype(np.float64), x.astype(np.float64)
    axis = axis % max(xd.ndim, 1)
    stat = tuple(range(axis, xd.ndim))  # the normalised axes (D), per row
    rows = tuple(range(axis))  # what dscale / dbias sum over (R)
    dim, nrows = max(math.prod(xd.shape[axis:]), 1), max(math.prod(xd.shape[:axis]), 1)
    c_d, c_r = sum_rounding(dim, 4), sum_rounding(nrows, 4)
    rshape = xd.shape[:axis] + (1,) * len(stat)
    mu, istd = np.asarray(mean, np.float64).reshape(rshape), np.abs(np.asarray(inv_std, np.float64)).reshape(rshape)
    xh = (xd - mu) * istd
    sd = np.asarray(scale, np.float64) * d  # scale broadcasts over the normalised axes
    e = c_d * (np.abs(xd) + np.abs(mu)) * istd  # the rounding of x^
    a, b = np.sum(np.abs(sd), axis=stat, keepdims=True), np.sum(np.abs(sd * xh), axis=stat, keepdims=True)
    de = np.sum(np.abs(sd) * e, axis=stat, keepdims=True)
    dx = istd * (c_d * (np.abs(sd) + a / dim + np.abs(xh) * b / dim) + e * b / dim + np.abs(xh) * de / dim)
    dscale = np.sum(np.abs(d * xh), axis=rows) + np.sum(np.abs(d) * e, axis=rows) / c_r
    return {0: (c_d, float(np.linalg.norm(dx)) / c_d), 1: (c_r, float(np.linalg.norm(dscale))),
            2: (c_r, float(np.linalg.norm(np.sum(np.abs(d), axis=rows))))}


def bn_grad_floor(dy: np.ndarray, x: np.ndarray, scale: np.ndarray, mean: np.ndarray,
                  inv_std: np.ndarray) -> dict[int, tuple[float, float]]:
    """Output index -> (c, M): c M is the norm of an absolute error bound for BatchNormalizationGrad (0: dX,
    1: dscale = sum(dY x^), 2: dbias = sum(dY)), by the same rounding count as bn_floor: a sum
    of N terms is off by <= c(N) sum|terms| (sum_rounding). dX = scale inv_std (dY - dbias/N - x^ dscale/N)
    is off by c u |scale inv_std| (|dY| + sum|dY|/N + |x^| sum|dY x^|/N) per element, plus
    what the rounding e of x^ itself moves them by (dscale: sum|dY| e; dX: |scale inv_std|
    (e sum|dY x^|/N + |x^| sum|dY| e/N)). A BN
    whose output feeds a per-channel-affine-invariant op (a linear map into another BN) has a
    dbias that is zero in exact arithmetic: pure rounding on both sides."""
    d, xd = dy.astype(np.float64), x.astype(np.float64)
    if xd.ndim < 2:
        return {}
    shape = (1, -1) + (1,) * (xd.ndim - 2)
    axes = tuple(k for k in range(xd.ndim) if k != 1)
    n = max(xd.size // max(xd.shape[1], 1), 1)
    c = sum_rounding(n, 4)
    xh = (xd - np.asarray(mean, np.float64).reshape(shape)) * np.asarray(inv_std, np.float64).reshape(shape)
    a, b = np.sum(np.abs(d), axis=axes), np.sum(np.abs(d * xh), axis=axes)
    g = np.abs(np.asarray(scale, np.float64) * np.asarray(inv_std, np.float64)).reshape(shape)
    # x^ itself is rounded: x - mean cancels where a channel is ~constant (x^ then is rounding
    # times inv_std, up to 1/sqrt(eps)): its error e <= c u (|x| + |mean|) inv_std
    e = c * (np.abs(xd) + np.abs(np.asarray(mean, np.float64)).reshape(shape)) * \
        np.abs(np.asarray(inv_std, np.float64)).reshape(shape)
    de = np.sum(np.abs(d) * e, axis=axes)  # what e moves dscale = sum(dY x^) by
    dx = g * (c * (np.abs(d) + (a / n).reshape(shape) + np.abs(xh) * (b / n).reshape(shape))
              + e * (b / n).reshape(shape) + np.abs(xh) * (de / n).reshape(shape))
    return {0: (c, float(np.linalg.norm(dx)) / c), 1: (c, float(np.linalg.norm(b + de / c))),
            2: (c, float(np.linalg.norm(a)))}


def loss_floor(node, inputs: list) -> float:
    """An absolute error bound for the loss node `node` (ONNX Runtime's training model) evaluated on
    `inputs` by two sides, from its reduction's length and magnitudes (sum_rounding):
    - SoftmaxCrossEntropyLoss over K labelled elements of V classes: each term log sum exp(x - max)
      - (x_y - max) is off by c(V) (a V-term sum of values in (0, 1] whose log turns its relative
      error into an absolute one) plus 4 u (|x_y| + |max|) (the subtractions), and their mean by
      c(K) mean|term| = c(K) |loss| besides (the terms are >= 0);
    - any other reduction to the scalar loss (ReduceMean of MSELoss: K = |in|): c(K) mean|in|.
    Above the 1e-5 loss tolerance from ~200 terms on (GPT-2 at 4 x 256 tokens over 50257 words:
    ~4e-5 of the loss)."""
    xs = [None if x is None else np.asarray(x) for x in inputs]
    if not xs or xs[0] is None or xs[0].dtype.kind != "f":
        return 0.0
    x = xs[0].astype(np.float64)
    if node.op_type == "SoftmaxCrossEntropyLoss" and len(xs) > 1 and xs[1] is not None and x.ndim >= 2:
        scores = np.moveaxis(x, 1, -1).reshape(-1, x.shape[1])  # [K, V]
        labels = xs[1].reshape(-1)
        ignore = next((a.i for a in node.attribute if a.name == "ignore_index"), None)
        keep = labels != ignore if ignore is not None else np.ones(labels.shape, bool)
        if not keep.any():
            return 0.0
        scores, labels = scores[keep], labels[keep]
        top = scores.max(axis=1)
        shifted = scores - top[:, None]
        lse = np.log(np.exp(shifted).sum(axis=1))
        picked = scores[np.arange(len(labels)), np.clip(labels, 0, scores.shape[1] - 1)]
        terms = lse - (picked - top)
        per_term = sum_rounding(scores.shape[1], 2) + 4 * _U32 * (np.abs(picked) + np.abs(top))
        return float(sum_rounding(len(terms), 2) * np.mean(np.abs(terms)) + np.mean(per_term))
    return float(sum_rounding(x.size, 2) * np.mean(np.abs(x))) if x.size else 0.0  # a scalar loss: K = |in|

"""The C text of the fused row loops (kernels/native.py compiles it after native_source.SOURCE,
in one library): the layer norms and their gradients (kernels/norm_loops.py) and GatherGrad's
scatter-add (kernels/_xp.scatter_add). native_source.SOURCE declares what these use (the
headers, the eight-float vector type v8)."""

ROWS_SOURCE = r"""
/* ---- LayerNormalization and SimplifiedLayerNormalization, and their gradients (norm_loops.py) ----
   g: rows, m (the normalized size), simplified (1: the RMS norm: no mean, no bias); c: eps. */
#define LN_ROWS 8

/* Y, mean and 1/sd of rows r0..r1 in ORT's LayerNormImpl order: per row the sums of x and x*x in
   order along it (eight rows at once, each its own chain), mean = s / m, var = q / m - mean * mean
   (simplified: q / m), sd = sqrtf(var + eps), y = (x - mean) / sd * scale + bias: the numpy path's
   operations in its order, each rounded once (its bits). A block's sums are done before any of
   its rows is written: y may be x. */
void ln_fwd_f32(const int64_t *g, const float *c, const float *x, const float *scale, const float *bias,
                float *y, float *mean_o, float *inv_o, int64_t r0, int64_t r1) {
    const int64_t m = g[1], simplified = g[2];
    const float eps = c[0], size = (float)m;
    for (int64_t r = r0; r < r1; r += LN_ROWS) {
        const int64_t k = r1 - r < LN_ROWS ? r1 - r : LN_ROWS;
        const float *xb = x + r * m;
        float s[LN_ROWS] = {0}, q[LN_ROWS] = {0};
        if (k == LN_ROWS) {
            for (int64_t h = 0; h < m; h++)
                for (int j = 0; j < LN_ROWS; j++) { const float v = xb[j * m + h]; s[j] += v; q[j] += v * v; }
        } else {
            for (int64_t h = 0; h < m; h++)
                for (int64_t j = 0; j < k; j++) { const float v = xb[j * m + h]; s[j] += v; q[j] += v * v; }
        }
        for (int64_t j = 0; j < k; j++) {
            const float mean = s[j] / size;
            float var = q[j] / size;
            if (!simplified) var = var - mean * mean;
            const float sd = sqrtf(var + eps);
            const float *xr = xb + j * m;
            float *yr = y + (r + j) * m;
            if (simplified) {
                for (int64_t h = 0; h < m; h++) yr[h] = xr[h] / sd * scale[h];
            } else if (bias) {
                for (int64_t h = 0; h < m; h++) yr[h] = (xr[h] - mean) / sd * scale[h] + bias[h];
            } else {
                for (int64_t h = 0; h < m; h++) yr[h] = (xr[h] - mean) / sd * scale[h];
            }
            if (mean_o) mean_o[r + j] = mean;
            if (inv_o) inv_o[r + j] = 1.0f / sd;
        }
    }
}

/* dscale and dbias, columns c0..c1 over rows r0..r1: xh = (x - mean) * inv (simplified: x * inv),
   each column's sum of dy * xh (and of dy) in order over the rows; into dscale and dbias when
   `first`, else into acc_s and acc_b (m floats each) and then added to them: the numpy path's
   operations in its order (its bits). */
void ln_grad_cols_f32(const int64_t *g, const float *dy, const float *x, const float *mean, const float *inv,
                      float *dscale, float *dbias, float *acc_s, float *acc_b, int64_t r0, int64_t r1,
                      int64_t c0, int64_t c1, int64_t first) {
    const int64_t m = g[1], simplified = g[2];
    float *ts = dscale ? (first ? dscale : acc_s) : 0, *tb = dbias ? (first ? dbias : acc_b) : 0;
    for (int64_t j = c0; j < c1; j++) {
        if (ts) ts[j] = 0.0f;
        if (tb) tb[j] = 0.0f;
    }
    for (int64_t r = r0; r < r1; r++) {
        const float *xr = x + r * m, *dr = dy + r * m;
        const float iv = inv[r], mu = simplified ? 0.0f : mean[r];
        if (ts && simplified) {
            for (int64_t j = c0; j < c1; j++) ts[j] += dr[j] * (xr[j] * iv);
        } else if (ts) {
            for (int64_t j = c0; j < c1; j++) ts[j] += dr[j] * ((xr[j] - mu) * iv);
        }
        if (tb)
            for (int64_t j = c0; j < c1; j++) tb[j] += dr[j];
    }
    if (first) return;
    for (int64_t j = c0; j < c1; j++) {
        if (ts) dscale[j] = dscale[j] + ts[j];
        if (tb) dbias[j] = dbias[j] + tb[j];
    }
}

/* dX of rows r0..r1: b = dy * scale * inv, xh as above, mean_b = sum(b) / m and mean_c =
   sum(b * xh) / m (eight lanes along the row, added pairwise, then the tail), dx = (b - mean_b) -
   xh * mean_c (simplified: b - xh * mean_c). Each element is read before it is written: dx may be
   dy or x. */
void ln_grad_rows_f32(const int64_t *g, const float *dy, const float *x, const float *scale, const float *mean,
                      const float *inv, float *dx, int64_t r0, int64_t r1) {
    const int64_t m = g[1], simplified = g[2];
    const float size = (float)m;
    for (int64_t r = r0; r < r1; r++) {
        const float *xr = x + r * m, *dr = dy + r * m;
        float *out = dx + r * m;
        const float iv = inv[r], mu = simplified ? 0.0f : mean[r];
        v8 sb = (v8){0}, sc = (v8){0};
        int64_t j = 0;
        for (; j + 8 <= m; j += 8) {
            v8 xv, dv, sv;
            memcpy(&xv, xr + j, 32);
            memcpy(&dv, dr + j, 32);
            memcpy(&sv, scale + j, 32);
            const v8 b = dv * sv * iv, xh = simplified ? xv * iv : (xv - mu) * iv;
            sb += b;
            sc += b * xh;
        }
        float tb = 0.0f, tc = 0.0f;
        for (; j < m; j++) {
            const float b = dr[j] * scale[j] * iv, xh = simplified ? xr[j] * iv : (xr[j] - mu) * iv;
            tb += b;
            tc += b * xh;
        }
        const float mb = (((sb[0] + sb[1]) + (sb[2] + sb[3])) + ((sb[4] + sb[5]) + (sb[6] + sb[7])) + tb) / size;
        const float mc = (((sc[0] + sc[1]) + (sc[2] + sc[3])) + ((sc[4] + sc[5]) + (sc[6] + sc[7])) + tc) / size;
        if (simplified) {
            for (j = 0; j < m; j++) {
                const float b = dr[j] * scale[j] * iv;
                out[j] = b - (xr[j] * iv) * mc;
            }
        } else {
            for (j = 0; j < m; j++) {
                const float b = dr[j] * scale[j] * iv;
                out[j] = (b - mb) - ((xr[j] - mu) * iv) * mc;
            }
        }
    }
}

/* ---- GatherGrad's scatter-add over rows (_xp.scatter_add) ----
   out[index[k]] += values[k] for k = 0 .. count-1 in order, rows of `width` floats (indices
   checked and made non-negative by the caller): numpy's add.at's additions in its order, so its
   bits; a row's elements in eight lanes at once (each element its own sum). */
void scatter_add_rows_f32(float *out, const int64_t *index, const float *values, int64_t count, int64_t width) {
    for (int64_t k = 0; k < count; k++) {
        float *o = out + index[k] * width;
        const float *v = values + k * width;
        for (int64_t j = 0; j < width; j++) o[j] += v[j];
    }
}

/* ---- the exact GELU and its gradient (kernels/elementwise.py) ----
   Elements i0..i1 of contiguous float32 arrays, eight at a time (the output may be an input):
   erf by Abramowitz and Stegun's 7.1.26 (|error| <= 1.5e-7; torch's own vectorised erf is this
   formula), erf(z) = sign(z) (1 - t (a1 + a2 t + a3 t^2 + a4 t^3 + a5 t^4) e), t = 1 / (1 + p |z|),
   e = exp(-z z) by vexp (0 below -87.34: erf is 1 there), z = x / sqrt 2; multiply-adds fused
   here (GCC's optimize attribute; the library's other loops keep -ffp-contract=off): 1.2-1.3x
   faster, within the same error. Every element alone: the same bits at any cut. Each is a piece
   of the GEMM pool's ROWS jobs (x, y, r0, r1, c), its "rows" elements. */
static inline v8 gelu_erf(v8 z, v8 *e) {
    const vi8 sign = (vi8){0} + (int)0x80000000;
    const v8 a = (v8)((vi8)z & ~sign);
    const v8 t = 1.0f / (a * 0.3275911f + 1.0f);
    const v8 t2 = t * t;  /* the polynomial in Estrin's form: a shorter chain than Horner's */
    const v8 poly = t * ((0.254829592f + t * -0.284496736f) + t2 * ((1.421413741f + t * -1.453152027f) + t2 * 1.061405429f));
    *e = vexp((v8)((vi8)(z * z) | sign));
    return (v8)((vi8)(1.0f - poly * *e) | ((vi8)z & sign));
}

/* y = x * 0.5 * (1 + erf(x / sqrt 2)); `unused`: the ROWS call's width. */
__attribute__((optimize("fp-contract=fast"))) void gelu_f32(const float *x, float *y, int64_t i0, int64_t i1, int64_t unused) {
    (void)unused;
    for (int64_t i = i0; i < i1; i += 8) {
        const int64_t w = i1 - i < 8 ? i1 - i : 8;
        const v8 v = load8(x + i, w, 0.0f);
        v8 e;
        const v8 erf = gelu_erf(v * 0.70710678118654752f, &e);
        store8(y + i, v * 0.5f * (1.0f + erf), w);
    }
}

/* ORT's GeluGrad (torch's gelu_backward): dx = dy (0.5 (1 + erf(x / sqrt 2)) + x kAlpha exp(-x x / 2)),
   kAlpha = 1 / sqrt(2 pi); exp(-x x / 2) is erf's e. x's address in the ROWS call's last field. */
__attribute__((optimize("fp-contract=fast"))) void gelu_grad_f32(const float *dy, float *dx, int64_t i0, int64_t i1, int64_t x_at) {
    const float *x = (const float *)(intptr_t)x_at;
    for (int64_t i = i0; i < i1; i += 8) {
        const int64_t w = i1 - i < 8 ? i1 - i : 8;
        const v8 v = load8(x + i, w, 0.0f), g = load8(dy + i, w, 0.0f);
        v8 e;
        const v8 erf = gelu_erf(v * 0.70710678118654752f, &e);
        store8(dx + i, g * (0.5f * (1.0f + erf) + v * (0.39894228040143268f * e)), w);
    }
}

/* ---- ReLU and its gradient (kernels/elementwise.py), ONNX Runtime's: y = x < 0 ? 0 : x (NaN and
   -0 kept), dx = x > 0 ? dy : 0 (0 where x is NaN); selects, nothing rounded. Elements i0..i1,
   eight at a time; the output may be an input. A piece of a ROWS job as the GELU's. */
void relu_f32(const float *x, float *y, int64_t i0, int64_t i1, int64_t unused) {
    (void)unused;
    for (int64_t i = i0; i < i1; i += 8) {
        const int64_t w = i1 - i < 8 ? i1 - i : 8;
        const v8 v = load8(x + i, w, 0.0f);
        store8(y + i, (v8)((vi8)v & ~(v < 0.0f)), w);
    }
}

void relu_grad_f32(const float *dy, float *dx, int64_t i0, int64_t i1, int64_t x_at) {
    const float *x = (const float *)(intptr_t)x_at;
    for (int64_t i = i0; i < i1; i += 8) {
        const int64_t w = i1 - i < 8 ? i1 - i : 8;
        const v8 v = load8(x + i, w, 0.0f), g = load8(dy + i, w, 0.0f);
        store8(dx + i, (v8)((vi8)g & (v > 0.0f)), w);
    }
}
"""

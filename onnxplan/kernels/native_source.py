"""The C source of the fused loops (kernels/native.py compiles it on first use): the AdamW update,
the small convolution and its dW, SoftmaxCrossEntropyLoss and its gradient, the depthwise
convolution, its dX and its dW. What each loop computes, in which order, and what its bits are:
native.py's docstring and the comments below."""

SOURCE = r"""
#include <math.h>
#include <stdint.h>
#include <string.h>
/* ONNX Runtime's AdamWOptimizer (orttraining cpu adamw.cc), one element at a time; outputs may be
   the inputs themselves (each element read before it is written). c: lr, alpha, beta, eps, weight
   decay, correct_bias (1 or 0; see ADAMW_CONSTANTS); the bias corrections for `step` as ORT makes
   them: pow in double, cast to float, the rest in float (as kernels/optimizer.py's numpy path). */
void adamw_f32(int64_t n, const float *p, const float *g, const float *m, const float *v,
               float *po, float *mo, float *vo, const float *c, int64_t step, int mode) {
    const float lr = c[0], alpha = c[1], beta = c[2], eps = c[3], wd = c[4];
    const float oma = 1.0f - alpha, omb = 1.0f - beta, lrwd = lr * wd;
    float acorr = 1.0f, bcorr = 1.0f, lrc = lr;
    if (c[5] != 0.0f) {
        acorr = 1.0f - (float)pow((double)alpha, (double)step);
        bcorr = 1.0f - (float)pow((double)beta, (double)step);
        lrc = (lr * sqrtf(bcorr)) / acorr;
    }
    if (mode == 0) {  /* PyTorch form: decay first; bias corrections on m and v */
#pragma GCC ivdep
        for (int64_t i = 0; i < n; i++) {
            float w = p[i], gi = g[i];
            if (wd != 0.0f) { float t = w * lr; t = t * wd; w = w - t; }
            float mn = m[i] * alpha + gi * oma;
            float t1 = gi * omb; t1 = t1 * gi;
            float vn = v[i] * beta + t1;
            float d = sqrtf(vn / bcorr) + eps; d = d * acorr;
            float u = mn * lr; u = u / d;
            po[i] = w - u; mo[i] = mn; vo[i] = vn;
        }
    } else {  /* Hugging Face form: corrected learning rate, decay after the update */
#pragma GCC ivdep
        for (int64_t i = 0; i < n; i++) {
            float w = p[i], gi = g[i];
            float mn = m[i] * alpha + gi * oma;
            float t1 = gi * omb; t1 = t1 * gi;
            float vn = v[i] * beta + t1;
            float d = sqrtf(vn) + eps;
            float u = mn * lrc; u = u / d;
            w = w - u;
            if (wd != 0.0f) { float t = w * lrwd; w = w - t; }
            po[i] = w; mo[i] = mn; vo[i] = vn;
        }
    }
}
/* ---- a 2-D convolution with few output channels, by bands of output rows (conv_small.py) ----
   g: c, h, w, kh, kw, oh, ow, sh, sw, ph, pw, dh, dw (X (n, c, h, w) and Y (n, m, oh, ow),
   contiguous; W (m, K), K = c * kh * kw in (c, kh, kw) order). */
typedef float v8 __attribute__((vector_size(32)));

/* col[k - k0][(i - i0) * ow + j] = the tap k (c, a, b) of output (i, j), 0 in the padding, for
   output rows i0..i1 of one image. */
static void band_cols(const int64_t *g, const float *img, float *col, int64_t k0, int64_t k1,
                      int64_t i0, int64_t i1) {
    const int64_t h = g[1], w = g[2], kh = g[3], kw = g[4], ow = g[6], sh = g[7], sw = g[8],
                  ph = g[9], pw = g[10], dh = g[11], dw = g[12];
    const int64_t len = (i1 - i0) * ow;
    for (int64_t k = k0; k < k1; k++) {
        const int64_t ci = k / (kh * kw), a = (k / kw) % kh, b = k % kw;
        float *dst = col + (k - k0) * len;
        const int64_t off = b * dw - pw;
        int64_t j0 = 0, j1 = ow;  /* outputs whose input column lies inside */
        while (j0 < ow && j0 * sw + off < 0) j0++;
        while (j1 > j0 && (j1 - 1) * sw + off >= w) j1--;
        const float *plane = img + ci * h * w;
        for (int64_t i = i0; i < i1; i++, dst += ow) {
            const int64_t r = i * sh - ph + a * dh;
            if (r < 0 || r >= h) { memset(dst, 0, (size_t)ow * sizeof(float)); continue; }
            const float *src = plane + r * w + off;
            for (int64_t j = 0; j < j0; j++) dst[j] = 0.0f;
            if (sw == 1) {
                memcpy(dst + j0, src + j0, (size_t)(j1 - j0) * sizeof(float));
            } else if (sw == 2) {  /* eight outputs from sixteen inputs: one shuffle */
                int64_t j = j0;
                for (; j + 8 <= j1 && 2 * j + 16 <= w - off; j += 8) {
                    v8 lo, hi;
                    memcpy(&lo, src + 2 * j, 32);
                    memcpy(&hi, src + 2 * j + 8, 32);
#ifdef __clang__
                    v8 even = __builtin_shufflevector(lo, hi, 0, 2, 4, 6, 8, 10, 12, 14);
#else
                    typedef int i8 __attribute__((vector_size(32)));
                    v8 even = __builtin_shuffle(lo, hi, (i8){0, 2, 4, 6, 8, 10, 12, 14});
#endif
                    memcpy(dst + j, &even, 32);
                }
                for (; j < j1; j++) dst[j] = src[2 * j];
            } else {
                for (int64_t j = j0; j < j1; j++) dst[j] = src[j * sw];
            }
            for (int64_t j = j1; j < ow; j++) dst[j] = 0.0f;
        }
    }
}

/* Y[n, mi] = sum over k in order of W[mi, k] col[k] (+ bias[mi]) for images n0..n1, `band`
   output rows at a time through `col` (K * band * ow floats). m <= 8. */
void small_conv_fwd(const int64_t *g, int64_t m, const float *x, const float *wt, const float *bias,
                    float *y, float *col, int64_t n0, int64_t n1, int64_t band) {
    const int64_t K = g[0] * g[3] * g[4], oh = g[5], ow = g[6], L = oh * ow, image = g[0] * g[1] * g[2];
    for (int64_t n = n0; n < n1; n++) {
        for (int64_t i0 = 0; i0 < oh; i0 += band) {
            const int64_t i1 = i0 + band < oh ? i0 + band : oh, len = (i1 - i0) * ow;
            band_cols(g, x + n * image, col, 0, K, i0, i1);
            float *out = y + n * m * L + i0 * ow;
            int64_t p = 0;
            for (; p + 8 <= len; p += 8) {
                v8 acc[8];
                for (int64_t mi = 0; mi < m; mi++) acc[mi] = (v8){0};
                for (int64_t k = 0; k < K; k++) {
                    v8 c;
                    memcpy(&c, col + k * len + p, 32);
                    for (int64_t mi = 0; mi < m; mi++) acc[mi] += wt[mi * K + k] * c;
                }
                for (int64_t mi = 0; mi < m; mi++) {
                    if (bias) acc[mi] += bias[mi];
                    memcpy(out + mi * L + p, &acc[mi], 32);
                }
            }
            for (; p < len; p++) {
                for (int64_t mi = 0; mi < m; mi++) {
                    float a = 0.0f;
                    for (int64_t k = 0; k < K; k++) a += wt[mi * K + k] * col[k * len + p];
                    if (bias) a += bias[mi];
                    out[mi * L + p] = a;
                }
            }
        }
    }
}

/* dW[mi, k] for taps k0..k1 (dW (m, K)) = the sum over images n < count and bands of `band`
   output rows (in order) of each band's sum of dY[n, mi] col[k] (eight lanes, then the lanes
   pairwise), the bands' sums in double. `col` holds (k1 - k0) * band * ow floats. m <= 8,
   m * (k1 - k0) <= 4096. */
void small_conv_dw(const int64_t *g, int64_t m, const float *x, const float *dy, float *dwt,
                   float *col, int64_t count, int64_t k0, int64_t k1, int64_t band) {
    const int64_t K = g[0] * g[3] * g[4], oh = g[5], ow = g[6], L = oh * ow, image = g[0] * g[1] * g[2];
    const int64_t nk = k1 - k0;
    double acc[4096];
    for (int64_t i = 0; i < m * nk; i++) acc[i] = 0.0;
    for (int64_t n = 0; n < count; n++) {
        for (int64_t i0 = 0; i0 < oh; i0 += band) {
            const int64_t i1 = i0 + band < oh ? i0 + band : oh, len = (i1 - i0) * ow;
            band_cols(g, x + n * image, col, k0, k1, i0, i1);
            const float *d = dy + n * m * L + i0 * ow;
            for (int64_t k = 0; k < nk; k++) {
                const float *cr = col + k * len;
                v8 s[8];
                for (int64_t mi = 0; mi < m; mi++) s[mi] = (v8){0};
                int64_t p = 0;
                for (; p + 8 <= len; p += 8) {
                    v8 c;
                    memcpy(&c, cr + p, 32);
                    for (int64_t mi = 0; mi < m; mi++) {
                        v8 dv;
                        memcpy(&dv, d + mi * L + p, 32);
                        s[mi] += dv * c;
                    }
                }
                for (int64_t mi = 0; mi < m; mi++) {
                    float t = ((s[mi][0] + s[mi][1]) + (s[mi][2] + s[mi][3])) +
                              ((s[mi][4] + s[mi][5]) + (s[mi][6] + s[mi][7]));
                    for (int64_t q = p; q < len; q++) t += d[mi * L + q] * cr[q];
                    acc[mi * nk + k] += (double)t;
                }
            }
        }
    }
    for (int64_t mi = 0; mi < m; mi++)
        for (int64_t k = 0; k < nk; k++) dwt[mi * K + k0 + k] = (float)acc[mi * nk + k];
}
/* ---- SoftmaxCrossEntropyLoss and its gradient (softmax_loss.py) ----
   g: n (the scores' rows), c, d, start (the labels' row of the first), n_all (the labels' rows),
   reduction (0 none, 1 sum, 2 mean); scores and log_prob [n, c, d], labels [n_all, d]; w of a
   sample: weight[label] (or 1), 0 where label == *ignore. Each returns -1, or the index in
   labels of a label out of [0, c) that is not *ignore. */
typedef int vi8 __attribute__((vector_size(32)));

/* exp of eight floats: x = k ln2 + r (k = round(x log2e), ln2 in Cody-Waite's two parts),
   exp(r) by Cephes' expf polynomial, times 2^k made in the exponent bits; 0 below -87.34 (no
   subnormals), inf above 88.37 (exp's float range ends at 88.72), NaN kept. */
static inline v8 vexp(v8 x) {
    const vi8 under = x < -87.3365478515625f, over = x > 88.3762626647949f;
    const v8 inf = (v8){0} + INFINITY;
    x = (v8)((vi8)x & ~(under | over));
    const v8 t = x * 1.44269504088896341f + 12582912.0f;  /* 1.5 * 2^23: rounds to an integer */
    const v8 k = t - 12582912.0f;
    v8 r = x - k * 0.693359375f;
    r = r - k * -2.12194440e-4f;
    const v8 z = r * r;  /* the polynomial in Estrin's form: three pairs at once (a shorter chain) */
    const v8 a = r * 1.6666665459e-1f + 5.0000001201e-1f, b = r * 8.3334519073e-3f + 4.1665795894e-2f,
             e = r * 1.9875691500e-4f + 1.3981999507e-3f;
    const v8 p = (a + z * (b + z * e)) * z + r + 1.0f;
    const v8 scale = (v8)((((vi8)t - 0x4B400000) + 127) << 23);
    const v8 y = p * scale;
    return (v8)(((vi8)y & ~(under | over)) | ((vi8)inf & over));
}

/* Up to eight floats from p (w of them; the other lanes `pad`), and their store. A part is moved
   lane by lane: one memcpy of w floats would serve eight too (compilers merge the two into a
   `rep movs`, several times slower). */
static inline v8 load8(const float *p, int64_t w, float pad) {
    v8 v;
    if (w == 8) {
        memcpy(&v, p, 32);
    } else {
        for (int q = 0; q < 8; q++) v[q] = q < w ? p[q] : pad;
    }
    return v;
}

static inline void store8(float *p, v8 v, int64_t w) {
    if (w == 8) {
        memcpy(p, &v, 32);
    } else {
        for (int q = 0; q < 8; q++)
            if (q < w) p[q] = v[q];
    }
}

static inline v8 vmax(v8 a, v8 b) {
    const vi8 gt = b > a;
    return (v8)(((vi8)a & ~gt) | ((vi8)b & gt));
}

/* A row's log-softmax (d == 1): m = the max; s = the sum of exp(x - m), eight lanes in order
   along the row, the lanes added pairwise; lp = (x - m) - logf(s). */
static void lsm_row(const float *x, float *lp, int64_t c) {
    v8 m8 = (v8){0} - INFINITY, s8 = (v8){0};
    for (int64_t j = 0; j < c; j += 8) m8 = vmax(m8, load8(x + j, c - j < 8 ? c - j : 8, -INFINITY));
    float m = m8[0];
    for (int q = 1; q < 8; q++) m = m8[q] > m ? m8[q] : m;
    for (int64_t j = 0; j < c; j += 8) s8 += vexp(load8(x + j, c - j < 8 ? c - j : 8, -INFINITY) - m);
    const float lse = logf(((s8[0] + s8[1]) + (s8[2] + s8[3])) + ((s8[4] + s8[5]) + (s8[6] + s8[7])));
    for (int64_t j = 0; j < c; j += 8) {
        const int64_t w = c - j < 8 ? c - j : 8;
        store8(lp + j, (load8(x + j, w, 0.0f) - m) - lse, w);
    }
}

/* Softmax of rows r0..r1 of x [rows, c] into y (y may be x): per row m = the max, y = exp(x - m)
   with s their sum (eight lanes in order along the row, the lanes added pairwise), then y *= 1 / s
   (as ORT's MLAS and torch: one reciprocal a row). A piece of the GEMM pool's GC_ROWS jobs. */
void softmax_rows_f32(const float *x, float *y, int64_t r0, int64_t r1, int64_t c) {
    for (int64_t r = r0; r < r1; r++) {
        const float *xr = x + r * c;
        float *yr = y + r * c;
        v8 m8 = (v8){0} - INFINITY, s8 = (v8){0};
        for (int64_t j = 0; j < c; j += 8) m8 = vmax(m8, load8(xr + j, c - j < 8 ? c - j : 8, -INFINITY));
        float m = m8[0];
        for (int q = 1; q < 8; q++) m = m8[q] > m ? m8[q] : m;
        for (int64_t j = 0; j < c; j += 8) {
            const int64_t w = c - j < 8 ? c - j : 8;
            const v8 e = vexp(load8(xr + j, w, -INFINITY) - m);
            s8 += e;
            store8(yr + j, e, w);
        }
        const float inv = 1.0f / (((s8[0] + s8[1]) + (s8[2] + s8[3])) + ((s8[4] + s8[5]) + (s8[6] + s8[7])));
        for (int64_t j = 0; j < c; j += 8) {
            const int64_t w = c - j < 8 ? c - j : 8;
            store8(yr + j, load8(yr + j, w, 0.0f) * inv, w);
        }
    }
}

/* The log-softmax over c of a [c, d] block (d > 1), eight of its d columns at a time: per column
   the max, the sum of exp(x - max) over c in order, (x - max) - logf(sum). */
static void lsm_cols(const float *x, float *lp, int64_t c, int64_t d) {
    for (int64_t j = 0; j < d; j += 8) {
        const int64_t w = d - j < 8 ? d - j : 8;
        v8 m = (v8){0} - INFINITY, s = (v8){0}, lse;
        for (int64_t ci = 0; ci < c; ci++) m = vmax(m, load8(x + ci * d + j, w, -INFINITY));
        for (int64_t ci = 0; ci < c; ci++) s += vexp(load8(x + ci * d + j, w, -INFINITY) - m);
        for (int q = 0; q < 8; q++) lse[q] = logf(s[q]);
        for (int64_t ci = 0; ci < c; ci++) store8(lp + ci * d + j, (load8(x + ci * d + j, w, 0.0f) - m) - lse, w);
    }
}

/* The sum of the kept samples' w over labels[0..count) (in order, in double) into *wsum. */
static int64_t sce_wsum(const int64_t *labels, int64_t count, int64_t c, const float *weight, int64_t ignore,
                        double *wsum) {
    double s = 0.0;
    for (int64_t i = 0; i < count; i++) {
        const int64_t l = labels[i];
        if (l == ignore) continue;
        if (l < 0 || l >= c) return i;
        s += weight ? (double)weight[l] : 1.0;
    }
    *wsum = s;
    return -1;
}

/* SoftmaxCrossEntropyLoss: with x, log_prob's rows r0..r1 = the log-softmax of x's; with loss,
   then the loss of all n rows from log_prob: per sample -lp[label] * w (float), kept (none) or
   summed in double in order (sum), over the sum of every kept label's w (mean, unless 0). */
int64_t sce_loss_f32(const int64_t *g, const float *x, float *lp, const int64_t *labels, const float *weight,
                     const int64_t *ignore_p, float *loss, int64_t r0, int64_t r1) {
    const int64_t n = g[0], c = g[1], d = g[2], start = g[3], n_all = g[4], red = g[5], ignore = *ignore_p;
    if (x)
        for (int64_t r = r0; r < r1; r++) {
            if (d == 1) lsm_row(x + r * c, lp + r * c, c);
            else lsm_cols(x + r * c * d, lp + r * c * d, c, d);
        }
    if (!loss) return -1;
    double wsum = 0.0, total = 0.0;
    if (red == 2) {
        const int64_t bad = sce_wsum(labels, n_all * d, c, weight, ignore, &wsum);
        if (bad >= 0) return bad;
    }
    const int64_t *lab = labels + start * d;
    for (int64_t r = 0; r < n; r++)
        for (int64_t k = 0; k < d; k++) {
            const int64_t i = r * d + k, l = lab[i];
            float per = 0.0f;
            if (l != ignore) {
                if (l < 0 || l >= c) return start * d + i;
                per = -lp[(r * c + l) * d + k];
                if (weight) per = per * weight[l];
            }
            if (red == 0) loss[i] = per;
            else total += (double)per;
        }
    if (red != 0) *loss = (float)(red == 2 && wsum != 0.0 ? total / wsum : total);
    return -1;
}

/* A row's gradient (d == 1): (exp(lp) - (j == label)) * f, eight at a time (out may be lp). */
static void sce_grad_row(const float *lp, float *out, int64_t c, int64_t label, float f) {
    for (int64_t j = 0; j < c; j += 8) {
        const int64_t w = c - j < 8 ? c - j : 8;
        v8 e = vexp(load8(lp + j, w, 0.0f));
        if (label >= j && label < j + 8) e[label - j] -= 1.0f;
        store8(out + j, e * f, w);
    }
}

/* SoftmaxCrossEntropyLossGrad on rows r0..r1: dlogits = (exp(lp) - onehot(label)) * f, f = w * dY
   (none: the sample's dY; sum: dY; mean: (float)(dY / the sum in double of every kept label's w),
   dY where that is 0); f = 0 where ignored. out may be lp (each element read before written). */
int64_t sce_grad_f32(const int64_t *g, const float *dy, const float *lp, const int64_t *labels, const float *weight,
                     const int64_t *ignore_p, float *out, int64_t r0, int64_t r1) {
    const int64_t c = g[1], d = g[2], start = g[3], n_all = g[4], red = g[5], ignore = *ignore_p;
    float scaled = red == 0 ? 0.0f : dy[0];
    if (red == 2) {
        double wsum = 0.0;
        const int64_t bad = sce_wsum(labels, n_all * d, c, weight, ignore, &wsum);
        if (bad >= 0) return bad;
        if (wsum != 0.0) scaled = (float)((double)dy[0] / wsum);
    }
    for (int64_t r = r0; r < r1; r++) {
        const int64_t *lab = labels + (start + r) * d;
        for (int64_t j = 0; j < d; j += 8) {
            const int64_t w = d - j < 8 ? d - j : 8;
            vi8 l8 = (vi8){0} - 1;
            v8 f8 = (v8){0};
            for (int64_t q = 0; q < w; q++) {
                const int64_t l = lab[j + q];
                if (l == ignore) continue;
                if (l < 0 || l >= c) return (start + r) * d + j + q;
                const float wl = weight ? weight[l] : 1.0f;
                l8[q] = (int)l;
                f8[q] = wl * (red == 0 ? dy[(start + r) * d + j + q] : scaled);
            }
            if (d == 1) { sce_grad_row(lp + r * c, out + r * c, c, l8[0], f8[0]); continue; }
            const v8 one = (v8){0} + 1.0f;
            for (int64_t ci = 0; ci < c; ci++) {
                const int64_t at = (r * c + ci) * d + j;
                const v8 e = vexp(load8(lp + at, w, 0.0f));
                store8(out + at, (e - (v8)((vi8)one & (l8 == (int)ci))) * f8, w);
            }
        }
    }
    return -1;
}
/* ---- a 2-D depthwise convolution (one channel per group), plane by plane ----
   (conv_depthwise_loops.py) g: c, h, w, kh, kw, oh, ow, sh, sw, ph, pw, dh, dw (X (n, c, h, w),
   Y (n, c, oh, ow), W (c, kh * kw), contiguous). A plane is one (image, channel); each output
   row is summed over the taps in order (i, then j), one pass over the row a tap. */
#define DW_MAX_TAPS 1024  /* DEPTHWISE_MAX_TAPS */
static inline void dw_spans(const int64_t *g, int64_t *span) {
    /* per kernel column j, the outputs o of a row with 0 <= o * sw + j * dw - pw < w: [lo, hi) */
    const int64_t w = g[2], kw = g[4], ow = g[6], sw = g[8], pw = g[10], dw = g[12];
    for (int64_t j = 0; j < kw; j++) {
        const int64_t off = j * dw - pw;
        int64_t a = off >= 0 ? 0 : (-off + sw - 1) / sw;
        int64_t b = w - 1 - off >= 0 ? (w - 1 - off) / sw + 1 : 0;
        if (b > ow) b = ow;
        span[2 * j] = a;
        span[2 * j + 1] = b > a ? b : a;
    }
}

void dw_conv_fwd(const int64_t *g, const float *x, const float *wt, const float *bias, float *y,
                 int64_t p0, int64_t p1) {
    const int64_t c = g[0], h = g[1], w = g[2], kh = g[3], kw = g[4], oh = g[5], ow = g[6], sh = g[7],
                  sw = g[8], ph = g[9], pw = g[10], dh = g[11], dw = g[12];
    int64_t span[2 * DW_MAX_TAPS];
    dw_spans(g, span);
    for (int64_t p = p0; p < p1; p++) {
        const float *xp = x + p * h * w, *wc = wt + (p % c) * kh * kw;
        for (int64_t r = 0; r < oh; r++) {
            float *restrict yr = y + p * oh * ow + r * ow;
            for (int64_t o = 0; o < ow; o++) yr[o] = 0.0f;
            for (int64_t i = 0; i < kh; i++) {
                const int64_t ih = r * sh - ph + i * dh;
                if (ih < 0 || ih >= h) continue;
                const float *restrict xr = xp + ih * w;
                for (int64_t j = 0; j < kw; j++) {
                    const int64_t off = j * dw - pw, lo = span[2 * j], hi = span[2 * j + 1];
                    const float wv = wc[i * kw + j];
                    if (sw == 1) {
                        for (int64_t o = lo; o < hi; o++) yr[o] += wv * xr[o + off];
                    } else {
                        for (int64_t o = lo; o < hi; o++) yr[o] += wv * xr[o * sw + off];
                    }
                }
            }
            if (bias) {
                const float b = bias[p % c];
                for (int64_t o = 0; o < ow; o++) yr[o] += b;
            }
        }
    }
}

/* dX of planes p0..p1: zeroed, then every output row's taps added in (rows in order, taps in
   order), dX[ih, o * sw + off] += W[tap] dY[r, o]. */
void dw_conv_dx(const int64_t *g, const float *dy, const float *wt, float *dx, int64_t p0, int64_t p1) {
    const int64_t c = g[0], h = g[1], w = g[2], kh = g[3], kw = g[4], oh = g[5], ow = g[6], sh = g[7],
                  sw = g[8], ph = g[9], pw = g[10], dh = g[11], dw = g[12];
    int64_t span[2 * DW_MAX_TAPS];
    dw_spans(g, span);
    for (int64_t p = p0; p < p1; p++) {
        float *xp = dx + p * h * w;
        const float *wc = wt + (p % c) * kh * kw;
        memset(xp, 0, (size_t)(h * w) * sizeof(float));
        for (int64_t r = 0; r < oh; r++) {
            const float *restrict yr = dy + p * oh * ow + r * ow;
            for (int64_t i = 0; i < kh; i++) {
                const int64_t ih = r * sh - ph + i * dh;
                if (ih < 0 || ih >= h) continue;
                float *restrict xr = xp + ih * w;
                for (int64_t j = 0; j < kw; j++) {
                    const int64_t off = j * dw - pw, lo = span[2 * j], hi = span[2 * j + 1];
                    const float wv = wc[i * kw + j];
                    if (sw == 1) {
                        for (int64_t o = lo; o < hi; o++) xr[o + off] += wv * yr[o];
                    } else {
                        for (int64_t o = lo; o < hi; o++) xr[o * sw + off] += wv * yr[o];
                    }
                }
            }
        }
    }
}

/* dW of channels c0..c1 over n images: per tap, each row's products in eight float lanes (a
   tail after them), the lanes added in order into a double, the rows and images in order. */
void dw_conv_dw(const int64_t *g, int64_t n, const float *dy, const float *x, float *dwt, int64_t c0,
                int64_t c1) {
    const int64_t c = g[0], h = g[1], w = g[2], kh = g[3], kw = g[4], oh = g[5], ow = g[6], sh = g[7],
                  sw = g[8], ph = g[9], pw = g[10], dh = g[11], dw = g[12];
    int64_t span[2 * DW_MAX_TAPS];
    dw_spans(g, span);
    double acc[DW_MAX_TAPS];
    for (int64_t ch = c0; ch < c1; ch++) {
        for (int64_t t = 0; t < kh * kw; t++) acc[t] = 0.0;
        for (int64_t img = 0; img < n; img++) {
            const int64_t p = img * c + ch;
            const float *xp = x + p * h * w;
            for (int64_t r = 0; r < oh; r++) {
                const float *yr = dy + p * oh * ow + r * ow;
                for (int64_t i = 0; i < kh; i++) {
                    const int64_t ih = r * sh - ph + i * dh;
                    if (ih < 0 || ih >= h) continue;
                    const float *xr = xp + ih * w;
                    for (int64_t j = 0; j < kw; j++) {
                        const int64_t off = j * dw - pw, lo = span[2 * j], hi = span[2 * j + 1];
                        v8 s = (v8){0};
                        int64_t o = lo;
                        for (; o + 8 <= hi; o += 8) {
                            v8 a, b;
                            memcpy(&a, yr + o, 32);
                            if (sw == 1) {
                                memcpy(&b, xr + o + off, 32);
                            } else {
                                for (int q = 0; q < 8; q++) b[q] = xr[(o + q) * sw + off];
                            }
                            s += a * b;
                        }
                        float tail = 0.0f;
                        for (; o < hi; o++) tail += yr[o] * xr[o * sw + off];
                        double sum = 0.0;
                        for (int q = 0; q < 8; q++) sum += (double)s[q];
                        acc[i * kw + j] += sum + (double)tail;
                    }
                }
            }
        }
        for (int64_t t = 0; t < kh * kw; t++) dwt[ch * kh * kw + t] = (float)acc[t];
    }
}

"""

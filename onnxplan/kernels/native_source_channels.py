"""The C text of the fused per-channel loops (kernels/native.py compiles it after
native_source.SOURCE and native_source_rows.ROWS_SOURCE, in one library): BatchNormalization in
training (BatchNormInternal) and BatchNormalizationGrad (kernels/batch_norm_loops.py).
native_source.SOURCE declares what these use (the headers, the eight-float vector type v8)."""

CHANNELS_SOURCE = r"""
/* ---- BatchNormalization in training and its gradient, by channels (batch_norm_loops.py) ----
   g: n, c, s (the tensor as n x c x s, contiguous); every statistic is its channel's own, so a
   channel's arithmetic does not depend on how channels are cut across threads.
   A channel's sums: each image's run of s floats in eight float lanes (the lanes then added in
   order), the images' totals added into a double in order. */

static inline double bn_run_sum(const float *a, int64_t s) {
    v8 acc = (v8){0};
    int64_t j = 0;
    for (; j + 8 <= s; j += 8) { v8 v; memcpy(&v, a + j, sizeof v); acc += v; }
    float t = 0.0f;
    for (int k = 0; k < 8; k++) t += acc[k];
    for (; j < s; j++) t += a[j];
    return (double)t;
}

static inline double bn_run_sq(const float *a, int64_t s, float mean) {
    v8 acc = (v8){0};
    const v8 m = (v8){mean, mean, mean, mean, mean, mean, mean, mean};
    int64_t j = 0;
    for (; j + 8 <= s; j += 8) { v8 v; memcpy(&v, a + j, sizeof v); v -= m; acc += v * v; }
    float t = 0.0f;
    for (int k = 0; k < 8; k++) t += acc[k];
    for (; j < s; j++) { const float d = a[j] - mean; t += d * d; }
    return (double)t;
}

/* Channels c0..c1 of the training BatchNorm: mean and biased variance over images and positions
   (the variance from the centred values: a second pass), the running statistics
   given * momentum + batch * (1 - momentum) (run_mean / run_var NULL: not wanted), inv_std =
   sqrt(1 / (var + eps)), then y = x * (scale * inv_std) + (bias - mean * scale * inv_std) in the
   numpy path's float32 operations (a multiply, then an add). k: eps, momentum. y may be x. */
void bn_fwd_f32(const int64_t *g, const float *k, const float *x, const float *scale, const float *bias,
                const float *mean_in, const float *var_in, float *y, float *run_mean, float *run_var,
                float *mean_o, float *inv_o, int64_t c0, int64_t c1) {
    const int64_t n = g[0], c = g[1], s = g[2];
    const float eps = k[0], momentum = k[1], keep = 1.0f - momentum, count = (float)(n * s);
    for (int64_t ch = c0; ch < c1; ch++) {
        double total = 0.0;
        for (int64_t i = 0; i < n; i++) total += bn_run_sum(x + (i * c + ch) * s, s);
        const float mean = (float)total / count;
        double sq = 0.0;
        for (int64_t i = 0; i < n; i++) sq += bn_run_sq(x + (i * c + ch) * s, s, mean);
        const float var = (float)sq / count;
        if (run_mean) { const float b = mean * keep; float r = mean_in[ch] * momentum; run_mean[ch] = r + b; }
        if (run_var) { const float b = var * keep; float r = var_in[ch] * momentum; run_var[ch] = r + b; }
        float inv = var + eps;
        inv = 1.0f / inv;
        inv = sqrtf(inv);
        if (mean_o) mean_o[ch] = mean;
        if (inv_o) inv_o[ch] = inv;
        const float sc = inv * scale[ch];
        const float sh = bias[ch] - mean * sc;
        for (int64_t i = 0; i < n; i++) {
            const float *xr = x + (i * c + ch) * s;
            float *yr = y + (i * c + ch) * s;
            for (int64_t j = 0; j < s; j++) { const float v = xr[j] * sc; yr[j] = v + sh; }
        }
    }
}

/* Channels c0..c1 of BatchNormalizationGrad: dbias = sum(dy), dscale = sum((x - mean) * dy) *
   inv_std, then (dx not NULL) with factor = scale * inv_std / (n * s):
   dx = dy * (factor * n * s) - factor * dbias - (x - mean) * (dscale * inv_std * factor), in the
   numpy path's float32 operations and order. dscale / dbias may be NULL (not wanted). */
void bn_grad_f32(const int64_t *g, const float *dy, const float *x, const float *scale, const float *mean,
                 const float *inv, float *dx, float *dscale, float *dbias, int64_t c0, int64_t c1) {
    const int64_t n = g[0], c = g[1], s = g[2];
    const float ns = (float)(n * s);
    for (int64_t ch = c0; ch < c1; ch++) {
        const float m = mean[ch];
        const v8 mv = (v8){m, m, m, m, m, m, m, m};
        double sb = 0.0, sd = 0.0;
        for (int64_t i = 0; i < n; i++) {
            const float *d = dy + (i * c + ch) * s, *xr = x + (i * c + ch) * s;
            v8 ab = (v8){0}, ad = (v8){0};
            int64_t j = 0;
            for (; j + 8 <= s; j += 8) {
                v8 dv, xv;
                memcpy(&dv, d + j, sizeof dv);
                memcpy(&xv, xr + j, sizeof xv);
                ab += dv;
                ad += (xv - mv) * dv;
            }
            float tb = 0.0f, td = 0.0f;
            for (int q = 0; q < 8; q++) { tb += ab[q]; td += ad[q]; }
            for (; j < s; j++) { tb += d[j]; td += (xr[j] - m) * d[j]; }
            sb += (double)tb;
            sd += (double)td;
        }
        const float db = (float)sb;
        float ds = (float)sd;
        ds = ds * inv[ch];
        if (dbias) dbias[ch] = db;
        if (dscale) dscale[ch] = ds;
        if (!dx) continue;
        float factor = scale[ch] * inv[ch];
        factor = factor / ns;
        const float dy_coef = factor * ns, bias_term = factor * db;
        float cc = ds * inv[ch];
        cc = cc * factor;
        for (int64_t i = 0; i < n; i++) {
            const float *d = dy + (i * c + ch) * s, *xr = x + (i * c + ch) * s;
            float *o = dx + (i * c + ch) * s;
            for (int64_t j = 0; j < s; j++) {
                const float a = (xr[j] - m) * cc;
                float gg = d[j] * dy_coef;
                gg = gg - bias_term;
                o[j] = gg - a;
            }
        }
    }
}
"""

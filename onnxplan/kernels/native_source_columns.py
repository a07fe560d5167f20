"""The C source of im2col and col2im's accumulation for 2-D windows (kernels/im2col.py),
compiled into the one fused library by kernels/native.py."""

COLUMNS_SOURCE = r"""
/* ---- im2col and col2im's accumulation for a 2-D window (kernels/im2col.py) ----
   g: nb, c, h, w, kh, kw, oh, ow, sh, sw, ph, pw, dh, dw, then strides in elements: the image's
   x_n, x_c (each plane of h x w contiguous) and the columns' col_c, col_ky, col_kx, col_n (each
   tap's block of an image of oh x ow contiguous). Output o of an axis, tap k reads input
   o * s - p + k * d (p may be negative: a band of output rows). */

/* [lo, hi) of the outputs (of `n_out`) whose tap k lands inside an input of `size`. */
static inline void col_span(int64_t size, int64_t n_out, int64_t s, int64_t off, int64_t *lo, int64_t *hi) {
    int64_t a = off >= 0 ? 0 : (-off + s - 1) / s;
    int64_t b = size - 1 - off >= 0 ? (size - 1 - off) / s + 1 : 0;
    if (b > n_out) b = n_out;
    if (a > n_out) a = n_out;
    *lo = a;
    *hi = b > a ? b : a;
}

/* im2col_f32 by a table: for each tap, the offset in x of every output (n, oy, ox) of the
   block a channel's tap fills (-1: padding), made once; then each channel's taps gather their
   block in one loop of nb * oh * ow, where row by row a small map (3 x 3, 6 x 6) takes a loop of
   a row's 3 or 6 (least of 100, C, 8 images, 3 x 3 taps: 368 x 3 x 3 0.12 ms against 0.55 row by
   row; 152 x 6 x 6 0.19 / 0.45; 64 x 32 x 32 at stride 2 0.64 / 0.63). Where the table would be
   larger than IM2COL_TABLE entries (64 KiB on the calling thread's stack: nothing allocated), the
   images' blocks are not one run or an offset does not fit 32 bits: 0, and the rows. */
#define IM2COL_TABLE 16384
static int im2col_table(const int64_t *g, const uint32_t *x, uint32_t *col) {
    const int64_t nb = g[0], c = g[1], h = g[2], w = g[3], kh = g[4], kw = g[5], oh = g[6], ow = g[7],
                  sh = g[8], sw = g[9], ph = g[10], pw = g[11], dh = g[12], dw = g[13];
    const int64_t xn = g[14], xc = g[15], cc = g[16], cky = g[17], ckx = g[18], cn = g[19];
    const int64_t block = nb * oh * ow;
    if (cn != oh * ow || kh * kw * block > IM2COL_TABLE || (nb - 1) * xn + h * w > INT32_MAX) return 0;
    int32_t table[IM2COL_TABLE];
    for (int64_t ky = 0; ky < kh; ky++)
        for (int64_t kx = 0; kx < kw; kx++) {
            int32_t *t = table + (ky * kw + kx) * block;
            for (int64_t n = 0; n < nb; n++)
                for (int64_t oy = 0; oy < oh; oy++)
                    for (int64_t ox = 0; ox < ow; ox++) {
                        const int64_t iy = oy * sh - ph + ky * dh, ix = ox * sw - pw + kx * dw;
                        const int inside = iy >= 0 && iy < h && ix >= 0 && ix < w;
                        t[(n * oh + oy) * ow + ox] = inside ? (int32_t)(n * xn + iy * w + ix) : -1;
                    }
        }
    for (int64_t ci = 0; ci < c; ci++) {
        const uint32_t *plane = x + ci * xc;
        for (int64_t ky = 0; ky < kh; ky++)
            for (int64_t kx = 0; kx < kw; kx++) {
                uint32_t *dst = col + ci * cc + ky * cky + kx * ckx;
                const int32_t *t = table + (ky * kw + kx) * block;
                for (int64_t j = 0; j < block; j++) dst[j] = t[j] >= 0 ? plane[t[j]] : 0u;
            }
    }
    return 1;
}

/* col[c][ky][kx][n][oy][ox] = x[n][c][oy * sh - ph + ky * dh][ox * sw - pw + kx * dw], 0 outside
   the image: 32-bit words moved as they are (every bit pattern, NaNs' included); by the table
   where it can be had, else row by row. */
void im2col_f32(const int64_t *g, const uint32_t *x, uint32_t *col) {
    const int64_t nb = g[0], c = g[1], h = g[2], w = g[3], kh = g[4], kw = g[5], oh = g[6], ow = g[7],
                  sh = g[8], sw = g[9], ph = g[10], pw = g[11], dh = g[12], dw = g[13];
    const int64_t xn = g[14], xc = g[15], cc = g[16], cky = g[17], ckx = g[18], cn = g[19];
    if (im2col_table(g, x, col)) return;
    for (int64_t ci = 0; ci < c; ci++)
        for (int64_t ky = 0; ky < kh; ky++) {
            int64_t y0, y1;
            col_span(h, oh, sh, ky * dh - ph, &y0, &y1);
            for (int64_t kx = 0; kx < kw; kx++) {
                const int64_t offx = kx * dw - pw;
                int64_t x0, x1;
                col_span(w, ow, sw, offx, &x0, &x1);
                for (int64_t n = 0; n < nb; n++) {
                    uint32_t *dst = col + ci * cc + ky * cky + kx * ckx + n * cn;
                    const uint32_t *plane = x + n * xn + ci * xc;
                    for (int64_t oy = 0; oy < oh; oy++) {
                        uint32_t *row = dst + oy * ow;
                        if (oy < y0 || oy >= y1) {
                            for (int64_t ox = 0; ox < ow; ox++) row[ox] = 0;
                            continue;
                        }
                        const uint32_t *src = plane + (oy * sh - ph + ky * dh) * w + offx;
                        for (int64_t ox = 0; ox < x0; ox++) row[ox] = 0;
                        if (sw == 1) {
                            for (int64_t ox = x0; ox < x1; ox++) row[ox] = src[ox];
                        } else {
                            for (int64_t ox = x0; ox < x1; ox++) row[ox] = src[ox * sw];
                        }
                        for (int64_t ox = x1; ox < ow; ox++) row[ox] = 0;
                    }
                }
            }
        }
}

/* col2im_add_f32 for unit strides and output rows as wide as the input's: a tap's outputs
   (oy, ox) land at plane[(oy + ky * dh - ph) * w + ox + kx * dw - pw], one run of the plane from
   its first output inside the image to its last, the outputs between that wrap around a row edge
   masked out (they add -0.0, which leaves every float as it is, -0.0 and NaNs included). One
   loop of a plane's length a tap, where row by row takes one of a row's (a 4 x 4 map: 4). The
   masks on the calling thread's stack (64 KiB: nothing allocated); 0 where they would pass
   COL2IM_MASKS words (a map that large has rows long enough). */
#define COL2IM_MASKS 16384
static int col2im_runs(const int64_t *g, const float *col, float *dx) {
    const int64_t nb = g[0], c = g[1], h = g[2], w = g[3], kh = g[4], kw = g[5], oh = g[6],
                  ph = g[10], pw = g[11], dh = g[12], dw = g[13];
    const int64_t xn = g[14], xc = g[15], cc = g[16], cky = g[17], ckx = g[18], cn = g[19];
    const int64_t len = oh * w;
    if (kw * len > COL2IM_MASKS) return 0;
    uint32_t keep[COL2IM_MASKS];
    for (int64_t kx = 0; kx < kw; kx++) {  /* keep[kx][i]: output column i % w of tap column kx lands inside */
        int64_t x0, x1;
        col_span(w, w, 1, kx * dw - pw, &x0, &x1);
        for (int64_t i = 0; i < len; i++) keep[kx * len + i] = (i % w >= x0) && (i % w < x1) ? 0xFFFFFFFFu : 0u;
    }
    for (int64_t ci = 0; ci < c; ci++)  /* a channel's columns of every image, then the next's */
        for (int64_t n = 0; n < nb; n++) {
            float *plane = dx + n * xn + ci * xc;
            for (int64_t ky = 0; ky < kh; ky++) {
                int64_t y0, y1;
                col_span(h, oh, 1, ky * dh - ph, &y0, &y1);
                for (int64_t kx = 0; kx < kw; kx++) {
                    int64_t x0, x1;
                    col_span(w, w, 1, kx * dw - pw, &x0, &x1);
                    if (y1 <= y0 || x1 <= x0) continue;
                    const float *s = col + ci * cc + ky * cky + kx * ckx + n * cn;
                    float *d = plane + (ky * dh - ph) * w + (kx * dw - pw);
                    const uint32_t *m = keep + kx * len;
                    const int64_t a = y0 * w + x0, b = (y1 - 1) * w + x1;
                    const uint32_t *sb = (const uint32_t *)s;
#pragma GCC ivdep
                    for (int64_t i = a; i < b; i++) {  /* s[i] where kept, else -0.0 (its sign bit) */
                        const uint32_t bits = (sb[i] & m[i]) | (~m[i] & 0x80000000u);
                        float v;
                        memcpy(&v, &bits, sizeof v);
                        d[i] = d[i] + v;
                    }
                }
            }
        }
    return 1;
}

/* dx[n][c][oy * sh - ph + ky * dh][ox * sw - pw + kx * dw] += col[c][ky][kx][n][oy][ox]: each
   element of dx adds its taps' columns in row-major tap order, one float add at a time (the
   order numpy's tap-by-tap adds give it: the same bits, a NaN's sign and payload aside, as the
   compiler may swap an add's operands). Plane by plane, a channel's planes of every image in
   turn (a plane stays in cache while its taps are added). */
void col2im_add_f32(const int64_t *g, const float *col, float *dx) {
    const int64_t nb = g[0], c = g[1], h = g[2], w = g[3], kh = g[4], kw = g[5], oh = g[6], ow = g[7],
                  sh = g[8], sw = g[9], ph = g[10], pw = g[11], dh = g[12], dw = g[13];
    const int64_t xn = g[14], xc = g[15], cc = g[16], cky = g[17], ckx = g[18], cn = g[19];
    if (sh == 1 && sw == 1 && ow == w && oh > 0 && col2im_runs(g, col, dx)) return;
    for (int64_t ci = 0; ci < c; ci++)  /* a channel's columns of every image, then the next's */
        for (int64_t n = 0; n < nb; n++) {
            float *plane = dx + n * xn + ci * xc;
            for (int64_t ky = 0; ky < kh; ky++) {
                int64_t y0, y1;
                col_span(h, oh, sh, ky * dh - ph, &y0, &y1);
                for (int64_t kx = 0; kx < kw; kx++) {
                    const int64_t offx = kx * dw - pw;
                    int64_t x0, x1;
                    col_span(w, ow, sw, offx, &x0, &x1);
                    const float *src = col + ci * cc + ky * cky + kx * ckx + n * cn;
                    for (int64_t oy = y0; oy < y1; oy++) {
                        const float *srow = src + oy * ow;
                        float *drow = plane + (oy * sh - ph + ky * dh) * w + offx;
                        if (sw == 1) {
#pragma GCC ivdep
                            for (int64_t ox = x0; ox < x1; ox++) drow[ox] += srow[ox];
                        } else {
                            for (int64_t ox = x0; ox < x1; ox++) drow[ox * sw] += srow[ox];
                        }
                    }
                }
            }
        }
}
"""

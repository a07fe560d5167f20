"""The C source of the blocked transpose (kernels/transpose.py), compiled into the one fused
library by kernels/native.py."""

TRANSPOSE_SOURCE = r"""
#if defined(__AVX__)
#include <immintrin.h>
#endif
/* ---- Transpose of 32-bit elements (kernels/transpose.py): y[b][c][r] = x[b][r][c] for batches
   b0..b1 and x's columns c0..c1 (y's rows: a thread's part of y is contiguous), x and y contiguous
   [rows x cols] / [cols x rows] matrices one after the other. Blocks of TR_BLOCK x TR_BLOCK (a
   block's 16 KiB of x and of y stay in L1), in them 8 x 8 tiles moved through registers
   (loads, shuffles and stores only: every bit pattern, NaNs' included, is moved as it is). */
#define TR_BLOCK 64
static inline void tr_tile8(const uint32_t *x, uint32_t *y, int64_t xs, int64_t ys) {
#if defined(__AVX__)
    __m256 r0 = _mm256_loadu_ps((const float *)(x)), r1 = _mm256_loadu_ps((const float *)(x + xs)),
           r2 = _mm256_loadu_ps((const float *)(x + 2 * xs)), r3 = _mm256_loadu_ps((const float *)(x + 3 * xs)),
           r4 = _mm256_loadu_ps((const float *)(x + 4 * xs)), r5 = _mm256_loadu_ps((const float *)(x + 5 * xs)),
           r6 = _mm256_loadu_ps((const float *)(x + 6 * xs)), r7 = _mm256_loadu_ps((const float *)(x + 7 * xs));
    __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1), t2 = _mm256_unpacklo_ps(r2, r3),
           t3 = _mm256_unpackhi_ps(r2, r3), t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5),
           t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
    __m256 s0 = _mm256_shuffle_ps(t0, t2, 0x44), s1 = _mm256_shuffle_ps(t0, t2, 0xEE),
           s2 = _mm256_shuffle_ps(t1, t3, 0x44), s3 = _mm256_shuffle_ps(t1, t3, 0xEE),
           s4 = _mm256_shuffle_ps(t4, t6, 0x44), s5 = _mm256_shuffle_ps(t4, t6, 0xEE),
           s6 = _mm256_shuffle_ps(t5, t7, 0x44), s7 = _mm256_shuffle_ps(t5, t7, 0xEE);
    _mm256_storeu_ps((float *)(y), _mm256_permute2f128_ps(s0, s4, 0x20));
    _mm256_storeu_ps((float *)(y + ys), _mm256_permute2f128_ps(s1, s5, 0x20));
    _mm256_storeu_ps((float *)(y + 2 * ys), _mm256_permute2f128_ps(s2, s6, 0x20));
    _mm256_storeu_ps((float *)(y + 3 * ys), _mm256_permute2f128_ps(s3, s7, 0x20));
    _mm256_storeu_ps((float *)(y + 4 * ys), _mm256_permute2f128_ps(s0, s4, 0x31));
    _mm256_storeu_ps((float *)(y + 5 * ys), _mm256_permute2f128_ps(s1, s5, 0x31));
    _mm256_storeu_ps((float *)(y + 6 * ys), _mm256_permute2f128_ps(s2, s6, 0x31));
    _mm256_storeu_ps((float *)(y + 7 * ys), _mm256_permute2f128_ps(s3, s7, 0x31));
#else
    for (int i = 0; i < 8; i++)
        for (int j = 0; j < 8; j++) y[j * ys + i] = x[i * xs + j];
#endif
}

void transpose32(const uint32_t *x, uint32_t *y, int64_t rows, int64_t cols, int64_t b0, int64_t b1,
                 int64_t c0, int64_t c1) {
    for (int64_t b = b0; b < b1; b++) {
        const uint32_t *xb = x + b * rows * cols;
        uint32_t *yb = y + b * rows * cols;
        for (int64_t cb = c0; cb < c1; cb += TR_BLOCK) {
            const int64_t ce = cb + TR_BLOCK < c1 ? cb + TR_BLOCK : c1;
            for (int64_t rb = 0; rb < rows; rb += TR_BLOCK) {
                const int64_t re = rb + TR_BLOCK < rows ? rb + TR_BLOCK : rows;
                int64_t r = rb;
                for (; r + 8 <= re; r += 8) {
                    int64_t c = cb;
                    for (; c + 8 <= ce; c += 8) tr_tile8(xb + r * cols + c, yb + c * rows + r, cols, rows);
                    for (; c < ce; c++)
                        for (int64_t i = r; i < r + 8; i++) yb[c * rows + i] = xb[i * cols + c];
                }
                for (; r < re; r++)
                    for (int64_t c = cb; c < ce; c++) yb[c * rows + r] = xb[r * cols + c];
            }
        }
    }
}
"""

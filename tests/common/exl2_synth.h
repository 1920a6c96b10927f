/* Test helper: random EXL2 matrices packed with a plain bit-stream packer (independent of the loader), written
 * to a temporary safetensors file and loaded back with tsr_qmatrix_load. Uses cmocka assertions. */
#ifndef TSR_TEST_EXL2_SYNTH_H
#define TSR_TEST_EXL2_SYNTH_H

#include "runtime/exl2.h"
#include "runtime/safetensors.h"

#define SYNTH_MAX_GROUPS 64

typedef struct {
    int K, N, G;
    int bits[SYNTH_MAX_GROUPS], rows[SYNTH_MAX_GROUPS]; /* per group */
    uint32_t *codes;        /* [K][N] stored-order codes */
    uint32_t *q_weight;     /* [Q][N] */
    int Q;
    uint32_t *q_scale;      /* [G][N/8] */
    uint16_t q_scale_max[SYNTH_MAX_GROUPS];
    int16_t q_groups[2 * SYNTH_MAX_GROUPS];
    int32_t *invperm;       /* [K] */
    uint16_t *bias;         /* [N] */
} synth_matrix;

/* One tensor to write into a test safetensors file. */
typedef struct {
    const char *name;
    tsr_dtype dt;
    int nd;
    int64_t shape[2];
    const void *data;
    size_t bytes;
} test_tensor;

/* Writes the tensors with use[i] set (all when use is NULL) to path; asserts every step succeeds. */
void write_test_tensors(const char *path, const test_tensor *t, int n, const int *use);

/* EXL2.md §5.1: one column group of 32 rows with codes (7j+3) mod 2^b packs to these words, per width. */
typedef struct {
    int bits;
    uint32_t words[8];
} exl2_pack_vector;
extern const exl2_pack_vector exl2_pack_vectors[6];

/* Deterministic pseudo-random numbers shared by the tests. */
uint32_t rnd(void);
/* Packs m->codes into m->q_weight and fills q_groups (value j of a group at stream bits [j*b, j*b+b)). */
void pack(synth_matrix *m);
/* A random matrix of N columns and G groups (at most SYNTH_MAX_GROUPS) of the given widths and row counts (random
 * permutation, scales). */
void make_matrix(synth_matrix *m, int N, int G, const int *bits, const int *rows, int with_bias);
void free_matrix(synth_matrix *m);
/* Writes the matrix to a temporary file as tensors `w.*` (omitting `skip`, if given) and loads it. */
tsr_status load(const synth_matrix *m, const char *skip, tsr_st_set **set, tsr_qmatrix *q);
/* The reference for a quantized product: y[M][N] = x[M][q->K] · W + bias over q's first N columns, summed in double
 * over the exactly dequantized weights (tsr_qmatrix_dequant_ref: each (code − zero) · scale, exact in fp32) and
 * rounded to float once. */
void qmatrix_ref_product(const tsr_qmatrix *q, const float *x, int M, int N, float *y);

#endif

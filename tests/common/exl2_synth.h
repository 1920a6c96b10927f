/* Test helper: random EXL2 matrices packed with a plain bit-stream packer (independent of the loader), written
 * to a temporary safetensors file and loaded back with tsr_qmatrix_load. Uses cmocka assertions. */
#ifndef TSR_TEST_EXL2_SYNTH_H
#define TSR_TEST_EXL2_SYNTH_H

#include "runtime/exl2.h"
#include "runtime/safetensors.h"

typedef struct {
    int K, N, G;
    int bits[16], rows[16]; /* per group */
    uint32_t *codes;        /* [K][N] stored-order codes */
    uint32_t *q_weight;     /* [Q][N] */
    int Q;
    uint32_t *q_scale;      /* [G][N/8] */
    uint16_t q_scale_max[16];
    int16_t q_groups[32];
    int32_t *invperm;       /* [K] */
    uint16_t *bias;         /* [N] */
} synth_matrix;

/* Deterministic pseudo-random numbers shared by the tests. */
uint32_t rnd(void);
/* Packs m->codes into m->q_weight and fills q_groups (value j of a group at stream bits [j*b, j*b+b)). */
void pack(synth_matrix *m);
/* A random matrix of N columns and G groups of the given widths and row counts (random permutation, scales). */
void make_matrix(synth_matrix *m, int N, int G, const int *bits, const int *rows, int with_bias);
void free_matrix(synth_matrix *m);
/* Writes the matrix to a temporary file as tensors `w.*` (omitting `skip`, if given) and loads it. */
tsr_status load(const synth_matrix *m, const char *skip, tsr_st_set **set, tsr_qmatrix *q);

#endif

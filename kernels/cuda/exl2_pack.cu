/* Uploads an EXL2 or GPTQ matrix in the fragment layout of exl2_frag.cuh.
 *
 * The host cuts the groups into 32-row units and lists, per unit, its first word in the new layout, its group and
 * width, and the input row of each of its rows (the stored-row permutation, padded with −1; or, for a matrix whose
 * input arrives already in stored-row order, the stored row itself). The packed file words go to the device once,
 * into a temporary buffer; a kernel with one thread per (unit, column block, lane) reads that lane's 32 codes from
 * the column bit streams (through a column map, where the caller reorders the columns) and writes them in fragment
 * order; the temporary buffer is then freed. The scale tables are the caller's (backend.cu). */
#include "kernels/cuda/exl2_frag.cuh"
#include "kernels/cuda/exl2_pack.cuh"

#include <vector>

/* What the repacking kernel needs of a unit: its group's first packed row, the unit's first row within the
 * group, its real rows and its width. */
struct pack_unit {
    int qrow0, jrow, rows, bits;
};

__global__ void frag_pack_kernel(const uint32_t *qw, int Npad, const int32_t *cols, const pack_unit *pu,
                                 const uint2 *units, uint32_t *fw)
{
    const int ncb = Npad / 32;
    const int t = blockIdx.x * blockDim.x + threadIdx.x, cb = t / 32, lane = t % 32;
    if (cb >= ncb) return;
    const int u = blockIdx.y;
    const pack_unit U = pu[u];
    const int B = U.bits, g = lane / 4, c = 2 * (lane % 4);
    uint32_t w[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int i = 0; i < 32; i++) {
        const int p = i / 2, e = i % 2, f = p / 4, r = p % 4, ct = f / 2, ks = f % 2;
        const int n = 32 * cb + 16 * ct + g + 8 * (r & 1), k = 16 * ks + c + 8 * (r >> 1) + e;
        const int src = cols ? cols[n] : n;
        uint32_t code = 0;
        if (k < U.rows) {
            const int bit = (U.jrow + k) * B, row = U.qrow0 + bit / 32, sh = bit % 32;
            uint32_t v = qw[(size_t)row * Npad + src] >> sh;
            if (sh + B > 32) v |= qw[(size_t)(row + 1) * Npad + src] << (32 - sh);
            code = v & ((1u << B) - 1u);
        }
        if (frag_spare15(B) && p == 15) { /* 3 and 5 bits: register 15 spread over bit 15 of the B words */
            for (int b = 0; b < B; b++) w[b] |= ((code >> b) & 1u) << (15 + 16 * e);
            continue;
        }
        if (B == 6) { /* frag_field6: two fields per half; registers 12-15 from the spare bits 12-15 */
            if (p < 12) {
                w[p / 2] |= code << (6 * (p % 2) + 16 * e);
            } else {
                const int m = p - 12;
                w[m] |= (code & 15u) << (12 + 16 * e);
                w[4 + m / 2] |= (code >> 4) << (12 + 2 * (m % 2) + 16 * e);
            }
            continue;
        }
        w[p / (16 / B)] |= code << (B * (p % (16 / B)) + 16 * e); /* 16 / B fields per half (frag_field) */
    }
    const size_t base = units[u].x + (size_t)cb * 32 * B;
    const int na = frag_na(B), nb = frag_nb(B);
    for (int j = 0; j < na; j++) fw[base + (size_t)lane * na + j] = w[j];
    for (int j = 0; j < nb; j++) fw[base + 32 * na + (size_t)lane * nb + j] = w[na + j];
}

tsr_status tsr_cuda_exl2_pack(const tsr_qmatrix *q, const int32_t *cols, int rows_in_order, tsr_linear_dev *d,
                              void *(*dev_alloc)(size_t))
{
    const int ncb = q->N / 32;
    std::vector<uint2> units;
    std::vector<pack_unit> pu;
    std::vector<int32_t> uperm;
    size_t words = 0;
    for (int g = 0; g < q->G; g++) {
        const tsr_qgroup *gr = &q->groups[g];
        for (int j = 0; j < gr->rows; j += 32) {
            const int rows = gr->rows - j < 32 ? gr->rows - j : 32;
            units.push_back(make_uint2((unsigned)words, (unsigned)g | (unsigned)gr->bits << 24));
            pu.push_back(pack_unit{gr->qrow0, j, rows, gr->bits});
            for (int k = 0; k < 32; k++) {
                const int row = gr->row0 + j + k;
                uperm.push_back(k >= rows ? -1 : rows_in_order ? row : q->perm[row]);
            }
            words += (size_t)32 * gr->bits * ncb;
        }
    }
    if (words >= ((size_t)1 << 32))
        return tsr_fail(TSR_ERR_FORMAT, "quantized matrix too large for the device layout (%zu words)", words);
    d->n_units = (int)units.size();
    d->n_groups = q->G;
    d->uperm_identity = uperm.size() == (size_t)q->K;
    for (size_t k = 0; d->uperm_identity && k < uperm.size(); k++) d->uperm_identity = uperm[k] == (int32_t)k;
    /* FRAG_PAD_WORDS of zeros after the last unit: the decode GEMV copies a warp's two column blocks as one pair,
     * the second past the matrix when the first is its last (results never stored) */
    d->fw = (const uint32_t *)dev_alloc((words + FRAG_PAD_WORDS) * 4);
    d->units = (const uint2 *)dev_alloc(units.size() * sizeof(uint2));
    d->uperm = (const int32_t *)dev_alloc(uperm.size() * sizeof(int32_t));
    if (!d->fw || !d->units || !d->uperm) return tsr_fail(TSR_ERR_NOMEM, "out of device memory uploading weights");
    cudaStream_t s = tsr_cuda_stream();
    TSR_CUDA_CHECK(cudaMemsetAsync((void *)(d->fw + words), 0, FRAG_PAD_WORDS * 4, s));
    TSR_CUDA_CHECK(
        cudaMemcpyAsync((void *)d->units, units.data(), units.size() * sizeof(uint2), cudaMemcpyHostToDevice, s));
    TSR_CUDA_CHECK(cudaMemcpyAsync((void *)d->uperm, uperm.data(), uperm.size() * 4, cudaMemcpyHostToDevice, s));
    /* the file words and the unit list, only while the kernel runs */
    void *qw = NULL, *pud = NULL, *dcols = NULL;
    const size_t qbytes = (size_t)q->Q * q->N * 4, cbytes = cols ? (size_t)q->N * 4 : 0;
    if (cudaMalloc(&qw, qbytes) != cudaSuccess || cudaMalloc(&pud, pu.size() * sizeof(pack_unit)) != cudaSuccess ||
        (cols && cudaMalloc(&dcols, cbytes) != cudaSuccess)) {
        cudaGetLastError();
        cudaFree(qw);
        cudaFree(pud);
        return tsr_fail(TSR_ERR_NOMEM, "out of device memory repacking weights (%zu bytes)", qbytes);
    }
    TSR_CUDA_CHECK(cudaMemcpyAsync(qw, q->q_weight, qbytes, cudaMemcpyHostToDevice, s));
    TSR_CUDA_CHECK(cudaMemcpyAsync(pud, pu.data(), pu.size() * sizeof(pack_unit), cudaMemcpyHostToDevice, s));
    if (cols) TSR_CUDA_CHECK(cudaMemcpyAsync(dcols, cols, cbytes, cudaMemcpyHostToDevice, s));
    dim3 grid(tsr_div_up((size_t)ncb * 32, 128), (unsigned)units.size());
    frag_pack_kernel<<<grid, 128, 0, s>>>((const uint32_t *)qw, q->N, (const int32_t *)dcols, (const pack_unit *)pud,
                                          (const uint2 *)d->units, (uint32_t *)d->fw);
    TSR_CUDA_LAUNCHED();
    TSR_CUDA_CHECK(cudaStreamSynchronize(s));
    TSR_CUDA_CHECK(cudaFree(qw));
    TSR_CUDA_CHECK(cudaFree(pud));
    TSR_CUDA_CHECK(cudaFree(dcols));
    return TSR_OK;
}

/* The one-shot peer sums across processes: every MPI rank is a member (kernels/cuda/peer_sum.h), its exchange area
 * exported as a CUDA IPC handle, the handles gathered over MPI and opened by the others, as parallel/comm_nccl.c
 * does. Ranks take the node's GPUs round-robin, so on a one-GPU machine all members share it (the IPC mapping, the
 * cross-process flags and epochs are exercised; peer writes over NVLink are not), and on a two-GPU machine they
 * cross GPUs. Checks, on every rank: sums of 1 to cap floats equal the host's sum in member order bit for bit; a
 * CUDA graph that holds a sum replays it over new contents; a member that skips a call makes the others' call give
 * up within the timeout and report it (tsr_peer_sum_failed), without hanging.
 *   mpirun -np N test_peer_ipc            (tests/gpu/test_peer_ipc.sh: N = 2, 3, 4; exit 77 without a GPU) */
#include "kernels/cuda/peer_sum.h"

#include <cuda_runtime_api.h>
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CAP 70016 /* floats per sum at most (a multiple of 32) */

static int g_rank, g_failures;

static void check(int ok, const char *what, size_t n)
{
    if (ok) return;
    fprintf(stderr, "test_peer_ipc: rank %d: %s (n = %zu)\n", g_rank, what, n);
    g_failures++;
}

static float value(int member, size_t i, int round)
{
    return sinf(0.37f * (float)i + 1.3f * (float)member + 0.11f * (float)round) * (1.0f + (float)member);
}

/* Fills dbuf with this member's values, and want with the members' sum in member order. */
static void fill(float *dbuf, float *host, float *want, int size, size_t n, int round)
{
    for (size_t i = 0; i < n; i++) {
        float s = 0.0f;
        for (int q = 0; q < size; q++) s += value(q, i, round);
        want[i] = s;
        host[i] = value(g_rank, i, round);
    }
    cudaMemcpy(dbuf, host, n * sizeof(float), cudaMemcpyHostToDevice);
}

static int equal(const float *dbuf, float *host, const float *want, size_t n)
{
    cudaMemcpy(host, dbuf, n * sizeof(float), cudaMemcpyDeviceToHost);
    return memcmp(host, want, n * sizeof(float)) == 0;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int size = 1, gpus = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus == 0) {
        if (g_rank == 0) printf("test_peer_ipc: no GPU, skipped\n");
        MPI_Finalize();
        return 77;
    }
    MPI_Comm node;
    int local = 0;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, g_rank, MPI_INFO_NULL, &node);
    MPI_Comm_rank(node, &local);
    cudaSetDevice(local % gpus);

    char handle[TSR_PEER_HANDLE_BYTES], *handles = malloc((size_t)size * TSR_PEER_HANDLE_BYTES);
    tsr_peer_sum *p = NULL;
    const double timeout_s = 3.0;
    if (tsr_peer_sum_new(g_rank, size, CAP, timeout_s, handle, &p) != TSR_OK) {
        fprintf(stderr, "test_peer_ipc: rank %d: %s\n", g_rank, tsr_last_error());
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    MPI_Allgather(handle, TSR_PEER_HANDLE_BYTES, MPI_BYTE, handles, TSR_PEER_HANDLE_BYTES, MPI_BYTE, MPI_COMM_WORLD);
    if (tsr_peer_sum_connect(p, handles) != TSR_OK) {
        fprintf(stderr, "test_peer_ipc: rank %d: %s\n", g_rank, tsr_last_error());
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    check(tsr_peer_sum_cap(p) >= CAP, "capacity", CAP);

    float *dbuf = NULL, *host = malloc(CAP * sizeof(float)), *want = malloc(CAP * sizeof(float));
    cudaMalloc((void **)&dbuf, CAP * sizeof(float));
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);

    /* plain calls: one block, several, the most blocks, a partial last slice, the whole capacity */
    const size_t ns[] = {1, 31, 1000, 1025, 4096, 8192, 65536, 70001, CAP};
    int round = 0;
    for (size_t t = 0; t < sizeof ns / sizeof ns[0]; t++, round++) {
        fill(dbuf, host, want, size, ns[t], round);
        MPI_Barrier(MPI_COMM_WORLD); /* every member's buffer is filled before any sums it */
        tsr_peer_sum_run(p, dbuf, ns[t], s);
        cudaStreamSynchronize(s);
        check(cudaGetLastError() == cudaSuccess, "CUDA error after a sum", ns[t]);
        check(!tsr_peer_sum_failed(p), "a sum gave up", ns[t]);
        check(equal(dbuf, host, want, ns[t]), "sum differs from the host's", ns[t]);
    }

    /* a graph holding two sums of different sizes, replayed over new contents */
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    const size_t n1 = 8192, n2 = 3000;
    cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
    tsr_peer_sum_run(p, dbuf, n1, s);
    tsr_peer_sum_run(p, dbuf + n1, n2, s);
    cudaStreamEndCapture(s, &graph);
    check(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess, "graph instantiation", n1 + n2);
    for (int r = 0; r < 4; r++, round++) {
        fill(dbuf, host, want, size, n1 + n2, round);
        MPI_Barrier(MPI_COMM_WORLD);
        cudaGraphLaunch(exec, s);
        cudaStreamSynchronize(s);
        check(!tsr_peer_sum_failed(p), "a replayed sum gave up", n1 + n2);
        check(equal(dbuf, host, want, n1 + n2), "replayed sums differ from the host's", n1 + n2);
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);

    /* the last member skips a call: the others give up after the timeout and say so */
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = MPI_Wtime();
    if (g_rank != size - 1) {
        tsr_peer_sum_run(p, dbuf, 4096, s);
        cudaStreamSynchronize(s);
        check(tsr_peer_sum_failed(p), "a call that a member skipped did not report it", 4096);
        check(MPI_Wtime() - t0 < 4 * timeout_s, "gave up too late", 4096);
    }
    MPI_Barrier(MPI_COMM_WORLD);

    int all = 0;
    MPI_Allreduce(&g_failures, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (g_rank == 0)
        printf("test_peer_ipc: %d members on %d GPU(s): %s\n", size, gpus < size ? gpus : size,
               all ? "FAILED" : "sums of 1-70016 floats, graph replays and a skipped call as expected");
    cudaFree(dbuf);
    cudaStreamDestroy(s);
    tsr_peer_sum_free(p);
    free(handles), free(host), free(want);
    MPI_Finalize();
    return all ? 1 : 0;
}

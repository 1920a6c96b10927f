/* One-shot all-reduce of small fp32 buffers between the GPUs of one host, for the tensor split's sums (two per layer
 * at batch 1: NCCL's all-reduce costs ~10 µs of the 70B layer's ~25 µs per GPU inside a CUDA graph; issue 5).
 *
 * Every member owns one device area: a receive slot per (source member, parity) of `cap` floats, a flag per
 * (source member, block), and its own call counter and error word. A call is one kernel per member: block b pushes
 * its slice of the member's buffer into every peer's receive slot (NVLink or PCIe peer writes), then raises its flag
 * in every peer's area with the call's epoch; once the peers' flags for block b carry the epoch it adds the slices of
 * all members in member order (so every member gets the same bits) into the buffer. Epochs come from the member's
 * counter, which the call's last block advances, so the kernel replays correctly from CUDA graphs; receive slots
 * alternate by epoch parity, since a peer can be one call ahead but never two. A wait longer than the timeout (a
 * peer that never arrives) sets the error word and leaves the buffer unsummed; every later call then returns at
 * once, and tsr_peer_sum_failed() reports it after a sync.
 *
 * The areas are exchanged as CUDA IPC handles by the caller (parallel/comm_nccl.c, over MPI): tsr_peer_sum_new()
 * allocates this member's area and gives its handle, tsr_peer_sum_connect() opens the peers' (failing where the
 * GPUs cannot reach each other's memory). Tests on one GPU use tsr_peer_sum_new_local() for members that share a
 * process. Ownership: the creator frees with tsr_peer_sum_free(). One stream per member; calls in order. */
#ifndef TSR_CUDA_PEER_SUM_H
#define TSR_CUDA_PEER_SUM_H

#ifdef __cplusplus
extern "C" {
#endif

#include "runtime/status.h"

#include <stddef.h>

#define TSR_PEER_MAX 8          /* members of a group at most */
#define TSR_PEER_HANDLE_BYTES 128 /* a member's exchange data: its area's IPC handle and its GPU's PCI bus id */

typedef struct tsr_peer_sum tsr_peer_sum;

/* This member's area for a group of `size` members (rank `rank`), sums of up to cap floats; *handle receives its
 * IPC handle (TSR_PEER_HANDLE_BYTES) for the peers. The area is zeroed. */
tsr_status tsr_peer_sum_new(int rank, int size, size_t cap, double timeout_s, void *handle, tsr_peer_sum **out);

/* Opens the peers' areas from their handles (handles: size × TSR_PEER_HANDLE_BYTES, in member order; this member's
 * own entry is ignored). Fails (TSR_ERR_UNSUPPORTED), leaving p unusable, where a peer's GPU is not visible to
 * this process, this GPU cannot access its memory (cudaDeviceCanAccessPeer), or its area cannot be mapped. */
tsr_status tsr_peer_sum_connect(tsr_peer_sum *p, const void *handles);

/* Members of one process (tests): `size` areas on the current device, already connected, out[i] member i. */
tsr_status tsr_peer_sum_new_local(int size, size_t cap, double timeout_s, tsr_peer_sum **out);

/* The most floats one call sums (the cap given at creation). */
size_t tsr_peer_sum_cap(const tsr_peer_sum *p);

/* Queues the sum of buf[n] (device memory, n <= cap) over the group on `stream` (NULL: the CUDA backend's stream).
 * Every member must make the same calls with the same n, in the same order. */
void tsr_peer_sum_run(tsr_peer_sum *p, float *buf, size_t n, void *stream);

/* 1 when a call gave up waiting for a peer (read after the queued calls are done), else 0. */
int tsr_peer_sum_failed(tsr_peer_sum *p);

void tsr_peer_sum_free(tsr_peer_sum *p);

#ifdef __cplusplus
}
#endif

#endif

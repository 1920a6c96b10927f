/* Comm layer helpers shared by the implementations (see comm.h): failure bookkeeping and staging of backend
 * buffers for host comms. */
#include "parallel/comm.h"

#include "kernels/ops.h"

#include <stdlib.h>
#include <string.h>

void tsr_comm_free(tsr_comm *c)
{
    if (c && c->destroy) c->destroy(c);
}

tsr_status tsr_comm_fail(tsr_comm *c, const char *op, int peer, const char *why)
{
    c->broken = 1;
    if (peer >= 0)
        return tsr_fail(TSR_ERR_REMOTE, "%s comm: %s with member %d (this is member %d of %d): %s", c->name, op, peer,
                        c->rank, c->size, why);
    return tsr_fail(TSR_ERR_REMOTE, "%s comm: %s (member %d of %d): %s", c->name, op, c->rank, c->size, why);
}

tsr_status tsr_comm_refuse(const tsr_comm *c, const char *op)
{
    return tsr_fail(TSR_ERR_REMOTE, "%s comm: %s refused: an earlier operation of this group failed", c->name, op);
}

/* The backend's memory is host memory when its allocator hands out host pointers (the CPU backend). */
static int backend_is_host(const tsr_ops *ops)
{
    return !ops || !strcmp(ops->name, "cpu");
}

static void *grow(void **scratch, size_t *have, size_t bytes)
{
    if (bytes <= *have) return *scratch;
    void *p = realloc(*scratch, bytes ? bytes : 1);
    if (!p) return NULL;
    *scratch = p;
    *have = bytes;
    return p;
}

tsr_status tsr_comm_allreduce_backend(tsr_comm *c, const tsr_ops *ops, float *buf, size_t n, void **scratch,
                                      size_t *scratch_n)
{
    if (c->mem == TSR_COMM_DEVICE || backend_is_host(ops)) return c->allreduce_sum(c, buf, n);
    float *h = grow(scratch, scratch_n, n * sizeof(float));
    if (!h) return tsr_fail(TSR_ERR_NOMEM, "out of memory staging %zu floats", n);
    ops->to_host(h, buf, n * sizeof(float));
    TSR_TRY(c->allreduce_sum(c, h, n));
    ops->to_device(buf, h, n * sizeof(float));
    return TSR_OK;
}

tsr_status tsr_comm_send_backend(tsr_comm *c, const tsr_ops *ops, const void *buf, size_t bytes, int peer,
                                 void **scratch, size_t *scratch_n)
{
    if (c->mem == TSR_COMM_DEVICE || backend_is_host(ops)) return c->send(c, buf, bytes, peer);
    void *h = grow(scratch, scratch_n, bytes);
    if (!h) return tsr_fail(TSR_ERR_NOMEM, "out of memory staging %zu bytes", bytes);
    ops->to_host(h, buf, bytes);
    return c->send(c, h, bytes, peer);
}

tsr_status tsr_comm_recv_backend(tsr_comm *c, const tsr_ops *ops, void *buf, size_t bytes, int peer, void **scratch,
                                 size_t *scratch_n)
{
    if (c->mem == TSR_COMM_DEVICE || backend_is_host(ops)) return c->recv(c, buf, bytes, peer);
    void *h = grow(scratch, scratch_n, bytes);
    if (!h) return tsr_fail(TSR_ERR_NOMEM, "out of memory staging %zu bytes", bytes);
    TSR_TRY(c->recv(c, h, bytes, peer));
    ops->to_device(buf, h, bytes);
    return TSR_OK;
}

/* Coordinator/worker message framing (see protocol.h). */
#include "parallel/protocol.h"

#include "parallel/mpi_util.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

tsr_msg tsr_msg_make(tsr_msg_type type, int sender)
{
    tsr_msg m;
    memset(&m, 0, sizeof m);
    m.magic = TSR_MSG_MAGIC;
    m.version = TSR_PROTOCOL_VERSION;
    m.type = (uint32_t)type;
    m.sender = sender;
    return m;
}

tsr_status tsr_msg_send(MPI_Comm comm, int dest, int tag, tsr_msg *hdr, const void *payload, size_t len,
                        double timeout_s)
{
    if (len > (size_t)INT_MAX - sizeof *hdr)
        return tsr_fail(TSR_ERR_UNSUPPORTED, "message of %zu bytes is too large", len);
    hdr->payload = (uint32_t)len;
    uint8_t *buf = malloc(sizeof *hdr + len);
    if (!buf) return tsr_fail(TSR_ERR_NOMEM, "out of memory for a %zu-byte message", len);
    memcpy(buf, hdr, sizeof *hdr);
    if (len) memcpy(buf + sizeof *hdr, payload, len);
    MPI_Request r;
    int err = MPI_Isend(buf, (int)(sizeof *hdr + len), MPI_BYTE, dest, tag, comm, &r);
    tsr_status st =
        err == MPI_SUCCESS ? tsr_mpi_wait(&r, 1, timeout_s, "sending to a rank") : tsr_mpi_fail(err, "MPI_Isend");
    /* a timed-out send still references buf: leak it rather than free memory MPI may read */
    if (st == TSR_OK || err != MPI_SUCCESS) free(buf);
    return st;
}

tsr_status tsr_msg_recv(MPI_Comm comm, const MPI_Status *probe, uint8_t **buf, size_t *len, tsr_msg *hdr)
{
    int count = 0;
    MPI_Get_count(probe, MPI_BYTE, &count);
    uint8_t *b = malloc(count > 0 ? (size_t)count : 1);
    if (!b) return tsr_fail(TSR_ERR_NOMEM, "out of memory for a %d-byte message", count);
    MPI_Status s;
    int err = MPI_Recv(b, count, MPI_BYTE, probe->MPI_SOURCE, probe->MPI_TAG, comm, &s);
    if (err != MPI_SUCCESS) {
        free(b);
        return tsr_mpi_fail(err, "MPI_Recv");
    }
    if ((size_t)count < sizeof *hdr) {
        free(b);
        return tsr_fail(TSR_ERR_FORMAT, "message from rank %d: %d bytes, shorter than a header", probe->MPI_SOURCE,
                        count);
    }
    memcpy(hdr, b, sizeof *hdr);
    if (hdr->magic != TSR_MSG_MAGIC || hdr->version != TSR_PROTOCOL_VERSION ||
        hdr->payload != (uint32_t)((size_t)count - sizeof *hdr)) {
        free(b);
        return tsr_fail(TSR_ERR_FORMAT,
                        "message from rank %d: bad header (magic %08x, version %u, %u payload bytes of %d)",
                        probe->MPI_SOURCE, hdr->magic, hdr->version, hdr->payload, count);
    }
    *buf = b;
    *len = (size_t)count;
    return TSR_OK;
}

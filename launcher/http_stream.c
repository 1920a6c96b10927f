/* Server-sent events for stream: true: a chunked text/event-stream response whose body is produced as the
 * service's events arrive.
 *
 * libmicrohttpd asks the content reader for bytes whenever the socket can take them. The reader turns queued
 * events into `data: {...}\n\n` frames (tsr_http_job_process), hands out what it has, and when it has nothing it
 * suspends the connection and returns 0; the service callback resumes it when the next event is queued. After
 * the last choice's final event come the usage chunk (stream_options.include_usage) and `data: [DONE]`, then
 * the end of the stream. The frames of one job are kept in one buffer that is compacted as it drains; events are
 * turned into frames only once the buffer is empty, so a client that does not read leaves them queued in the job,
 * counted against the stream backlog (http_job.c), and a stream past it ends with an error. The socket's send
 * buffer is capped at the backlog too (at most SNDBUF_MAX), so that the kernel does not hide a stalled client
 * behind megabytes of its own buffering. */
#include "launcher/http_internal.h"

#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#define SNDBUF_MAX (256 << 10) /* the kernel's send buffer of a stream, at most (it doubles what is asked) */

tsr_status tsr_http_stream_raw(http_job *j, const char *s, size_t len)
{
    if (j->out_off == j->out_len) j->out_off = j->out_len = 0;
    if (j->out_off > 0 && j->out_len + len > j->out_cap) {
        memmove(j->out, j->out + j->out_off, j->out_len - j->out_off);
        j->out_len -= j->out_off;
        j->out_off = 0;
    }
    if (j->out_len + len > j->out_cap) {
        size_t cap = j->out_cap ? j->out_cap : 4096;
        while (j->out_len + len > cap) cap *= 2;
        char *p = realloc(j->out, cap);
        if (!p) return tsr_fail(TSR_ERR_NOMEM, "out of memory for a stream");
        j->out = p;
        j->out_cap = cap;
    }
    memcpy(j->out + j->out_len, s, len);
    j->out_len += len;
    return TSR_OK;
}

tsr_status tsr_http_stream_frame(http_job *j, json_t *obj)
{
    if (!obj) return tsr_fail(TSR_ERR_NOMEM, "out of memory building a chunk");
    char *s = json_dumps(obj, JSON_COMPACT);
    json_decref(obj);
    if (!s) return tsr_fail(TSR_ERR_NOMEM, "out of memory building a chunk");
    tsr_status st = tsr_http_stream_raw(j, "data: ", 6);
    if (st == TSR_OK) st = tsr_http_stream_raw(j, s, strlen(s));
    if (st == TSR_OK) st = tsr_http_stream_raw(j, "\n\n", 2);
    free(s);
    return st;
}

static ssize_t reader(void *cls, uint64_t pos, char *buf, size_t max)
{
    (void)pos;
    http_job *j = cls;
    for (;;) {
        pthread_mutex_lock(&j->mu);
        if (j->overflow) {
            /* events were dropped: end the stream as broken rather than with a gap (counted, not logged) */
            pthread_mutex_unlock(&j->mu);
            tsr_http_quiet_close();
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
        /* new events only once the previous ones are out: what the client has not taken stays queued, where
         * the service callback counts it against the stream backlog */
        http_event *list = j->out_off == j->out_len ? tsr_http_job_take(j) : NULL;
        if (!list && j->out_off == j->out_len && !j->stream_done && !j->h->stopping) {
            /* nothing to send: sleep until the service callback resumes us */
            j->suspended = 1;
            MHD_suspend_connection(j->conn);
            pthread_mutex_unlock(&j->mu);
            return 0;
        }
        pthread_mutex_unlock(&j->mu);
        if (list) {
            if (tsr_http_job_process(j, list) != TSR_OK) {
                /* out of memory: end the stream rather than send a broken one; the choices are cancelled */
                pthread_mutex_lock(&j->mu);
                tsr_http_job_cancel(j);
                pthread_mutex_unlock(&j->mu);
                return MHD_CONTENT_READER_END_WITH_ERROR;
            }
            continue;
        }
        if (j->out_off < j->out_len) {
            size_t k = j->out_len - j->out_off;
            if (k > max) k = max;
            memcpy(buf, j->out + j->out_off, k);
            j->out_off += k;
            return (ssize_t)k;
        }
        return j->stream_done ? MHD_CONTENT_READER_END_OF_STREAM : MHD_CONTENT_READER_END_WITH_ERROR;
    }
}

static void reader_done(void *cls)
{
    tsr_http_job_release(cls);
}

enum MHD_Result tsr_http_stream_reply(tsr_http *h, struct MHD_Connection *c, http_job *j)
{
    pthread_mutex_lock(&j->mu);
    j->refs++; /* the response's reference, dropped by reader_done */
    pthread_mutex_unlock(&j->mu);
    /* the opening chunks (chat: the role of each choice) go out first */
    json_t *open = tsr_oai_stream_open(j->res);
    size_t i;
    json_t *chunk;
    tsr_status st = open ? TSR_OK : TSR_ERR_NOMEM;
    json_array_foreach(open, i, chunk) if (st == TSR_OK) st = tsr_http_stream_frame(j, json_incref(chunk));
    json_decref(open);
    struct MHD_Response *r =
        st != TSR_OK ? NULL : MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, reader, j, reader_done);
    if (!r) {
        pthread_mutex_lock(&j->mu);
        tsr_http_job_cancel(j);
        pthread_mutex_unlock(&j->mu);
        tsr_http_job_release(j);
        tsr_oai_error e;
        tsr_oai_error_set(&e, 500, NULL, NULL, "out of memory");
        return tsr_http_reply_error(h, c, j->rq->kind == TSR_OAI_CHAT ? TSR_ROUTE_CHAT : TSR_ROUTE_COMPLETIONS, &e);
    }
    /* a stream needs little kernel buffering; without a cap, a client that does not read would have the kernel
     * hold megabytes for it (TCP autotuning) before its backlog here even starts to count */
    int sndbuf = (int)(h->opts.stream_backlog < SNDBUF_MAX ? h->opts.stream_backlog : SNDBUF_MAX);
    if (j->fd >= 0) setsockopt(j->fd, SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof sndbuf);
    MHD_add_response_header(r, "Content-Type", "text/event-stream; charset=utf-8");
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    MHD_add_response_header(r, "X-Accel-Buffering", "no");
    enum MHD_Result ret = MHD_queue_response(c, MHD_HTTP_OK, r);
    MHD_destroy_response(r);
    tsr_http_metrics_request(&h->metrics, j->rq->kind == TSR_OAI_CHAT ? TSR_ROUTE_CHAT : TSR_ROUTE_COMPLETIONS,
                             MHD_HTTP_OK);
    tsr_http_metrics_stream(&h->metrics);
    return ret;
}

/* The gateway's server (see http_server.h): the libmicrohttpd daemon and its limits, request dispatch, request
 * bodies, connection completion, the ticker, and the start/drain/stop life cycle (API keys: http_auth.c; the
 * connection registry and its timeouts: http_conns.c).
 *
 * Request bodies are gathered into a buffer bounded by max_body (413 beyond it: at once when Content-Length
 * says so; otherwise the body is read and discarded for up to DISCARD_MAX more bytes, then answered 413, and a
 * body longer still gets the connection closed). When a connection ends, libmicrohttpd reports how
 * (MHD_OPTION_NOTIFY_COMPLETED); anything but a completed response cancels what the request still has running in
 * the service. A suspended connection is not watched by libmicrohttpd, so a ticker peeks at the sockets of
 * suspended requests a few times a second and cancels the requests of clients that hung up; the same ticker
 * shuts down streams whose client stopped reading (http_job.c) and connections too slow or idle for the
 * timeouts (http_conns.c; libmicrohttpd's own timeout is off). */
#include "launcher/http_internal.h"

#include <errno.h>
#include <netdb.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define TICK_MS 200
#define DISCARD_MAX ((size_t)1 << 20) /* body bytes read past max_body to answer 413 rather than close */

/* Set just before the access handler or a stream's reader ends a connection on purpose, so that libmicrohttpd's
 * "application error" message about it (logged on the same thread right after) is not printed. */
static _Thread_local int closing_on_purpose;

void tsr_http_quiet_close(void)
{
    closing_on_purpose = 1;
}

/* --- routing --------------------------------------------------------------------------------------------- */

static tsr_http_route route_of(const char *url)
{
    if (!strcmp(url, "/health")) return TSR_ROUTE_HEALTH;
    if (!strcmp(url, "/metrics")) return TSR_ROUTE_METRICS;
    if (!strcmp(url, "/v1/models") || !strncmp(url, "/v1/models/", 11)) return TSR_ROUTE_MODELS;
    if (!strcmp(url, "/v1/completions")) return TSR_ROUTE_COMPLETIONS;
    if (!strcmp(url, "/v1/chat/completions")) return TSR_ROUTE_CHAT;
    return TSR_ROUTE_OTHER;
}

/* --- the access handler ---------------------------------------------------------------------------------- */

static enum MHD_Result first_call(tsr_http *h, struct MHD_Connection *c, http_conn *cc, const char *url,
                                  const char *method)
{
    tsr_oai_error e;
    if (!tsr_http_host_allowed(h, c, &e)) {
        cc->answered = 1;
        return tsr_http_reply_error(h, c, cc->route, &e);
    }
    int is_get = !strcmp(method, MHD_HTTP_METHOD_GET) || !strcmp(method, MHD_HTTP_METHOD_HEAD);
    int is_post = !strcmp(method, MHD_HTTP_METHOD_POST);
    switch (cc->route) {
    case TSR_ROUTE_HEALTH:
    case TSR_ROUTE_METRICS:
    case TSR_ROUTE_MODELS:
        if (!is_get) break;
        cc->answered = 1;
        if (cc->route == TSR_ROUTE_HEALTH) return tsr_http_route_health(h, c);
        if (cc->route == TSR_ROUTE_METRICS) return tsr_http_route_metrics(h, c);
        if (!tsr_http_authorized(h, c, &e)) return tsr_http_reply_error(h, c, cc->route, &e);
        return tsr_http_route_models(h, c, url);
    case TSR_ROUTE_COMPLETIONS:
    case TSR_ROUTE_CHAT: {
        if (!is_post) break;
        if (!tsr_http_authorized(h, c, &e)) {
            cc->answered = 1;
            return tsr_http_reply_error(h, c, cc->route, &e);
        }
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl && strtoull(cl, NULL, 10) > h->opts.max_body) {
            cc->answered = 1;
            tsr_oai_error_set(&e, 413, NULL, "request_too_large",
                              "The request body (%.20s bytes) is over this server's limit of %zu bytes.", cl,
                              h->opts.max_body);
            return tsr_http_reply_error(h, c, cc->route, &e);
        }
        tsr_http_conn_body(h, c, 1, 0);
        return MHD_YES; /* the body follows */
    }
    default:
        cc->answered = 1;
        tsr_oai_error_set(&e, 404, NULL, "not_found", "Unknown path %.200s %.200s", method, url);
        return tsr_http_reply_error(h, c, cc->route, &e);
    }
    cc->answered = 1;
    tsr_oai_error_set(&e, 405, NULL, "method_not_allowed", "Method %.32s is not allowed on %.200s", method, url);
    return tsr_http_reply_error(h, c, cc->route, &e);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload_data, size_t *upload_data_size,
                                  void **con_cls)
{
    (void)version;
    tsr_http *h = cls;
    http_conn *cc = *con_cls;
    closing_on_purpose = 0;
    if (!cc) {
        if (!(cc = calloc(1, sizeof *cc))) return MHD_NO;
        cc->route = route_of(url);
        *con_cls = cc;
        tsr_http_conn_busy(h, c, 1);
        return first_call(h, c, cc, url, method);
    }
    if (*upload_data_size) {
        size_t n = *upload_data_size;
        *upload_data_size = 0;
        tsr_http_conn_body(h, c, 0, n);
        if (cc->too_large || cc->answered) {
            /* discard a bounded amount, then give up on answering: close */
            cc->discarded += n;
            if (cc->discarded <= DISCARD_MAX) return MHD_YES;
            closing_on_purpose = 1;
            return MHD_NO;
        }
        if (cc->len + n > h->opts.max_body) {
            cc->too_large = 1;
            cc->discarded = cc->len + n - h->opts.max_body;
            free(cc->body);
            cc->body = NULL;
            cc->len = cc->cap = 0;
            return MHD_YES;
        }
        if (cc->len + n + 1 > cc->cap) {
            size_t cap = cc->cap ? cc->cap : 4096;
            while (cc->len + n + 1 > cap) cap *= 2;
            char *b = realloc(cc->body, cap);
            if (!b) return MHD_NO;
            cc->body = b;
            cc->cap = cap;
        }
        memcpy(cc->body + cc->len, upload_data, n);
        cc->len += n;
        return MHD_YES;
    }
    tsr_http_conn_body(h, c, -1, 0);
    if (cc->answered) return MHD_YES;
    if (cc->too_large) {
        cc->answered = 1;
        tsr_oai_error e;
        tsr_oai_error_set(&e, 413, NULL, "request_too_large", "The request body is over this server's limit of %zu "
                                                               "bytes.", h->opts.max_body);
        return tsr_http_reply_error(h, c, cc->route, &e);
    }
    return tsr_http_route_generate(h, c, cc);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe)
{
    tsr_http *h = cls;
    tsr_http_conn_busy(h, c, 0);
    http_conn *cc = *con_cls;
    if (!cc) return;
    if (cc->job) tsr_http_job_conn_done(cc->job, toe != MHD_REQUEST_TERMINATED_COMPLETED_OK);
    free(cc->body);
    free(cc);
    *con_cls = NULL;
}

/* --- the ticker: clients that hung up, streams nobody reads, slow requests ------------------------------- */

static int peer_gone(int fd)
{
    char b;
    ssize_t n = recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n > 0) return 0;
    if (n == 0) return 1;
    return !(errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR);
}

static void *ticker_main(void *arg)
{
    tsr_http *h = arg;
    pthread_mutex_lock(&h->ticker_mu);
    while (!h->ticker_stop) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += TICK_MS * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&h->ticker_cond, &h->ticker_mu, &ts);
        if (h->ticker_stop) break;
        pthread_mutex_lock(&h->mu);
        for (http_job *j = h->jobs; j; j = j->next) {
            pthread_mutex_lock(&j->mu);
            /* while suspended, libmicrohttpd leaves the socket alone, so it is safe to look at */
            if (j->suspended && !j->conn_gone && !j->cancelled && j->fd >= 0 && peer_gone(j->fd) &&
                j->n_final < j->rq->n_choices) {
                tsr_http_metrics_disconnect(&h->metrics);
                tsr_http_job_cancel(j);
            }
            /* a stream whose client stopped reading: its request is cancelled already, close the connection
             * (until its answer is complete the connection is ours, so the descriptor is still its own) */
            if (j->overflow && !j->shut && !j->conn_gone && j->fd >= 0) {
                shutdown(j->fd, SHUT_RDWR);
                j->shut = 1;
            }
            pthread_mutex_unlock(&j->mu);
        }
        pthread_mutex_unlock(&h->mu);
        tsr_http_conns_sweep(h);
    }
    pthread_mutex_unlock(&h->ticker_mu);
    return NULL;
}

/* --- life cycle ------------------------------------------------------------------------------------------ */

/* libmicrohttpd's messages, prefixed; clients that hang up (or are hung up on: the header timeout, a stream
 * nobody reads) are routine and counted in /metrics, and requests too big for --max-header get their 431 or 414,
 * so those are not printed. The rest are limited to LOG_BURST lines per second, so that a flood of bad clients
 * cannot flood the log; the count of those left out is printed with the next line that goes through. Messages
 * never contain header values or bodies. */
#define LOG_BURST 10

static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    tsr_http *h = cls;
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    if (strstr(msg, "no longer available") || strstr(msg, "reset by remote") || strstr(msg, "closed by remote") ||
        strstr(msg, "Connection reset") || strstr(msg, "Broken pipe") || strstr(msg, "detected connection closure") ||
        strstr(msg, "disconnected when reading") ||
        strstr(msg, "response code is 4") || strstr(msg, "Not enough memory in pool"))
        return; /* hang-ups, and requests too big for --max-header (answered 431 or 414) */
    if (closing_on_purpose &&
        (strstr(msg, "Application reported internal error") || strstr(msg, "application error generating"))) {
        closing_on_purpose = 0;
        return;
    }
    size_t n = strlen(msg);
    while (n && msg[n - 1] == '\n') msg[--n] = 0;
    double now = tsr_service_now();
    pthread_mutex_lock(&h->log_mu);
    unsigned long dropped = 0;
    if (now - h->log_t0 >= 1.0) {
        dropped = h->log_dropped;
        h->log_t0 = now;
        h->log_n = h->log_dropped = 0;
    }
    int print = h->log_n < LOG_BURST;
    if (print) h->log_n++;
    else h->log_dropped++;
    pthread_mutex_unlock(&h->log_mu);
    if (dropped) fprintf(stderr, "tessera serve: http: (%lu messages left out)\n", dropped);
    if (print) fprintf(stderr, "tessera serve: http: %s\n", msg);
}

static void free_http(tsr_http *h)
{
    tsr_http_keys_free(h);
    tsr_http_metrics_destroy(&h->metrics);
    pthread_rwlock_destroy(&h->svc_lock);
    pthread_mutex_destroy(&h->mu);
    pthread_cond_destroy(&h->idle);
    pthread_mutex_destroy(&h->ticker_mu);
    pthread_cond_destroy(&h->ticker_cond);
    pthread_mutex_destroy(&h->socks_mu);
    pthread_mutex_destroy(&h->log_mu);
    free(h);
}

tsr_status tsr_http_start(const tsr_http_opts *opts, tsr_http **out)
{
    tsr_http *h = calloc(1, sizeof *h);
    if (!h) return tsr_fail(TSR_ERR_NOMEM, "out of memory");
    h->opts = *opts;
    if (!h->opts.host) h->opts.host = "127.0.0.1";
    if (!h->opts.max_body) h->opts.max_body = 8u << 20;
    if (!h->opts.max_header) h->opts.max_header = 64u << 10;
    if (h->opts.max_header < (16u << 10)) h->opts.max_header = 16u << 10;
    h->opts.conn_limit = tsr_http_conn_limit(h->opts.conn_limit);
    if (!h->opts.conn_timeout_s) h->opts.conn_timeout_s = 60;
    if (!h->opts.header_timeout_s) h->opts.header_timeout_s = 30;
    if (h->opts.header_timeout_s > h->opts.conn_timeout_s) h->opts.header_timeout_s = h->opts.conn_timeout_s;
    if (!h->opts.stream_backlog) h->opts.stream_backlog = 1u << 20;
    if (!h->opts.threads) h->opts.threads = 2;
    h->opts.api_keys = NULL;
    pthread_rwlock_init(&h->svc_lock, NULL);
    pthread_mutex_init(&h->mu, NULL);
    pthread_cond_init(&h->idle, NULL);
    pthread_mutex_init(&h->ticker_mu, NULL);
    pthread_cond_init(&h->ticker_cond, NULL);
    pthread_mutex_init(&h->socks_mu, NULL);
    pthread_mutex_init(&h->log_mu, NULL);
    tsr_http_metrics_init(&h->metrics);
    tsr_status kst = tsr_http_keys_init(h, opts->api_keys, opts->n_api_keys);
    if (kst != TSR_OK) {
        free_http(h);
        return kst;
    }

    char port[16];
    snprintf(port, sizeof port, "%d", opts->port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV}, *ai = NULL;
    int gai = getaddrinfo(h->opts.host, port, &hints, &ai);
    if (gai || !ai) {
        tsr_status st = tsr_fail(TSR_ERR_ARG, "cannot resolve the address '%s': %s", h->opts.host,
                                 gai_strerror(gai));
        free_http(h);
        return st;
    }
    h->loopback_only = !h->opts.allow_any_host && tsr_http_addr_is_loopback(ai->ai_addr);
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ITC | MHD_USE_ERROR_LOG;
    flags |= MHD_is_feature_supported(MHD_FEATURE_EPOLL) == MHD_YES ? MHD_USE_EPOLL : MHD_USE_POLL;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    /* libmicrohttpd's idle timeout stays off (0): the ticker's sweep times connections (http_conns.c) */
    h->daemon = MHD_start_daemon(
        flags, (uint16_t)opts->port, NULL, NULL, on_request, h, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, h,
        MHD_OPTION_SOCK_ADDR, ai->ai_addr, MHD_OPTION_NOTIFY_COMPLETED, on_completed, h,
        MHD_OPTION_NOTIFY_CONNECTION, tsr_http_on_connection, h, MHD_OPTION_CONNECTION_LIMIT, h->opts.conn_limit,
        MHD_OPTION_PER_IP_CONNECTION_LIMIT, h->opts.per_ip_limit, MHD_OPTION_CONNECTION_TIMEOUT,
        0u, MHD_OPTION_CONNECTION_MEMORY_LIMIT, h->opts.max_header,
        MHD_OPTION_THREAD_POOL_SIZE, h->opts.threads > 1 ? h->opts.threads : 0u, MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!h->daemon) {
        int err = errno;
        tsr_status st = tsr_fail(TSR_ERR_IO, "cannot listen on %s:%d: %s", h->opts.host, opts->port,
                                 err ? strerror(err) : "libmicrohttpd refused the options");
        free_http(h);
        return st;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(h->daemon, MHD_DAEMON_INFO_BIND_PORT);
    h->port = di ? di->port : opts->port;
    if (pthread_create(&h->ticker, NULL, ticker_main, h) == 0) h->ticker_started = 1;
    *out = h;
    return TSR_OK;
}

int tsr_http_port(const tsr_http *h)
{
    return h->port;
}

void tsr_http_set_ready(tsr_http *h, const tsr_oai_model *model, tsr_service *svc)
{
    pthread_rwlock_wrlock(&h->svc_lock);
    h->model = model;
    h->svc = svc;
    h->ready = 1;
    pthread_rwlock_unlock(&h->svc_lock);
}

void tsr_http_drain(tsr_http *h)
{
    pthread_rwlock_wrlock(&h->svc_lock);
    h->draining = 1;
    pthread_rwlock_unlock(&h->svc_lock);
    MHD_socket fd = MHD_quiesce_daemon(h->daemon);
    if (fd != MHD_INVALID_SOCKET) close(fd);
}

int tsr_http_wait_idle(tsr_http *h, double timeout_s)
{
    double end = tsr_service_now() + timeout_s;
    pthread_mutex_lock(&h->mu);
    while (h->n_jobs > 0 && tsr_service_now() < end) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 50 * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&h->idle, &h->mu, &ts);
    }
    int left = h->n_jobs;
    pthread_mutex_unlock(&h->mu);
    return left;
}

void tsr_http_stop(tsr_http *h)
{
    if (!h) return;
    if (h->ticker_started) {
        pthread_mutex_lock(&h->ticker_mu);
        h->ticker_stop = 1;
        pthread_cond_signal(&h->ticker_cond);
        pthread_mutex_unlock(&h->ticker_mu);
        pthread_join(h->ticker, NULL);
    }
    /* libmicrohttpd must not be stopped with suspended connections: wake them; they end instead of waiting */
    pthread_mutex_lock(&h->mu);
    h->stopping = 1;
    for (http_job *j = h->jobs; j; j = j->next) {
        pthread_mutex_lock(&j->mu);
        if (j->suspended && !j->conn_gone) {
            j->suspended = 0;
            MHD_resume_connection(j->conn);
        }
        pthread_mutex_unlock(&j->mu);
    }
    pthread_mutex_unlock(&h->mu);
    MHD_stop_daemon(h->daemon);
    /* jobs still held by the service (it was not stopped) are leaked on purpose: their callbacks may still come */
    free_http(h);
}

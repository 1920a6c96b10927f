/* The gateway's server (see http_server.h): the libmicrohttpd daemon, request dispatch, request bodies, API keys,
 * connection completion, the disconnect ticker, and the start/drain/stop life cycle.
 *
 * Request bodies are gathered into a buffer bounded by max_body (413 beyond it: at once when Content-Length
 * says so, otherwise once the body has been read and discarded). API keys are compared in constant time. When a
 * connection ends, libmicrohttpd reports how (MHD_OPTION_NOTIFY_COMPLETED); anything but a completed response
 * cancels what the request still has running in the service. A suspended connection is not watched by
 * libmicrohttpd, so a ticker peeks at the sockets of suspended requests a few times a second and cancels the
 * requests of clients that hung up. */
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

/* --- routing and authentication -------------------------------------------------------------------------- */

static tsr_http_route route_of(const char *url)
{
    if (!strcmp(url, "/health")) return TSR_ROUTE_HEALTH;
    if (!strcmp(url, "/metrics")) return TSR_ROUTE_METRICS;
    if (!strcmp(url, "/v1/models") || !strncmp(url, "/v1/models/", 11)) return TSR_ROUTE_MODELS;
    if (!strcmp(url, "/v1/completions")) return TSR_ROUTE_COMPLETIONS;
    if (!strcmp(url, "/v1/chat/completions")) return TSR_ROUTE_CHAT;
    return TSR_ROUTE_OTHER;
}

/* Equal strings in time that depends only on the lengths. */
static int same_secret(const char *a, size_t na, const char *b, size_t nb)
{
    volatile unsigned char diff = (unsigned char)(na != nb);
    size_t n = na > nb ? na : nb;
    for (size_t i = 0; i < n; i++) {
        unsigned char x = i < na ? (unsigned char)a[i] : 0, y = i < nb ? (unsigned char)b[i] : 0;
        diff |= (unsigned char)(x ^ y);
    }
    return diff == 0;
}

static int authorized(tsr_http *h, struct MHD_Connection *c, tsr_oai_error *e)
{
    if (h->opts.n_api_keys == 0) return 1;
    const char *v = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (!v) {
        tsr_oai_error_set(e, 401, NULL, "invalid_api_key",
                          "You didn't provide an API key. Send it as 'Authorization: Bearer KEY'.");
        return 0;
    }
    if (strncasecmp(v, "Bearer ", 7)) {
        tsr_oai_error_set(e, 401, NULL, "invalid_api_key", "The Authorization header must be 'Bearer KEY'.");
        return 0;
    }
    v += 7;
    while (*v == ' ') v++;
    size_t n = strlen(v);
    int ok = 0;
    for (int i = 0; i < h->opts.n_api_keys; i++) ok |= same_secret(v, n, h->keys[i], strlen(h->keys[i]));
    if (!ok) tsr_oai_error_set(e, 401, NULL, "invalid_api_key", "Incorrect API key provided.");
    return ok;
}

/* --- the access handler ---------------------------------------------------------------------------------- */

static enum MHD_Result first_call(tsr_http *h, struct MHD_Connection *c, http_conn *cc, const char *url,
                                  const char *method)
{
    tsr_oai_error e;
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
        if (!authorized(h, c, &e)) return tsr_http_reply_error(h, c, cc->route, &e);
        return tsr_http_route_models(h, c, url);
    case TSR_ROUTE_COMPLETIONS:
    case TSR_ROUTE_CHAT: {
        if (!is_post) break;
        if (!authorized(h, c, &e)) {
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
    if (!cc) {
        if (!(cc = calloc(1, sizeof *cc))) return MHD_NO;
        cc->route = route_of(url);
        *con_cls = cc;
        return first_call(h, c, cc, url, method);
    }
    if (*upload_data_size) {
        size_t n = *upload_data_size;
        *upload_data_size = 0;
        if (cc->answered || cc->too_large) return MHD_YES; /* discard */
        if (cc->len + n > h->opts.max_body) {
            cc->too_large = 1;
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
    (void)cls;
    (void)c;
    http_conn *cc = *con_cls;
    if (!cc) return;
    if (cc->job) tsr_http_job_conn_done(cc->job, toe != MHD_REQUEST_TERMINATED_COMPLETED_OK);
    free(cc->body);
    free(cc);
    *con_cls = NULL;
}

/* --- the disconnect ticker ------------------------------------------------------------------------------- */

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
            pthread_mutex_unlock(&j->mu);
        }
        pthread_mutex_unlock(&h->mu);
    }
    pthread_mutex_unlock(&h->ticker_mu);
    return NULL;
}

/* --- life cycle ------------------------------------------------------------------------------------------ */

/* libmicrohttpd's messages, prefixed; clients that hang up are routine (the request is cancelled and counted in
 * tessera_http_client_disconnects_total), so those are not printed. */
static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    (void)cls;
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    if (strstr(msg, "no longer available") || strstr(msg, "reset by remote") || strstr(msg, "closed by remote") ||
        strstr(msg, "Connection reset") || strstr(msg, "Broken pipe"))
        return;
    size_t n = strlen(msg);
    while (n && msg[n - 1] == '\n') msg[--n] = 0;
    fprintf(stderr, "tessera serve: http: %s\n", msg);
}

static void free_http(tsr_http *h)
{
    for (int i = 0; h->keys && i < h->opts.n_api_keys; i++) free(h->keys[i]);
    free(h->keys);
    tsr_http_metrics_destroy(&h->metrics);
    pthread_rwlock_destroy(&h->svc_lock);
    pthread_mutex_destroy(&h->mu);
    pthread_cond_destroy(&h->idle);
    pthread_mutex_destroy(&h->ticker_mu);
    pthread_cond_destroy(&h->ticker_cond);
    free(h);
}

tsr_status tsr_http_start(const tsr_http_opts *opts, tsr_http **out)
{
    tsr_http *h = calloc(1, sizeof *h);
    if (!h) return tsr_fail(TSR_ERR_NOMEM, "out of memory");
    h->opts = *opts;
    if (!h->opts.host) h->opts.host = "127.0.0.1";
    if (!h->opts.max_body) h->opts.max_body = 8u << 20;
    if (!h->opts.conn_limit) h->opts.conn_limit = 1024;
    if (!h->opts.conn_timeout_s) h->opts.conn_timeout_s = 300;
    if (!h->opts.threads) h->opts.threads = 2;
    pthread_rwlock_init(&h->svc_lock, NULL);
    pthread_mutex_init(&h->mu, NULL);
    pthread_cond_init(&h->idle, NULL);
    pthread_mutex_init(&h->ticker_mu, NULL);
    pthread_cond_init(&h->ticker_cond, NULL);
    tsr_http_metrics_init(&h->metrics);
    if (opts->n_api_keys > 0) {
        h->keys = calloc((size_t)opts->n_api_keys, sizeof *h->keys);
        for (int i = 0; h->keys && i < opts->n_api_keys; i++)
            if (!(h->keys[i] = strdup(opts->api_keys[i]))) {
                free_http(h);
                return tsr_fail(TSR_ERR_NOMEM, "out of memory");
            }
        if (!h->keys) {
            h->opts.n_api_keys = 0;
            free_http(h);
            return tsr_fail(TSR_ERR_NOMEM, "out of memory");
        }
    }
    h->opts.api_keys = NULL;

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
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ITC | MHD_USE_ERROR_LOG;
    flags |= MHD_is_feature_supported(MHD_FEATURE_EPOLL) == MHD_YES ? MHD_USE_EPOLL : MHD_USE_POLL;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    h->daemon = MHD_start_daemon(
        flags, (uint16_t)opts->port, NULL, NULL, on_request, h, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, h,
        MHD_OPTION_SOCK_ADDR, ai->ai_addr, MHD_OPTION_NOTIFY_COMPLETED, on_completed, h, MHD_OPTION_CONNECTION_LIMIT,
        h->opts.conn_limit, MHD_OPTION_CONNECTION_TIMEOUT, h->opts.conn_timeout_s, MHD_OPTION_THREAD_POOL_SIZE,
        h->opts.threads > 1 ? h->opts.threads : 0u, MHD_OPTION_END);
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

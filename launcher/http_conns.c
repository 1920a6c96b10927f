/* The gateway's TCP connections: how many it may hold, and how long one may take to send a request.
 *
 * libmicrohttpd's own timeout (MHD_OPTION_CONNECTION_TIMEOUT) closes a connection after that many seconds
 * without any byte moving; a client that trickles its request one byte at a time (slowloris) never trips it. So
 * every connection is registered here when it opens (MHD_OPTION_NOTIFY_CONNECTION) with the time it began
 * waiting for a request: the opening, or the end of its previous request. The access handler marks it busy once
 * a request's headers are complete; the ticker (tsr_http_conns_sweep) shuts down the socket of any connection
 * that has waited longer than the header timeout, and libmicrohttpd then closes it as it would a client that
 * hung up. A body trickled in the same way (slow POST) gets the rule of Apache's mod_reqtimeout: after the first
 * header-timeout seconds it must have averaged BODY_MIN_RATE bytes per second. The registry removes a connection
 * before libmicrohttpd closes its socket (NOTIFY_CLOSED comes first), so a swept descriptor is always still the
 * connection's own.
 *
 * The connection limit defaults to what the process's descriptor limit allows: tsr_http_raise_fd_limit() lifts
 * the soft RLIMIT_NOFILE to the hard one at start, and HTTP_FD_RESERVE descriptors stay for model files, pipes,
 * MPI and the nanomsg intake. */
#include "launcher/http_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/socket.h>

#define HTTP_FD_RESERVE 256
#define HTTP_DEFAULT_CONN_CAP 65536

#define BODY_MIN_RATE 500.0 /* bytes per second a request body must average after the first header timeout */

enum { SWEEP_PENDING = 1, SWEEP_DONE = 2 };

struct http_sock {
    int fd;
    double t_wait;   /* when it began waiting for a request's headers */
    int busy;        /* a request's headers are complete; until that request ends */
    int in_body;     /* its body is arriving, since t_body, body_bytes so far */
    double t_body;
    size_t body_bytes;
    int swept;       /* SWEEP_PENDING, then SWEEP_DONE (shut down) for taking too long; 0 otherwise */
    http_sock *prev, *next;
};

/* The soft limit on open files, at most 2^30 (RLIM_INFINITY included); -1 when unknown. */
static long fd_limit(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return -1;
    if (rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur > (rlim_t)1 << 30) return 1L << 30;
    return (long)rl.rlim_cur;
}

long tsr_http_raise_fd_limit(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max == RLIM_INFINITY ? (rlim_t)1 << 20 : rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl); /* on failure the old limit stays */
    }
    return fd_limit();
}

unsigned tsr_http_conn_limit(unsigned asked)
{
    long fds = fd_limit();
    if (fds < 0) fds = 1024;
    long most = fds - HTTP_FD_RESERVE;
    if (most < 16) most = 16;
    if (!asked) return (unsigned)(most < HTTP_DEFAULT_CONN_CAP ? most : HTTP_DEFAULT_CONN_CAP);
    if ((long)asked > most) {
        fprintf(stderr, "tessera serve: --max-connections %u is over what the descriptor limit allows (%ld open "
                        "files); using %ld\n", asked, fds, most);
        return (unsigned)most;
    }
    return asked;
}

void tsr_http_on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                            enum MHD_ConnectionNotificationCode code)
{
    tsr_http *h = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        http_sock *s = ci ? calloc(1, sizeof *s) : NULL;
        *socket_context = s;
        if (!s) return; /* untracked: libmicrohttpd's own timeout still applies */
        s->fd = ci->connect_fd;
        s->t_wait = tsr_service_now();
        pthread_mutex_lock(&h->socks_mu);
        s->next = h->socks;
        if (h->socks) h->socks->prev = s;
        h->socks = s;
        h->n_socks++;
        pthread_mutex_unlock(&h->socks_mu);
        return;
    }
    http_sock *s = *socket_context;
    if (!s) return;
    pthread_mutex_lock(&h->socks_mu);
    if (s->prev) s->prev->next = s->next;
    else h->socks = s->next;
    if (s->next) s->next->prev = s->prev;
    h->n_socks--;
    pthread_mutex_unlock(&h->socks_mu);
    free(s);
    *socket_context = NULL;
}

static http_sock *sock_of(struct MHD_Connection *c)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

void tsr_http_conn_busy(tsr_http *h, struct MHD_Connection *c, int busy)
{
    http_sock *s = sock_of(c);
    if (!s) return;
    pthread_mutex_lock(&h->socks_mu);
    s->busy = busy;
    s->in_body = 0;
    if (!busy) s->t_wait = tsr_service_now();
    pthread_mutex_unlock(&h->socks_mu);
}

void tsr_http_conn_body(tsr_http *h, struct MHD_Connection *c, int state, size_t bytes)
{
    http_sock *s = sock_of(c);
    if (!s) return;
    pthread_mutex_lock(&h->socks_mu);
    if (state > 0 && !s->in_body) {
        s->in_body = 1;
        s->t_body = tsr_service_now();
        s->body_bytes = 0;
    }
    if (state < 0) s->in_body = 0;
    s->body_bytes += bytes;
    pthread_mutex_unlock(&h->socks_mu);
}

static int too_slow(const http_sock *s, double now, double limit)
{
    if (!s->busy) return now - s->t_wait > limit;
    return s->in_body && now - s->t_body > limit + (double)s->body_bytes / BODY_MIN_RATE;
}

/* Counts the connections to sweep before shutting any of them down, so that a client that sees its connection
 * closed already finds it in tessera_http_header_timeouts_total (counted after the shutdowns, a loaded machine
 * could answer a /metrics request in between: serve.abuse failed that way once in CI). */
void tsr_http_conns_sweep(tsr_http *h)
{
    double now = tsr_service_now(), limit = (double)h->opts.header_timeout_s;
    int swept = 0;
    pthread_mutex_lock(&h->socks_mu);
    for (http_sock *s = h->socks; s; s = s->next)
        if (!s->swept && too_slow(s, now, limit)) {
            s->swept = SWEEP_PENDING;
            swept++;
        }
    if (swept) tsr_http_metrics_header_timeouts(&h->metrics, swept); /* its lock is taken under no other */
    for (http_sock *s = h->socks; s && swept; s = s->next)
        if (s->swept == SWEEP_PENDING) {
            shutdown(s->fd, SHUT_RDWR);
            s->swept = SWEEP_DONE;
        }
    pthread_mutex_unlock(&h->socks_mu);
}

unsigned tsr_http_conns_open(tsr_http *h)
{
    pthread_mutex_lock(&h->socks_mu);
    unsigned n = h->n_socks;
    pthread_mutex_unlock(&h->socks_mu);
    return n;
}

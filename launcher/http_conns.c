/* The gateway's TCP connections: how many it may hold, and when one is closed for being slow or idle.
 *
 * Every connection is registered here when it opens (MHD_OPTION_NOTIFY_CONNECTION), and the ticker
 * (tsr_http_conns_sweep) shuts down the socket of one that is too slow or idle; libmicrohttpd then closes it as
 * it would a client that hung up. libmicrohttpd's own idle timeout is off (MHD_OPTION_CONNECTION_TIMEOUT 0): it
 * counts from the last byte its thread moved, so an HTTP thread that falls seconds behind (a loaded machine) would
 * close connections whose requests were sent in time and lie unread, while a client that trickles its request a
 * byte at a time (slowloris) never trips it. The rules, each judged only while the client is the one late:
 * - headers: a connection must complete a request's headers within the header timeout of its opening, or of
 *   the end of its previous request (the access handler marks it busy at its first call);
 * - body: after the first header-timeout seconds, a body must average BODY_MIN_RATE bytes per second (slow
 *   POST, the rule of Apache's mod_reqtimeout), and no body byte may take longer than --conn-timeout;
 * - answer: while a request is under way, bytes waiting in the socket's send queue that do not move for
 *   --conn-timeout mean a client that stopped reading (one waiting for tokens has an empty queue: never idle);
 *   once its answer is handed to the kernel, the header rule takes over.
 * Two signs that the server is the one behind, not the client: bytes in the receive queue that no HTTP thread
 * has read yet (the header and body rules then wait until READ_GRACE_S after such bytes were last seen, time
 * for a thread to read and parse them), and a sweep that comes more than STALL_S late (the whole process could
 * not run: every clock moves forward by the gap). The registry removes a connection before libmicrohttpd closes
 * its socket (NOTIFY_CLOSED comes first), so a swept descriptor is always still the connection's own.
 *
 * The connection limit defaults to what the process's descriptor limit allows: tsr_http_raise_fd_limit() lifts
 * the soft RLIMIT_NOFILE to the hard one at start, and HTTP_FD_RESERVE descriptors stay for model files, pipes,
 * MPI and the nanomsg intake. */
#include "launcher/http_internal.h"

#include <linux/sockios.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/socket.h>

#define HTTP_FD_RESERVE 256
#define HTTP_DEFAULT_CONN_CAP 65536

#define BODY_MIN_RATE 500.0 /* bytes per second a request body must average after the first header timeout */
#define READ_GRACE_S 1.0    /* after unread input was last seen on a connection */
#define STALL_S 1.0         /* a sweep later than this after the previous one: the process was stalled */

enum { SWEEP_PENDING = 1, SWEEP_DONE = 2 };

struct http_sock {
    int fd;
    double t_wait;   /* when it began waiting for a request's headers */
    int busy;        /* a request's headers are complete; until that request ends */
    int in_body;     /* its body is arriving, since t_body, body_bytes so far, the last of them at t_bytes */
    double t_body, t_bytes;
    size_t body_bytes;
    int outq;        /* bytes in the socket's send queue at the last sweep, unchanged since t_outq */
    double t_outq;
    double t_input;  /* the last sweep that saw bytes in its receive queue (0: none) */
    int swept;       /* SWEEP_PENDING, then SWEEP_DONE (shut down) for being too slow or idle; 0 otherwise */
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
        if (!s) {
            /* untracked: libmicrohttpd's own idle timeout instead */
            MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, h->opts.conn_timeout_s);
            return;
        }
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
    double now = tsr_service_now();
    if (state > 0 && !s->in_body) {
        s->in_body = 1;
        s->t_body = s->t_bytes = now;
        s->body_bytes = 0;
    }
    if (state < 0) s->in_body = 0;
    s->body_bytes += bytes;
    if (bytes) s->t_bytes = now;
    pthread_mutex_unlock(&h->socks_mu);
}

/* Bytes the client sent that no HTTP thread has read yet. */
static int unread_input(int fd)
{
    int n = 0;
    return ioctl(fd, FIONREAD, &n) == 0 && n > 0;
}

/* The header and body rules (the client too slow to send its request). */
static int too_slow(http_sock *s, double now, double header_s, double idle_s)
{
    int late = !s->busy ? now - s->t_wait > header_s
                        : s->in_body && (now - s->t_body > header_s + (double)s->body_bytes / BODY_MIN_RATE ||
                                         now - s->t_bytes > idle_s);
    if (!late) return 0;
    if (unread_input(s->fd)) s->t_input = now;
    return now - s->t_input > READ_GRACE_S;
}

/* Time in which the ticker itself could not run is not the clients': every clock moves forward by it. */
static void forgive_stall(tsr_http *h, double now)
{
    double gap = now - h->t_sweep;
    if (h->t_sweep > 0 && gap > STALL_S)
        for (http_sock *s = h->socks; s; s = s->next) {
            s->t_wait += gap;
            s->t_body += gap;
            s->t_bytes += gap;
            s->t_outq += gap;
        }
    h->t_sweep = now;
}

/* The answer rule: bytes in the send queue that have not moved for idle_s (updates the socket's record). */
static int not_reading(http_sock *s, double now, double idle_s)
{
    int q = 0;
    if (ioctl(s->fd, SIOCOUTQ, &q) != 0 || q <= 0) q = 0;
    if (q == 0 || q != s->outq) {
        s->outq = q;
        s->t_outq = now;
        return 0;
    }
    return now - s->t_outq > idle_s;
}

/* Counts the connections to sweep before shutting any of them down, so that a client that sees its connection
 * closed already finds it in tessera_http_header_timeouts_total (counted after the shutdowns, a loaded machine
 * could answer a /metrics request in between: serve.abuse failed that way once in CI). */
void tsr_http_conns_sweep(tsr_http *h)
{
    double now = tsr_service_now(), header_s = (double)h->opts.header_timeout_s;
    double idle_s = (double)h->opts.conn_timeout_s;
    int swept = 0, slow = 0;
    pthread_mutex_lock(&h->socks_mu);
    forgive_stall(h, now);
    for (http_sock *s = h->socks; s; s = s->next) {
        if (s->swept) continue;
        const int too_slow_now = too_slow(s, now, header_s, idle_s); /* counted as a header timeout */
        if (!s->busy) s->outq = 0; /* between requests the header rule applies (header timeout <= idle_s) */
        if (too_slow_now || (s->busy && not_reading(s, now, idle_s))) {
            s->swept = SWEEP_PENDING;
            swept++;
            slow += too_slow_now;
        }
    }
    if (slow) tsr_http_metrics_header_timeouts(&h->metrics, slow); /* its lock is taken under no other */
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

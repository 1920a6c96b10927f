/* Prometheus metrics of the gateway (see http_metrics.h): counters and histograms kept here, the service's
 * counters read at render time, all written as text exposition format 0.0.4 with HELP and TYPE lines.
 *
 * Names follow Prometheus conventions (base units: seconds, _total for counters) with a tessera_ prefix, and the
 * histograms use buckets suited to token latencies, from milliseconds to a minute. */
#include "launcher/http_metrics.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const double ttft_bounds[] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80};
static const double itl_bounds[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};
static const double e2e_bounds[] = {0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320, 640};

static const unsigned codes[] = {200, 400, 401, 404, 405, 413, 429, 500, 503};
static const char *const code_names[TSR_METRICS_CODES] = {"200", "400", "401", "404", "405", "413",
                                                          "429", "500", "503", "4xx", "5xx"};
static const char *const route_names[TSR_ROUTE_COUNT] = {"/health",         "/metrics",
                                                         "/v1/models",      "/v1/completions",
                                                         "/v1/chat/completions", "other"};

#define N_OF(a) ((int)(sizeof(a) / sizeof((a)[0])))

static void hist_init(tsr_histogram *h, const double *bounds, int n)
{
    memset(h, 0, sizeof *h);
    h->bounds = bounds;
    h->n_bounds = n < TSR_METRICS_BUCKETS ? n : TSR_METRICS_BUCKETS;
}

void tsr_http_metrics_init(tsr_http_metrics *m)
{
    memset(m, 0, sizeof *m);
    pthread_mutex_init(&m->mu, NULL);
    hist_init(&m->ttft, ttft_bounds, N_OF(ttft_bounds));
    hist_init(&m->itl, itl_bounds, N_OF(itl_bounds));
    hist_init(&m->e2e, e2e_bounds, N_OF(e2e_bounds));
    m->t_start = tsr_service_now();
}

void tsr_http_metrics_destroy(tsr_http_metrics *m)
{
    pthread_mutex_destroy(&m->mu);
}

void tsr_http_metrics_request(tsr_http_metrics *m, tsr_http_route route, unsigned status)
{
    int k = status >= 500 ? 10 : 9;
    for (int i = 0; i < N_OF(codes); i++)
        if (codes[i] == status) k = i;
    if ((int)route < 0 || route >= TSR_ROUTE_COUNT) route = TSR_ROUTE_OTHER;
    pthread_mutex_lock(&m->mu);
    m->requests[route][k]++;
    pthread_mutex_unlock(&m->mu);
}

void tsr_http_metrics_disconnect(tsr_http_metrics *m)
{
    pthread_mutex_lock(&m->mu);
    m->client_disconnects++;
    pthread_mutex_unlock(&m->mu);
}

void tsr_http_metrics_stream(tsr_http_metrics *m)
{
    pthread_mutex_lock(&m->mu);
    m->streams_total++;
    pthread_mutex_unlock(&m->mu);
}

void tsr_http_metrics_stream_overflow(tsr_http_metrics *m)
{
    pthread_mutex_lock(&m->mu);
    m->stream_overflows++;
    pthread_mutex_unlock(&m->mu);
}

void tsr_http_metrics_header_timeouts(tsr_http_metrics *m, int n)
{
    pthread_mutex_lock(&m->mu);
    m->header_timeouts += (uint64_t)n;
    pthread_mutex_unlock(&m->mu);
}

static void observe(tsr_http_metrics *m, tsr_histogram *h, double x)
{
    if (!(x >= 0)) x = 0;
    pthread_mutex_lock(&m->mu);
    int b = 0;
    while (b < h->n_bounds && x > h->bounds[b]) b++;
    h->counts[b]++;
    h->count++;
    h->sum += x;
    pthread_mutex_unlock(&m->mu);
}

void tsr_http_metrics_ttft(tsr_http_metrics *m, double s)
{
    observe(m, &m->ttft, s);
}

void tsr_http_metrics_itl(tsr_http_metrics *m, double s)
{
    observe(m, &m->itl, s);
}

void tsr_http_metrics_e2e(tsr_http_metrics *m, double s)
{
    observe(m, &m->e2e, s);
}

/* --- text output ----------------------------------------------------------------------------------------- */

typedef struct buf {
    char *p;
    size_t len, cap;
    int oom;
} buf;

static void put(buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(buf *b, const char *fmt, ...)
{
    if (b->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->oom = 1;
            return;
        }
        if ((size_t)n < b->cap - b->len) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = (b->cap + (size_t)n + 1) * 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
}

static void head(buf *b, const char *name, const char *type, const char *help)
{
    put(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void metric_u(buf *b, const char *name, const char *type, const char *help, uint64_t v)
{
    head(b, name, type, help);
    put(b, "%s %llu\n", name, (unsigned long long)v);
}

static void metric_d(buf *b, const char *name, const char *type, const char *help, double v)
{
    head(b, name, type, help);
    put(b, "%s %.6f\n", name, v);
}

static void histogram(buf *b, const char *name, const char *help, const tsr_histogram *h)
{
    head(b, name, "histogram", help);
    uint64_t cum = 0;
    for (int i = 0; i < h->n_bounds; i++) {
        cum += h->counts[i];
        put(b, "%s_bucket{le=\"%g\"} %llu\n", name, h->bounds[i], (unsigned long long)cum);
    }
    cum += h->counts[h->n_bounds];
    put(b, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.6f\n%s_count %llu\n", name, (unsigned long long)cum, name, h->sum,
        name, (unsigned long long)h->count);
}

/* Each rank holding the model (rank 0 in one process, the workers under mpirun): its usage as the service last
 * asked it (runtime/service.h), one sample per rank. */
static void rank_metrics(buf *b, const tsr_service_stats *st)
{
    static const struct {
        const char *name, *type, *help;
    } fams[] = {
        {"tessera_rank_steps_total", "counter", "Steps a rank holding the model has run (as last asked)."},
        {"tessera_rank_peak_device_bytes", "gauge", "Most device memory a rank's backend has allocated (0: the CPU)."},
        {"tessera_rank_capacity_bytes", "gauge", "Device memory a rank was planned with (0: not limited)."},
        {"tessera_rank_peak_host_bytes", "gauge", "Peak resident memory of a rank's process."},
    };
    for (int f = 0; st->n_ranks > 0 && f < N_OF(fams); f++) {
        head(b, fams[f].name, fams[f].type, fams[f].help);
        for (int r = 0; r < st->n_ranks; r++) {
            const tsr_rank_usage *u = &st->ranks[r];
            const uint64_t v = f == 0 ? (uint64_t)u->steps : f == 1 ? u->peak_device : f == 2 ? u->capacity
                                                                                            : u->peak_host;
            put(b, "%s{rank=\"%d\"} %llu\n", fams[f].name, (int)u->rank, (unsigned long long)v);
        }
    }
}

static void service_metrics(buf *b, const tsr_service_stats *st)
{
    const tsr_sched_stats *s = &st->sched;
    metric_u(b, "tessera_requests_total", "counter", "Generation requests accepted by the service (one per choice).",
             st->requests_total);
    metric_u(b, "tessera_requests_finished_total", "counter", "Generation requests that had their final event.",
             st->requests_finished);
    metric_u(b, "tessera_requests_failed_total", "counter", "Generation requests that ended with an error.",
             st->requests_failed);
    metric_u(b, "tessera_requests_cancelled_total", "counter",
             "Generation requests cancelled (client gone, shutdown).", st->requests_cancelled);
    metric_u(b, "tessera_prompt_tokens_total", "counter", "Prompt tokens submitted.", st->tokens_in);
    metric_u(b, "tessera_generation_tokens_total", "counter", "Tokens generated.", st->tokens_out);
    metric_u(b, "tessera_queue_length", "gauge", "Sequences waiting to be scheduled.", (uint64_t)s->waiting);
    metric_u(b, "tessera_running_sequences", "gauge", "Sequences holding KV pages (prefilling or decoding).",
             (uint64_t)s->running);
    metric_u(b, "tessera_preemptions_total", "counter", "Sequences preempted because KV pages ran out.",
             (uint64_t)s->preempted_total);
    metric_u(b, "tessera_kv_pages_total", "gauge", "KV cache pages in the pool.", (uint64_t)s->pages_total);
    int used = s->pages_total - s->pages_free;
    metric_u(b, "tessera_kv_pages_used", "gauge", "KV cache pages referenced by sequences or kept for the prefix "
             "cache.", (uint64_t)(used > 0 ? used : 0));
    metric_u(b, "tessera_kv_pages_free", "gauge", "KV cache pages free.", (uint64_t)s->pages_free);
    metric_u(b, "tessera_kv_pages_cached", "gauge", "Unreferenced KV pages kept for the prefix cache.",
             (uint64_t)s->pages_cached);
    metric_u(b, "tessera_prefix_cache_lookups_total", "counter", "Prefix-cache lookups.", s->prefix_lookups);
    metric_u(b, "tessera_prefix_cache_hits_total", "counter", "Prefix-cache lookups that found cached pages.",
             s->prefix_hits);
    metric_u(b, "tessera_prefix_cache_hit_tokens_total", "counter", "Prompt tokens served from the prefix cache.",
             s->prefix_hit_tokens);
    metric_u(b, "tessera_prefix_cache_evictions_total", "counter", "Cached pages evicted.", s->prefix_evictions);
    metric_u(b, "tessera_prefill_tokens_total", "counter", "Tokens processed in prefill.", s->prefill_tokens);
    metric_u(b, "tessera_decode_tokens_total", "counter", "Tokens processed in decode.", s->decode_tokens);
    metric_u(b, "tessera_steps_total", "counter", "Steps run by the executor.", s->steps);
    metric_d(b, "tessera_step_seconds_total", "counter", "Time spent running steps.", st->busy_s);
    metric_d(b, "tessera_scheduler_seconds_total", "counter", "Time spent planning and committing steps.",
             st->sched_s);
    metric_u(b, "tessera_executor_broken", "gauge", "1 when the executor can no longer run steps.",
             (uint64_t)(st->executor_broken != 0));
    rank_metrics(b, st);
}

char *tsr_http_metrics_render(tsr_http_metrics *m, const tsr_service_stats *st, int ready, int open_requests,
                              unsigned open_connections, const char *model_name, size_t *len)
{
    buf b = {0};
    b.cap = 8192;
    if (!(b.p = malloc(b.cap))) return NULL;
    b.p[0] = 0;
    pthread_mutex_lock(&m->mu);
    head(&b, "tessera_info", "gauge", "The served model.");
    put(&b, "tessera_info{model=\"");
    for (const char *c = model_name ? model_name : ""; *c; c++) /* label value escaping */
        put(&b, *c == '"' ? "\\\"" : *c == '\\' ? "\\\\" : *c == '\n' ? "\\n" : "%c", *c);
    put(&b, "\"} 1\n");
    metric_u(&b, "tessera_ready", "gauge", "1 when the model is loaded and requests are served.",
             (uint64_t)(ready != 0));
    metric_d(&b, "tessera_uptime_seconds", "gauge", "Seconds since the server started.",
             tsr_service_now() - m->t_start);
    head(&b, "tessera_http_requests_total", "counter", "HTTP requests answered, by route and status code.");
    for (int r = 0; r < TSR_ROUTE_COUNT; r++)
        for (int k = 0; k < TSR_METRICS_CODES; k++)
            if (m->requests[r][k])
                put(&b, "tessera_http_requests_total{route=\"%s\",code=\"%s\"} %llu\n", route_names[r],
                    code_names[k], (unsigned long long)m->requests[r][k]);
    metric_u(&b, "tessera_http_open_requests", "gauge", "Generation requests waiting for or streaming tokens.",
             (uint64_t)(open_requests > 0 ? open_requests : 0));
    metric_u(&b, "tessera_http_streams_total", "counter", "Streaming (server-sent events) responses started.",
             m->streams_total);
    metric_u(&b, "tessera_http_client_disconnects_total", "counter",
             "Requests cancelled because the client disconnected before the end.", m->client_disconnects);
    metric_u(&b, "tessera_http_connections", "gauge", "Open TCP connections.", open_connections);
    metric_u(&b, "tessera_http_stream_overflows_total", "counter",
             "Streams cancelled and closed because their client stopped reading (--stream-backlog).",
             m->stream_overflows);
    metric_u(&b, "tessera_http_header_timeouts_total", "counter",
             "Connections closed for not sending a request's headers within --header-timeout.",
             m->header_timeouts);
    histogram(&b, "tessera_time_to_first_token_seconds", "Time from submission to the first generated token.",
              &m->ttft);
    histogram(&b, "tessera_inter_token_latency_seconds", "Time between consecutive generated tokens of a sequence.",
              &m->itl);
    histogram(&b, "tessera_request_duration_seconds", "Time from receiving a generation request to its last token.",
              &m->e2e);
    pthread_mutex_unlock(&m->mu);
    if (st) service_metrics(&b, st);
    if (b.oom) {
        free(b.p);
        return NULL;
    }
    *len = b.len;
    return b.p;
}

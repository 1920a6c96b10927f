/* Metrics of `tessera serve` in the Prometheus text format (version 0.0.4), served at GET /metrics.
 *
 * The gateway counts HTTP requests by route and status and records latency histograms (time to first token,
 * time between tokens, whole request); the service's own counters (requests, tokens in/out, queue length,
 * running sequences, KV pages, prefix-cache hits, step time) come from tsr_service_get_stats() at render time.
 *
 * Thread-safety: every function may be called from any thread (one mutex; recording is a few additions).
 * Ownership: the metrics live inside the gateway (init/destroy); render returns a malloc'd string. */
#ifndef TSR_LAUNCHER_HTTP_METRICS_H
#define TSR_LAUNCHER_HTTP_METRICS_H

#include "runtime/service.h"

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

typedef enum tsr_http_route {
    TSR_ROUTE_HEALTH = 0,
    TSR_ROUTE_METRICS,
    TSR_ROUTE_MODELS,
    TSR_ROUTE_COMPLETIONS,
    TSR_ROUTE_CHAT,
    TSR_ROUTE_OTHER,
    TSR_ROUTE_COUNT
} tsr_http_route;

#define TSR_METRICS_CODES 11 /* 200 400 401 404 405 413 429 500 503 other-4xx other-5xx */
#define TSR_METRICS_BUCKETS 16

typedef struct tsr_histogram {
    const double *bounds;       /* upper bounds, ascending; +Inf is implicit */
    int n_bounds;
    uint64_t counts[TSR_METRICS_BUCKETS + 1];
    uint64_t count;
    double sum;
} tsr_histogram;

typedef struct tsr_http_metrics {
    pthread_mutex_t mu;
    uint64_t requests[TSR_ROUTE_COUNT][TSR_METRICS_CODES];
    uint64_t client_disconnects;  /* requests cancelled because the client went away */
    uint64_t streams_total;
    uint64_t stream_overflows;    /* streams cancelled because their client stopped reading */
    uint64_t header_timeouts;     /* connections closed for not sending a request's headers in time */
    tsr_histogram ttft, itl, e2e;
    double t_start;
} tsr_http_metrics;

void tsr_http_metrics_init(tsr_http_metrics *m);
void tsr_http_metrics_destroy(tsr_http_metrics *m);

void tsr_http_metrics_request(tsr_http_metrics *m, tsr_http_route route, unsigned status);
void tsr_http_metrics_disconnect(tsr_http_metrics *m);
void tsr_http_metrics_stream(tsr_http_metrics *m);
void tsr_http_metrics_stream_overflow(tsr_http_metrics *m);
void tsr_http_metrics_header_timeouts(tsr_http_metrics *m, int n);
void tsr_http_metrics_ttft(tsr_http_metrics *m, double seconds);
void tsr_http_metrics_itl(tsr_http_metrics *m, double seconds);
void tsr_http_metrics_e2e(tsr_http_metrics *m, double seconds);

/* Renders every metric; st may be NULL (model loading or shutting down: the service's metrics are left out).
 * open_requests: HTTP requests waiting for or streaming tokens now; open_connections: TCP connections now.
 * Returns NULL when out of memory. */
char *tsr_http_metrics_render(tsr_http_metrics *m, const tsr_service_stats *st, int ready, int open_requests,
                              unsigned open_connections, const char *model_name, size_t *len);

#endif

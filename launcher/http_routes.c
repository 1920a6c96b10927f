/* The gateway's endpoints: /health, /metrics, /v1/models and the two generation routes, plus the JSON and
 * error replies they share.
 *
 * A generation request is parsed on the HTTP thread (tokenization and the chat template included), submitted
 * choice by choice to the service, and then either streamed (http_stream.c) or, without stream, answered once
 * every choice had its final event: the connection is suspended meanwhile and the service callback resumes it,
 * which calls the access handler again and lands here a second time. */
#include "launcher/http_internal.h"

#include <stdlib.h>
#include <string.h>

static enum MHD_Result reply_bytes(tsr_http *h, struct MHD_Connection *c, tsr_http_route route, unsigned status,
                                   char *data, size_t len, const char *type, const tsr_oai_error *e)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(len, data, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(data);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", type);
    if (status == 429 || status == 503) MHD_add_response_header(r, "Retry-After", "1");
    if (status == 401) MHD_add_response_header(r, "WWW-Authenticate", "Bearer");
    if (e && e->status == 405)
        MHD_add_response_header(r, "Allow", route == TSR_ROUTE_COMPLETIONS || route == TSR_ROUTE_CHAT ? "POST" : "GET");
    if (h->draining) MHD_add_response_header(r, "Connection", "close");
    enum MHD_Result ret = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    tsr_http_metrics_request(&h->metrics, route, status);
    return ret;
}

enum MHD_Result tsr_http_reply_json(tsr_http *h, struct MHD_Connection *c, tsr_http_route route, unsigned status,
                                    json_t *body)
{
    char *s = body ? json_dumps(body, JSON_COMPACT) : NULL;
    json_decref(body);
    if (!s) {
        static const char oom[] = "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\","
                                  "\"param\":null,\"code\":null}}";
        char *copy = malloc(sizeof oom);
        if (!copy) return MHD_NO;
        memcpy(copy, oom, sizeof oom);
        return reply_bytes(h, c, route, 500, copy, sizeof oom - 1, "application/json", NULL);
    }
    return reply_bytes(h, c, route, status, s, strlen(s), "application/json", NULL);
}

enum MHD_Result tsr_http_reply_error(tsr_http *h, struct MHD_Connection *c, tsr_http_route route,
                                     const tsr_oai_error *e)
{
    json_t *body = tsr_oai_error_json(e);
    char *s = body ? json_dumps(body, JSON_COMPACT) : NULL;
    json_decref(body);
    if (!s) return tsr_http_reply_json(h, c, route, 500, NULL);
    return reply_bytes(h, c, route, (unsigned)e->status, s, strlen(s), "application/json", e);
}

enum MHD_Result tsr_http_route_health(tsr_http *h, struct MHD_Connection *c)
{
    const char *state = "ok";
    unsigned status = 200;
    pthread_rwlock_rdlock(&h->svc_lock);
    if (h->draining) {
        state = "shutting down";
        status = 503;
    } else if (!h->ready) {
        state = "loading";
        status = 503;
    } else {
        tsr_service_stats st;
        tsr_service_get_stats(h->svc, &st);
        if (st.executor_broken) {
            state = "executor failed";
            status = 503;
        }
    }
    pthread_rwlock_unlock(&h->svc_lock);
    return tsr_http_reply_json(h, c, TSR_ROUTE_HEALTH, status, json_pack("{s:s}", "status", state));
}

enum MHD_Result tsr_http_route_metrics(tsr_http *h, struct MHD_Connection *c)
{
    tsr_service_stats st;
    int have = 0, ready;
    pthread_rwlock_rdlock(&h->svc_lock);
    ready = h->ready && !h->draining;
    if (ready) {
        tsr_service_get_stats(h->svc, &st);
        have = 1;
    }
    const char *name = h->model ? h->model->name : NULL;
    pthread_rwlock_unlock(&h->svc_lock);
    pthread_mutex_lock(&h->mu);
    int open = h->n_jobs;
    pthread_mutex_unlock(&h->mu);
    size_t len = 0;
    char *text = tsr_http_metrics_render(&h->metrics, have ? &st : NULL, ready, open, tsr_http_conns_open(h), name,
                                         &len);
    if (!text) return tsr_http_reply_json(h, c, TSR_ROUTE_METRICS, 500, NULL);
    return reply_bytes(h, c, TSR_ROUTE_METRICS, 200, text, len, "text/plain; version=0.0.4; charset=utf-8", NULL);
}

static int not_ready(tsr_http *h, tsr_oai_error *e)
{
    pthread_rwlock_rdlock(&h->svc_lock);
    int draining = h->draining, ready = h->ready;
    pthread_rwlock_unlock(&h->svc_lock);
    if (draining) tsr_oai_error_set(e, 503, NULL, "service_unavailable", "the server is shutting down");
    else if (!ready) tsr_oai_error_set(e, 503, NULL, "service_unavailable", "the model is loading");
    return draining || !ready;
}

enum MHD_Result tsr_http_route_models(tsr_http *h, struct MHD_Connection *c, const char *url)
{
    tsr_oai_error e;
    if (not_ready(h, &e)) return tsr_http_reply_error(h, c, TSR_ROUTE_MODELS, &e);
    json_t *list = tsr_oai_models_json(h->model);
    if (!strcmp(url, "/v1/models") || !strcmp(url, "/v1/models/"))
        return tsr_http_reply_json(h, c, TSR_ROUTE_MODELS, 200, list);
    const char *name = url + strlen("/v1/models/");
    if (strcmp(name, h->model->name)) {
        json_decref(list);
        tsr_oai_error_set(&e, 404, "model", "model_not_found", "The model `%.200s` does not exist.", name);
        return tsr_http_reply_error(h, c, TSR_ROUTE_MODELS, &e);
    }
    json_t *one = json_incref(json_array_get(json_object_get(list, "data"), 0));
    json_decref(list);
    return tsr_http_reply_json(h, c, TSR_ROUTE_MODELS, 200, one);
}

/* The non-streaming answer once every choice is final and processed. */
static enum MHD_Result finish_plain(tsr_http *h, struct MHD_Connection *c, http_job *j, tsr_http_route route)
{
    tsr_oai_error e;
    const char *err = tsr_oai_result_error(j->res);
    if (err) {
        tsr_oai_error_set(&e, 500, NULL, NULL, "generation failed: %s", err);
        return tsr_http_reply_error(h, c, route, &e);
    }
    pthread_mutex_lock(&j->mu);
    int shut_down = j->n_aborted && !j->cancelled;
    pthread_mutex_unlock(&j->mu);
    if (shut_down) {
        tsr_oai_error_set(&e, 503, NULL, "service_unavailable",
                          "the request was cancelled before it finished (the server is shutting down)");
        return tsr_http_reply_error(h, c, route, &e);
    }
    return tsr_http_reply_json(h, c, route, 200, tsr_oai_response(j->res));
}

enum MHD_Result tsr_http_route_generate(tsr_http *h, struct MHD_Connection *c, http_conn *cc)
{
    tsr_http_route route = cc->route;
    tsr_oai_error e;
    if (!cc->job) {
        if (not_ready(h, &e)) return tsr_http_reply_error(h, c, route, &e);
        tsr_oai_request *rq = NULL;
        tsr_oai_kind kind = route == TSR_ROUTE_CHAT ? TSR_OAI_CHAT : TSR_OAI_COMPLETIONS;
        tsr_status st = tsr_oai_parse_bytes(kind, cc->body ? cc->body : "", cc->len, h->model, &rq, &e);
        free(cc->body);
        cc->body = NULL;
        cc->len = cc->cap = 0;
        if (st != TSR_OK) return tsr_http_reply_error(h, c, route, &e);
        if (tsr_http_job_start(h, rq, c, &cc->job, &e) != TSR_OK) return tsr_http_reply_error(h, c, route, &e);
        if (rq->stream) return tsr_http_stream_reply(h, c, cc->job);
    }
    http_job *j = cc->job;
    for (;;) {
        pthread_mutex_lock(&j->mu);
        http_event *list = tsr_http_job_take(j);
        if (!list && !tsr_oai_result_done(j->res)) {
            if (h->stopping) {
                pthread_mutex_unlock(&j->mu);
                return MHD_NO;
            }
            /* wait for the remaining choices: the service callback resumes us */
            j->suspended = 1;
            MHD_suspend_connection(c);
            pthread_mutex_unlock(&j->mu);
            return MHD_YES;
        }
        pthread_mutex_unlock(&j->mu);
        if (!list) return finish_plain(h, c, j, route);
        if (tsr_http_job_process(j, list) != TSR_OK) {
            pthread_mutex_lock(&j->mu);
            tsr_http_job_cancel(j);
            pthread_mutex_unlock(&j->mu);
            tsr_oai_error_set(&e, 500, NULL, NULL, "out of memory");
            return tsr_http_reply_error(h, c, route, &e);
        }
    }
}

/* Who may call the gateway: API keys ("Authorization: Bearer KEY" on /v1/..., checked in constant time) and, on a
 * loopback address, only pages and programs that name it as such (DNS rebinding).
 *
 * Each accepted key is kept in a zero-padded slot of HTTP_KEY_MAX bytes. A presented key is copied into a slot
 * of the same shape and compared with every accepted key over all HTTP_KEY_MAX bytes, lengths folded in with
 * the bytes, without stopping at the first difference or the first match: the time taken depends only on the
 * number of keys, not on which key matched, how long the keys are, or how many leading bytes were right (the
 * presented key's own length is the client's to know). Keys and presented values are wiped before their memory
 * is freed or reused, and no message, log line or metric ever contains them.
 *
 * Binding to 127.0.0.1 keeps other machines out, but not a web page in a local browser: a page of evil.example
 * can have that name resolve to 127.0.0.1 (DNS rebinding) and then read the server's answers as its own. So when
 * the gateway listens on a loopback address, a request must name a loopback host in its Host header (localhost,
 * *.localhost, 127.x.x.x or [::1], any port), and an Origin header, when a browser sends one, must name one too;
 * anything else is 403. --allow-any-host turns this off (a reverse proxy that passes its public Host on). */
#include "launcher/http_internal.h"

#include <arpa/inet.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

struct http_key {
    unsigned char bytes[HTTP_KEY_MAX];
    size_t len;
};

tsr_status tsr_http_keys_init(tsr_http *h, const char *const *keys, int n)
{
    h->keys = NULL;
    h->n_keys = 0;
    if (n <= 0) return TSR_OK;
    for (int i = 0; i < n; i++) {
        size_t len = strlen(keys[i]);
        if (len == 0 || len > HTTP_KEY_MAX)
            return tsr_fail(TSR_ERR_ARG, "API keys must be 1 to %d bytes long", HTTP_KEY_MAX);
    }
    if (!(h->keys = calloc((size_t)n, sizeof *h->keys))) return tsr_fail(TSR_ERR_NOMEM, "out of memory");
    for (int i = 0; i < n; i++) {
        h->keys[i].len = strlen(keys[i]);
        memcpy(h->keys[i].bytes, keys[i], h->keys[i].len);
    }
    h->n_keys = n;
    return TSR_OK;
}

void tsr_http_keys_free(tsr_http *h)
{
    if (h->keys) explicit_bzero(h->keys, (size_t)h->n_keys * sizeof *h->keys);
    free(h->keys);
    h->keys = NULL;
    h->n_keys = 0;
}

/* Nonzero when the presented slot differs from the key; always reads every byte of both. */
static unsigned key_differs(const http_key *k, const http_key *given)
{
    unsigned diff = (unsigned)((k->len ^ given->len) != 0);
    for (size_t i = 0; i < HTTP_KEY_MAX; i++) diff |= (unsigned)(k->bytes[i] ^ given->bytes[i]);
    return diff;
}

static int key_accepted(const tsr_http *h, const char *v)
{
    http_key given = {.len = strnlen(v, HTTP_KEY_MAX + 1)};
    /* a presented key longer than any accepted one keeps len HTTP_KEY_MAX + 1, which matches nothing */
    memcpy(given.bytes, v, given.len < HTTP_KEY_MAX ? given.len : HTTP_KEY_MAX);
    volatile unsigned matched = 0;
    for (int i = 0; i < h->n_keys; i++) matched |= (unsigned)(key_differs(&h->keys[i], &given) == 0);
    explicit_bzero(&given, sizeof given);
    return matched != 0;
}

int tsr_http_authorized(tsr_http *h, struct MHD_Connection *c, tsr_oai_error *e)
{
    if (h->n_keys == 0) return 1;
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
    if (key_accepted(h, v)) return 1;
    tsr_oai_error_set(e, 401, NULL, "invalid_api_key", "Incorrect API key provided.");
    return 0;
}

/* --- loopback hosts -------------------------------------------------------------------------------------- */

/* The host part of "host", "host:port", "[v6]" or "[v6]:port" is a loopback name or address. */
static int loopback_host(const char *v, size_t n)
{
    char host[256];
    size_t len;
    if (n && v[0] == '[') {
        const char *end = memchr(v, ']', n);
        if (!end) return 0;
        v++;
        len = (size_t)(end - v);
    } else {
        const char *colon = memchr(v, ':', n);
        len = colon ? (size_t)(colon - v) : n;
    }
    if (len == 0 || len >= sizeof host) return 0;
    memcpy(host, v, len);
    host[len] = 0;
    if (host[len - 1] == '.') host[--len] = 0; /* "localhost." */
    if (!strcasecmp(host, "localhost") || (len > 10 && !strcasecmp(host + len - 10, ".localhost"))) return 1;
    unsigned char a[16];
    if (inet_pton(AF_INET, host, a) == 1) return a[0] == 127;
    if (inet_pton(AF_INET6, host, a) == 1) {
        static const unsigned char one[16] = {[15] = 1}, mapped[12] = {[10] = 0xff, [11] = 0xff};
        return !memcmp(a, one, 16) || (!memcmp(a, mapped, 12) && a[12] == 127);
    }
    return 0;
}

int tsr_http_addr_is_loopback(const struct sockaddr *sa)
{
    if (sa->sa_family == AF_INET)
        return (ntohl(((const struct sockaddr_in *)(const void *)sa)->sin_addr.s_addr) >> 24) == 127;
    if (sa->sa_family == AF_INET6) {
        const struct in6_addr *a = &((const struct sockaddr_in6 *)(const void *)sa)->sin6_addr;
        return IN6_IS_ADDR_LOOPBACK(a) || (IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127);
    }
    return 0;
}

int tsr_http_host_allowed(tsr_http *h, struct MHD_Connection *c, tsr_oai_error *e)
{
    if (!h->loopback_only) return 1;
    const char *host = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_HOST);
    const char *origin = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin");
    /* HTTP/1.0 without Host comes from no browser; HTTP/1.1 without one is refused by libmicrohttpd */
    if (host && !loopback_host(host, strlen(host))) {
        tsr_oai_error_set(e, 403, NULL, "forbidden_host", "This server listens on a loopback address and answers "
                          "only requests for localhost, 127.0.0.1 or [::1] (start it with --allow-any-host to "
                          "change that).");
        return 0;
    }
    const char *sep = origin ? strstr(origin, "://") : NULL;
    if (origin) {
        const char *o = sep ? sep + 3 : "";
        size_t n = strcspn(o, "/");
        if (!sep || !loopback_host(o, n)) {
            tsr_oai_error_set(e, 403, NULL, "forbidden_origin", "Requests from web pages are accepted only from "
                              "localhost origins on a server that listens on a loopback address.");
            return 0;
        }
    }
    return 1;
}

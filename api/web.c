/* web.c — the dashboard: GET/HEAD /, /jobs/{id} and /compare answer the app shell (api/web/
 * index.html; its script routes by location), /assets/NAME the other files of api/web/ and
 * Debian's Chart.js. Every byte is in the binary (scripts/embed-web → $(BUILD)/gen/web_assets.c):
 * nothing to install, no network at run time.
 *
 * Each answer has its type, an ETag (a hash of the bytes, so a new build changes it), Cache-Control
 * no-cache (the browser revalidates: a 304 with no body while the binary is the same) and the
 * security headers: a Content-Security-Policy that allows only this origin's scripts, styles and
 * connections (no inline script or style), no framing, nosniff, no Referer. */
#include "internal.h"

#include <string.h>

#define CSP "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; " \
            "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"

static const tq_web_asset *find(const char *path) {
    for (int i = 0; i < tq_web_nassets; i++)
        if (!strcmp(tq_web_assets[i].path, path)) return &tq_web_assets[i];
    return NULL;
}

/* If-None-Match: "*" or a list of (possibly weak) tags, one of which is ours */
static int not_modified(tq_ctx *c, const char *etag) {
    const char *inm = MHD_lookup_connection_value(c->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_IF_NONE_MATCH);
    if (!inm) return 0;
    size_t el = strlen(etag);
    for (const char *p = inm; *p;) {
        while (*p == ' ' || *p == '\t' || *p == ',') p++;
        if (!*p) break;
        if (*p == '*') return 1;
        if (!strncmp(p, "W/", 2)) p += 2;
        size_t l = strcspn(p, ",");
        while (l && (p[l - 1] == ' ' || p[l - 1] == '\t')) l--;
        if (l == el && !memcmp(p, etag, el)) return 1;
        p += strcspn(p, ",");
    }
    return 0;
}

static enum MHD_Result serve(tq_ctx *c, const tq_web_asset *a) {
    int nm = not_modified(c, a->etag);
    /* a 304 is made from the same bytes: libmicrohttpd sends no body with it, and its
     * Content-Length is then the 200's, as RFC 9110 (8.6) asks */
    struct MHD_Response *r = MHD_create_response_from_buffer(a->len, (void *)a->data, MHD_RESPMEM_PERSISTENT);
    if (!r) return MHD_NO;
    if (!nm) MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, a->ctype);
    MHD_add_response_header(r, MHD_HTTP_HEADER_ETAG, a->etag);
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    MHD_add_response_header(r, "Content-Security-Policy", CSP);
    MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
    MHD_add_response_header(r, "Referrer-Policy", "no-referrer");
    MHD_add_response_header(r, "X-Frame-Options", "DENY");
    enum MHD_Result ret = MHD_queue_response(c->conn, nm ? MHD_HTTP_NOT_MODIFIED : MHD_HTTP_OK, r);
    MHD_destroy_response(r);
    return ret;
}

/* /, /jobs/{id}, /compare: the app shell; the query (/compare?ids=…) is the script's to read */
enum MHD_Result tq_h_web_page(tq_ctx *c) {
    const tq_web_asset *a = find("/");
    if (!a) return tq_send_error(c, MHD_HTTP_NOT_FOUND, "not_found", NULL, "this build has no dashboard");
    return serve(c, a);
}

/* /assets/NAME; a query (a cache buster) is ignored */
enum MHD_Result tq_h_web_asset(tq_ctx *c) {
    const tq_web_asset *a = c->url && strcmp(c->url, "/") ? find(c->url) : NULL;
    if (!a) return tq_send_error(c, MHD_HTTP_NOT_FOUND, "not_found", NULL, "no file %.200s", c->url ? c->url : "");
    return serve(c, a);
}

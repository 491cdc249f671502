/* utf8.c — strict UTF-8 validation and U+FFFD sanitizing (see utf8.h). */
#include "utf8.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char REPLACEMENT[] = "\xEF\xBF\xBD";   /* U+FFFD */

/* Table 3-7 of the Unicode standard: the lead byte fixes the length and the range of the
 * second byte; every later byte is 80..BF. */
int tq_utf8_decode(const unsigned char *s, size_t n, uint32_t *cp) {
    if (n == 0) return 0;
    unsigned b0 = s[0];
    uint32_t c;
    int len;
    unsigned lo = 0x80, hi = 0xBF;   /* range of the second byte */
    if (b0 < 0x80) {
        if (cp) *cp = b0;
        return 1;
    } else if (b0 >= 0xC2 && b0 <= 0xDF) {
        len = 2; c = b0 & 0x1F;
    } else if (b0 >= 0xE0 && b0 <= 0xEF) {
        len = 3; c = b0 & 0x0F;
        if (b0 == 0xE0) lo = 0xA0;        /* no overlongs */
        else if (b0 == 0xED) hi = 0x9F;   /* no surrogates */
    } else if (b0 >= 0xF0 && b0 <= 0xF4) {
        len = 4; c = b0 & 0x07;
        if (b0 == 0xF0) lo = 0x90;        /* no overlongs */
        else if (b0 == 0xF4) hi = 0x8F;   /* nothing above U+10FFFF */
    } else {
        return -1;   /* 80..C1 (continuation, overlong 2-byte lead), F5..FF */
    }
    for (int i = 1; i < len; i++) {
        if ((size_t)i >= n) return -i;   /* truncated: the valid prefix is one subpart */
        unsigned b = s[i];
        unsigned l = i == 1 ? lo : 0x80, h = i == 1 ? hi : 0xBF;
        if (b < l || b > h) return -i;
        c = (c << 6) | (b & 0x3F);
    }
    if (cp) *cp = c;
    return len;
}

static int is_control(uint32_t c) {
    return c < 0x20 || c == 0x7F || (c >= 0x80 && c <= 0x9F);
}

int tq_utf8_check(const char *s, size_t n, unsigned flags, size_t *at, uint32_t *cp) {
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        uint32_t c = 0;
        int k;
        if (p[i] >= 0x20 && p[i] < 0x7F) { i++; continue; }   /* printable ASCII: the fast path */
        k = tq_utf8_decode(p + i, n - i, &c);
        if (k < 0) {
            if (at) *at = i;
            if (cp) *cp = p[i];
            return TQ_UTF8_INVALID;
        }
        if (!(flags & TQ_UTF8_ALLOW_CONTROL) && is_control(c)) {
            if (at) *at = i;
            if (cp) *cp = c;
            return TQ_UTF8_CONTROL;
        }
        i += (size_t)k;
    }
    return TQ_UTF8_OK;
}

int tq_utf8_explain(const char *s, size_t n, unsigned flags, char *why, size_t whylen) {
    size_t at = 0;
    uint32_t cp = 0;
    int rc = tq_utf8_check(s, n, flags, &at, &cp);
    if (why && whylen) {
        if (rc == TQ_UTF8_INVALID)
            snprintf(why, whylen, "is not valid UTF-8 (byte 0x%02X at offset %zu)", (unsigned)cp, at);
        else if (rc == TQ_UTF8_CONTROL)
            snprintf(why, whylen, "contains a control character (U+%04X at offset %zu)", (unsigned)cp, at);
        else
            why[0] = 0;
    }
    return rc;
}

int tq_utf8_valid(const char *s) {
    return !s || tq_utf8_check(s, strlen(s), TQ_UTF8_ALLOW_CONTROL, NULL, NULL) == TQ_UTF8_OK;
}

char *tq_utf8_sanitize(const char *s) {
    if (!s) return NULL;
    size_t n = strlen(s);
    /* at worst every byte becomes one U+FFFD (3 bytes) */
    if (n > (SIZE_MAX - 1) / 3) return NULL;
    char *out = malloc(tq_utf8_valid(s) ? n + 1 : 3 * n + 1);
    if (!out) return NULL;
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0, o = 0;
    while (i < n) {
        int k = tq_utf8_decode(p + i, n - i, NULL);
        if (k > 0) {
            memcpy(out + o, s + i, (size_t)k);
            o += (size_t)k;
            i += (size_t)k;
        } else {
            memcpy(out + o, REPLACEMENT, 3);
            o += 3;
            i += (size_t)-k;
        }
    }
    out[o] = 0;
    return out;
}

size_t tq_utf8_sanitize_to(char *dst, size_t cap, const char *src, size_t n, int escape_controls) {
    size_t o = 0;
    if (cap == 0) return 0;
    const unsigned char *p = (const unsigned char *)src;
    size_t len = src ? n : 0, i = 0;
    while (i < len) {
        uint32_t c = 0;
        int k = tq_utf8_decode(p + i, len - i, &c);
        char esc[8];
        const char *piece;
        size_t pl;
        if (k < 0 || (k == 1 && c == 0 && !escape_controls)) {   /* a NUL would end dst early */
            piece = REPLACEMENT; pl = 3; i += k < 0 ? (size_t)-k : 1;
        } else if (escape_controls && (c < 0x20 || c == 0x7F)) {
            snprintf(esc, sizeof esc, "\\x%02X", (unsigned)c);
            piece = esc; pl = 4; i += (size_t)k;
        } else {
            piece = src + i; pl = (size_t)k; i += (size_t)k;
        }
        if (o + pl + 1 > cap) break;
        memcpy(dst + o, piece, pl);
        o += pl;
    }
    dst[o] = 0;
    return o;
}

/* Makes *slot valid UTF-8 (a malloc'd string cJSON owns): 0, or -1 on OOM. */
static int mend(char **slot) {
    if (!*slot || tq_utf8_valid(*slot)) return 0;
    char *fixed = tq_utf8_sanitize(*slot);
    if (!fixed) return -1;
    free(*slot);
    *slot = fixed;
    return 0;
}

static int sanitize_item(cJSON *item, int depth) {
    int rc = 0;
    if (!(item->type & cJSON_StringIsConst) && mend(&item->string)) rc = -1;
    if (cJSON_IsString(item) && !(item->type & cJSON_IsReference) && mend(&item->valuestring)) rc = -1;
    if (depth < 100000)   /* cJSON's parser stops at 1000 levels; trees built in code are shallow */
        for (cJSON *c = item->child; c; c = c->next)
            if (sanitize_item(c, depth + 1)) rc = -1;
    return rc;
}

int tq_utf8_sanitize_json(struct cJSON *root) {
    return root ? sanitize_item(root, 0) : 0;
}

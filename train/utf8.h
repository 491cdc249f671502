/* utf8.h — the one UTF-8 validator for every string that enters the daemon (JSON strings of the
 * job spec, the request path, query parameters, echoed headers) and the one sanitizer for every
 * string that leaves it as JSON (stored text from an older database).
 *
 * Strict UTF-8 (RFC 3629, Unicode 15 §3.9 table 3-7): no overlong forms, no surrogates
 * (U+D800…U+DFFF), nothing above U+10FFFF, no truncated sequence. "Control characters" are NUL,
 * the other C0 controls (U+0001…U+001F), DEL (U+007F) and the C1 controls (U+0080…U+009F).
 * A bad sequence is replaced, in sanitized output, by one U+FFFD per maximal subpart (the
 * "substitution of maximal subparts" practice of Unicode §3.9, as browsers and Python do).
 *
 * Pure functions on caller-owned buffers: no globals, thread-safe, never abort. Only
 * tq_utf8_sanitize allocates (malloc; the caller frees). */
#ifndef TQ_UTF8_H
#define TQ_UTF8_H
#include <stddef.h>
#include <stdint.h>

enum { TQ_UTF8_OK = 0, TQ_UTF8_INVALID = 1, TQ_UTF8_CONTROL = 2 };

/* flags of tq_utf8_check / tq_utf8_explain */
#define TQ_UTF8_ALLOW_CONTROL 1u   /* control characters are fine (only the encoding is checked) */

/* The sequence at s (n > 0 bytes available): > 0, its length (1…4) with *cp its code point;
 * < 0, minus the length (1…3) of the maximal invalid subpart that one U+FFFD replaces.
 * 0 only when n == 0. cp may be NULL. */
int tq_utf8_decode(const unsigned char *s, size_t n, uint32_t *cp);

/* Checks the n bytes at s: TQ_UTF8_OK, TQ_UTF8_INVALID (not UTF-8) or TQ_UTF8_CONTROL (a control
 * character, unless flags has TQ_UTF8_ALLOW_CONTROL). *at (may be NULL) receives the byte offset
 * of the first fault; *cp (may be NULL) the control's code point or the invalid lead byte. */
int tq_utf8_check(const char *s, size_t n, unsigned flags, size_t *at, uint32_t *cp);

/* tq_utf8_check, plus a short reason for a message in why[whylen] ("" when OK), e.g.
 * "is not valid UTF-8 (byte 0xFF at offset 0)" or "contains a control character (U+000A at
 * offset 3)": meant to follow a field name. */
int tq_utf8_explain(const char *s, size_t n, unsigned flags, char *why, size_t whylen);

/* Is s (NUL-terminated) valid UTF-8 (controls allowed)? NULL counts as valid. */
int tq_utf8_valid(const char *s);

/* A malloc'd copy of NUL-terminated s with every bad sequence replaced by U+FFFD; NULL when s is
 * NULL or on OOM. Valid input is copied unchanged. */
char *tq_utf8_sanitize(const char *s);

/* The n bytes at src (NUL bytes included: pass strlen/strnlen for a C string) into dst[cap]
 * (cap >= 1), always NUL-terminated: bad sequences become U+FFFD; with `escape_controls`, C0
 * controls (NUL included) and DEL become the text "\xNN", without it a NUL becomes U+FFFD. Never
 * splits a character: what does not fit is dropped. Returns the bytes written (without the
 * terminator). dst and src must not overlap. */
size_t tq_utf8_sanitize_to(char *dst, size_t cap, const char *src, size_t n, int escape_controls);

/* Every string value and member name in a cJSON tree (a `cJSON *`), made valid UTF-8 in place
 * (tq_utf8_sanitize; the replaced strings are freed with free(): cJSON's default hooks). 0, or -1
 * on OOM (the tree is then still whole, some strings maybe unmended). */
struct cJSON;
int tq_utf8_sanitize_json(struct cJSON *root);

#endif

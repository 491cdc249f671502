/* util.h — invariants and small helpers shared by the engine.
 * TQ_ASSERT is for broken invariants (bugs), never for bad input: it names the expression,
 * file and line, aborts, and never compiles out. Expected failures return a status. */
#ifndef TQ_UTIL_H
#define TQ_UTIL_H
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <time.h>

#define TQ_ASSERT(e) do { if (!(e)) { fprintf(stderr, "trainq: assertion failed: %s (%s:%d)\n", \
                                             #e, __FILE__, __LINE__); abort(); } } while (0)

static inline int64_t tq_unix_ms(void) {
    struct timespec ts; clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}
static inline double tq_mono_ms(void) {
    struct timespec ts; clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}
#endif

/* rng.h — seeded, stateless-friendly random numbers (splitmix64 for seeding, xoshiro256**
 * for streams). Every stream is derived from (seed, purpose, index), so a resumed run draws
 * exactly the numbers an uninterrupted one would. Header-only, no globals, any thread. */
#ifndef TQ_RNG_H
#define TQ_RNG_H
#include <stdint.h>
#include <math.h>

typedef struct { uint64_t s[4]; } tq_rng;

static inline uint64_t tq_splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
/* A stream for (seed, purpose, index): purposes are small constants (TQ_RNG_*). */
static inline tq_rng tq_rng_make(uint64_t seed, uint64_t purpose, uint64_t index) {
    uint64_t x = seed ^ (purpose * 0xd1b54a32d192ed03ull) ^ (index * 0x8cb92ba72f3d8dd7ull);
    tq_rng r;
    for (int i = 0; i < 4; i++) r.s[i] = tq_splitmix64(&x);
    return r;
}
enum { TQ_RNG_INIT = 1, TQ_RNG_SHUFFLE = 2, TQ_RNG_AUG = 3, TQ_RNG_SYNTH = 4 };

static inline uint64_t tq_rng_u64(tq_rng *r) {
    uint64_t *s = r->s;
    uint64_t res = ((s[1] * 5) << 7 | (s[1] * 5) >> 57) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0]; s[3] ^= s[1]; s[1] ^= s[2]; s[0] ^= s[3]; s[2] ^= t;
    s[3] = (s[3] << 45) | (s[3] >> 19);
    return res;
}
/* uniform in [0,1) with 53 bits */
static inline double tq_rng_uniform(tq_rng *r) { return (double)(tq_rng_u64(r) >> 11) * 0x1.0p-53; }
/* uniform integer in [0, n) (Lemire's multiply; bias < 2^-32 for n < 2^32) */
static inline uint32_t tq_rng_below(tq_rng *r, uint32_t n) {
    return (uint32_t)(((tq_rng_u64(r) >> 32) * (uint64_t)n) >> 32);
}
static inline double tq_rng_normal(tq_rng *r) {
    double u1 = tq_rng_uniform(r), u2 = tq_rng_uniform(r);
    if (u1 < 1e-300) u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}
#endif

// shard.c: the shard convention of shard.h.
#include "shard.h"

#include "check.h"

void shard_range(size_t n, int parts, int i, size_t *begin, size_t *count) {
    LAB_CHECK(parts >= 1 && i >= 0 && i < parts, "shard_range: shard %d of %d parts does not exist "
              "(need parts >= 1 and 0 <= i < parts)", i, parts);
    size_t base = n / (size_t)parts, extra = n % (size_t)parts, ii = (size_t)i;
    *begin = ii * base + (ii < extra ? ii : extra);
    *count = base + (ii < extra ? 1 : 0);
}

size_t shard_begin(size_t n, int parts, int i) {
    size_t b, c;
    shard_range(n, parts, i, &b, &c);
    return b;
}

size_t shard_count(size_t n, int parts, int i) {
    size_t b, c;
    shard_range(n, parts, i, &b, &c);
    return c;
}

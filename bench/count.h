/* count.h - the interface of libsopcount.so (bench/count.c), the shim that counts the driver
 * calls sop makes. sop-bench reaches these three functions with dlsym. */
#ifndef SOP_BENCH_COUNT_H
#define SOP_BENCH_COUNT_H

/* How many entry points are counted; the name (base name, as in cuda.h's documentation) and
 * the calls so far of entry i. */
unsigned sop_count_entries(void);
const char *sop_count_name(unsigned i);
unsigned long sop_count_read(unsigned i);

#endif /* SOP_BENCH_COUNT_H */

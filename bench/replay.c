/* replay.c - allocation traces replayed against both sides.
 *
 * A trace is RMM's logging_resource_adaptor CSV (Thread,Time,Action,Pointer,Size,Stream; see
 * bench/traces/README.md). Stream is either a handle in hex, as RMM logs it (distinct handles
 * become distinct streams, in order of first appearance), or a decimal stream index (the
 * stream-aware variant, which bench/traces/torch_to_csv.py writes). The whole trace is read and
 * resolved first (each free names the allocation it ends, by index), so the timed replay only
 * calls the allocator. Rows are replayed from one thread, in their global order; RMM's replay
 * runs one thread per logged thread in the same order, which costs hand-offs that would
 * measure the harness rather than the allocator. Time is not replayed; no kernel runs.
 *
 * Besides time per operation and reserved-high, one untimed pass per side samples reserved
 * memory as the trace goes (replay-<trace>.csv under --out, plotted by bench/plot.py).
 */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

#define REPLAY_STREAMS 32
#define SERIES_POINTS 400

struct op {
	size_t size;   /* of the allocation made or ended */
	uint32_t slot; /* the allocation's index in the trace */
	uint16_t stream;
	uint8_t is_free;
};

struct trace {
	char name[64];
	struct op *ops;
	size_t n_ops, cap;
	size_t n_slots;
	int n_streams;
	size_t peak;    /* most requested bytes live at once */
	size_t dropped; /* failures logged, size 0, frees of unknown pointers */
	size_t wrapped; /* rows whose stream index was folded into REPLAY_STREAMS */
};

/* ---- Reading --------------------------------------------------------------------------------- */

/* Pointer -> slot of the live allocation at that address: linear probing, key 0 is empty. */
struct map {
	uint64_t *key;
	uint32_t *val;
	size_t mask, n;
};

static uint64_t
map_hash(uint64_t k)
{
	k ^= k >> 33;
	k *= 0xff51afd7ed558ccdull;
	return k ^ (k >> 33);
}

static void map_put(struct map *m, uint64_t key, uint32_t val);

static void
map_grow(struct map *m)
{
	struct map old = *m;
	size_t i, cap = old.key ? (old.mask + 1) * 2 : 1024;

	m->key = calloc(cap, sizeof *m->key);
	m->val = calloc(cap, sizeof *m->val);
	if (!m->key || !m->val) {
		fprintf(stderr, "sop-bench: out of host memory\n");
		exit(1);
	}
	m->mask = cap - 1;
	m->n = 0;
	for (i = 0; old.key && i <= old.mask; i++)
		if (old.key[i])
			map_put(m, old.key[i], old.val[i]);
	free(old.key);
	free(old.val);
}

/* A pointer allocated again before its free was logged: the new allocation wins. */
static void
map_put(struct map *m, uint64_t key, uint32_t val)
{
	size_t i;

	if (!m->key || (m->n + 1) * 2 > m->mask + 1)
		map_grow(m);
	for (i = map_hash(key) & m->mask; m->key[i] && m->key[i] != key; i = (i + 1) & m->mask)
		;
	if (!m->key[i])
		m->n++;
	m->key[i] = key;
	m->val[i] = val;
}

/* Remove key; false if it is not there. Backward-shift deletion keeps probing chains whole. */
static bool
map_take(struct map *m, uint64_t key, uint32_t *val)
{
	size_t i, j;

	if (!m->key)
		return false;
	for (i = map_hash(key) & m->mask; m->key[i] != key; i = (i + 1) & m->mask)
		if (!m->key[i])
			return false;
	*val = m->val[i];
	for (j = i;;) {
		size_t home;

		j = (j + 1) & m->mask;
		if (!m->key[j])
			break;
		home = map_hash(m->key[j]) & m->mask;
		/* The entry at j may fill the hole at i unless its home lies in (i, j]. */
		if (i <= j ? (home <= i || home > j) : (home <= i && home > j)) {
			m->key[i] = m->key[j];
			m->val[i] = m->val[j];
			i = j;
		}
	}
	m->key[i] = 0;
	m->n--;
	return true;
}

static void
trace_push(struct trace *t, const struct op *op)
{
	if (t->n_ops == t->cap) {
		size_t cap = t->cap ? t->cap * 2 : 4096;
		struct op *ops = realloc(t->ops, cap * sizeof *ops);

		if (!ops) {
			fprintf(stderr, "sop-bench: out of host memory\n");
			exit(1);
		}
		t->ops = ops;
		t->cap = cap;
	}
	t->ops[t->n_ops++] = *op;
}

static char *
trim(char *s)
{
	char *e;

	while (isspace((unsigned char)*s))
		s++;
	e = s + strlen(s);
	while (e > s && isspace((unsigned char)e[-1]))
		*--e = '\0';
	return s;
}

/* Load a trace; false (after a message) if it cannot be read or parsed. */
static bool
trace_load(struct trace *t, const char *path)
{
	uint64_t handles[REPLAY_STREAMS];
	int n_handles = 0;
	struct map map = {NULL, NULL, 0, 0};
	size_t *slot_size = NULL, slot_cap = 0, live = 0;
	char *line = NULL;
	size_t len = 0, lineno = 0;
	bool header_done = false, ok = false;
	const char *base;
	char *dot;
	FILE *f;

	memset(t, 0, sizeof *t);
	base = strrchr(path, '/');
	snprintf(t->name, sizeof t->name, "%s", base ? base + 1 : path);
	dot = strrchr(t->name, '.');
	if (dot && !strcmp(dot, ".csv"))
		*dot = '\0';
	f = fopen(path, "r");
	if (!f) {
		fprintf(stderr, "sop-bench: cannot read trace %s: %s\n", path, strerror(errno));
		return false;
	}
	while (getline(&line, &len, f) > 0) {
		char *field[6], *s = trim(line), *save = NULL, *action;
		uint64_t ptr, size, stream;
		struct op op;
		int n = 0;

		lineno++;
		if (!*s || *s == '#')
			continue;
		if (!header_done) {
			header_done = true;
			if (!isdigit((unsigned char)*s))
				continue; /* Thread,Time,Action,Pointer,Size,Stream */
		}
		for (char *tok = strtok_r(s, ",", &save); tok && n < 6;
		     tok = strtok_r(NULL, ",", &save))
			field[n++] = trim(tok);
		if (n < 6) {
			fprintf(stderr, "sop-bench: %s:%zu: expected 6 fields\n", path, lineno);
			goto out;
		}
		action = field[2];
		ptr = strcmp(field[3], "(nil)") ? strtoull(field[3], NULL, 0) : 0;
		size = strtoull(field[4], NULL, 10);
		if (!strncmp(field[5], "0x", 2) || !strncmp(field[5], "0X", 2) ||
		    !strcmp(field[5], "(nil)")) {
			uint64_t h = strcmp(field[5], "(nil)") ? strtoull(field[5], NULL, 16) : 0;
			int i;

			for (i = 0; i < n_handles && handles[i] != h; i++)
				;
			if (i == n_handles && n_handles < REPLAY_STREAMS)
				handles[n_handles++] = h;
			stream = (uint64_t)i;
		} else {
			stream = strtoull(field[5], NULL, 10);
		}
		if (stream >= REPLAY_STREAMS) {
			stream %= REPLAY_STREAMS;
			t->wrapped++;
		}
		memset(&op, 0, sizeof op);
		op.stream = (uint16_t)stream;
		if (!strcmp(action, "allocate failure")) {
			t->dropped++;
		} else if (!strcmp(action, "allocate")) {
			if (!size || !ptr) {
				t->dropped++;
				continue;
			}
			if (t->n_slots == UINT32_MAX) {
				fprintf(stderr, "sop-bench: %s: too many allocations\n", path);
				goto out;
			}
			if (t->n_slots == slot_cap) {
				size_t cap = slot_cap ? slot_cap * 2 : 4096;
				size_t *ss = realloc(slot_size, cap * sizeof *ss);

				if (!ss) {
					fprintf(stderr, "sop-bench: out of host memory\n");
					exit(1);
				}
				slot_size = ss;
				slot_cap = cap;
			}
			op.slot = (uint32_t)t->n_slots++;
			op.size = (size_t)size;
			slot_size[op.slot] = op.size;
			map_put(&map, ptr, op.slot);
			trace_push(t, &op);
			live += op.size;
			if (live > t->peak)
				t->peak = live;
		} else if (!strcmp(action, "free")) {
			uint32_t slot;

			if (!map_take(&map, ptr, &slot)) {
				t->dropped++; /* allocated before the log began */
				continue;
			}
			op.slot = slot;
			op.size = slot_size[slot];
			op.is_free = 1;
			trace_push(t, &op);
			live -= op.size;
		} else {
			fprintf(stderr, "sop-bench: %s:%zu: unknown action '%s'\n", path, lineno,
				action);
			goto out;
		}
		if ((int)op.stream + 1 > t->n_streams)
			t->n_streams = op.stream + 1;
	}
	ok = t->n_ops > 0;
	if (!ok)
		fprintf(stderr, "sop-bench: %s: no allocations\n", path);
out:
	free(line);
	free(map.key);
	free(map.val);
	free(slot_size);
	fclose(f);
	if (!ok)
		free(t->ops);
	return ok;
}

/* ---- Replaying ------------------------------------------------------------------------------ */

struct sample {
	size_t op;
	uint64_t reserved;
	size_t requested;
};

/* Replay every op; OOM leaves the slot empty (its free is skipped). Returns the failures.
 * With samples, reserved memory is read every `every` ops. */
static long
replay_run(const struct side *sd, const struct trace *t, void **slots, const CUstream *st,
	   struct sample *samples, size_t every, size_t *n_samples)
{
	size_t i, requested = 0;
	long failed = 0;

	for (i = 0; i < t->n_ops; i++) {
		const struct op *op = &t->ops[i];

		if (!op->is_free) {
			CUresult r = side_alloc(sd, &slots[op->slot], op->size, st[op->stream]);

			if (r == CUDA_ERROR_OUT_OF_MEMORY) {
				slots[op->slot] = NULL;
				failed++;
			} else {
				CHECK(r);
				requested += op->size;
			}
		} else if (slots[op->slot]) {
			CHECK(side_free(sd, slots[op->slot], st[op->stream]));
			slots[op->slot] = NULL;
			requested -= op->size;
		}
		if (samples && (i % every == 0 || i + 1 == t->n_ops)) {
			struct sample *sm = &samples[(*n_samples)++];

			sm->op = i + 1;
			sm->reserved = side_attr(sd, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT);
			sm->requested = requested;
		}
	}
	return failed;
}

/* Free what the trace left live, outside the timed region. */
static void
replay_leftovers(const struct side *sd, const struct trace *t, void **slots, const CUstream *st)
{
	size_t i;

	for (i = 0; i < t->n_slots; i++)
		if (slots[i]) {
			CHECK(side_free(sd, slots[i], st[0]));
			slots[i] = NULL;
		}
	CHECK(side_ctx_sync(sd));
}

/* The trace again on a fresh sop pool with compaction on: what the setting does to a real
 * program's memory and time (a case of its own; the driver's pools have no such setting). */
static void
replay_compacting(struct trace *t, void **slots, CUstream *st, const char *label, bool tight)
{
	struct metric *time_m, *high_m, *ratio_m;
	char cas[128];
	struct side sd;
	uint64_t high;
	long failed;
	int r;

	if (!side_open(&sd, SIDE_SOP, UINT64_MAX, 0))
		return;
	CHECK(sop_pool_set_compaction(sd.sop, 1));
	snprintf(cas, sizeof cas, "%s, sop compacting", label);
	time_m = metric_new("replay", "", cas, "time", "ns/op", (double)t->n_ops, false);
	high_m = metric_new("replay", "", cas, "reserved-high", "MiB", (double)t->n_ops, false);
	ratio_m = metric_new("replay", "", cas, "reserved-high / peak live", "x", (double)t->n_ops,
			     false);
	failed = replay_run(&sd, t, slots, st, NULL, 1, NULL);
	replay_leftovers(&sd, t, slots, st);
	high = side_attr(&sd, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH);
	metric_add(high_m, SIDE_SOP, (double)high / (double)MiB);
	metric_add(ratio_m, SIDE_SOP, (double)high / (double)(t->peak ? t->peak : 1));
	if (tight)
		side_trim(&sd, 0);
	for (r = 0; r < opts.reps; r++) {
		struct span sp;

		span_begin(&sp, SIDE_SOP);
		failed += replay_run(&sd, t, slots, st, NULL, 1, NULL);
		metric_add(time_m, SIDE_SOP, span_end(&sp, time_m, (double)t->n_ops) / (double)t->n_ops);
		replay_leftovers(&sd, t, slots, st);
		if (tight)
			side_trim(&sd, 0);
	}
	metric_done(time_m);
	metric_done(high_m);
	metric_done(ratio_m);
	if (failed)
		note("replay %s: %ld allocations failed on sop compacting (out of memory) and were "
		     "skipped",
		     t->name, failed);
	side_close(&sd);
}

static void
replay_trace(const char *path)
{
	struct trace t;
	struct side sd[N_SIDES];
	struct sample *samples[N_SIDES] = {NULL};
	size_t n_samples[N_SIDES] = {0}, every;
	long failed[N_SIDES] = {0};
	CUstream st[REPLAY_STREAMS];
	struct metric *time_m, *high_m, *ratio_m;
	void **slots;
	char label[96];
	bool tight;
	int n, i, r;

	if (!trace_load(&t, path)) {
		note("replay: trace %s could not be read", path);
		return;
	}
	every = t.n_ops / SERIES_POINTS + 1;
	slots = calloc(t.n_slots ? t.n_slots : 1, sizeof *slots);
	if (!slots) {
		fprintf(stderr, "sop-bench: out of host memory\n");
		exit(1);
	}
	for (i = 0; i < t.n_streams; i++)
		st[i] = stream_new();
	snprintf(label, sizeof label, "%s (%zu ops, %d stream%s)", t.name, t.n_ops, t.n_streams,
		 t.n_streams > 1 ? "s" : "");
	time_m = metric_new("replay", "", label, "time", "ns/op", (double)t.n_ops, false);
	high_m = metric_new("replay", "", label, "reserved-high", "MiB", (double)t.n_ops, false);
	ratio_m = metric_new("replay", "", label, "reserved-high / peak live", "x", (double)t.n_ops,
			     false);
	if (t.dropped)
		note("replay %s: %zu rows skipped (logged failures, size 0, frees of pointers "
		     "allocated before the log began)",
		     t.name, t.dropped);
	if (t.wrapped)
		note("replay %s: %zu rows on stream indices past %d were folded onto the first %d",
		     t.name, t.wrapped, REPLAY_STREAMS, REPLAY_STREAMS);

	n = sides_open(sd, SIDE_BIT(SIDE_SOP) | SIDE_BIT(SIDE_POOL), UINT64_MAX, 0);
	/* Both pools stay warm side by side; a trace too large for that gets its pools trimmed
	 * after each run instead, and its times then include growing them again. */
	tight = n > 1 && t.peak > env.free_mem / 3;
	if (tight)
		note("replay %s: peak %zu MiB is too large to keep both pools warm: pools are "
		     "trimmed after each run, so times include growth",
		     t.name, t.peak / MiB);
	/* First pass on fresh pools, untimed: reserved memory as the trace goes, and the
	 * watermark a cold start reaches. */
	for (i = 0; i < n; i++) {
		enum side_kind k = sd[i].kind;
		uint64_t high;

		samples[k] = calloc(t.n_ops / every + 2, sizeof *samples[k]);
		if (!samples[k]) {
			fprintf(stderr, "sop-bench: out of host memory\n");
			exit(1);
		}
		failed[k] += replay_run(&sd[i], &t, slots, st, samples[k], every, &n_samples[k]);
		replay_leftovers(&sd[i], &t, slots, st);
		high = side_attr(&sd[i], CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH);
		metric_add(high_m, k, (double)high / (double)MiB);
		metric_add(ratio_m, k, (double)high / (double)(t.peak ? t.peak : 1));
		if (tight)
			side_trim(&sd[i], 0);
	}
	for (r = 0; r < opts.reps; r++) {
		for (i = 0; i < n; i++) {
			struct span sp;

			span_begin(&sp, sd[i].kind);
			failed[sd[i].kind] += replay_run(&sd[i], &t, slots, st, NULL, 1, NULL);
			metric_add(time_m, sd[i].kind,
				   span_end(&sp, time_m, (double)t.n_ops) / (double)t.n_ops);
			replay_leftovers(&sd[i], &t, slots, st);
			if (tight)
				side_trim(&sd[i], 0);
		}
	}
	metric_done(time_m);
	metric_done(high_m);
	metric_done(ratio_m);
	for (i = 0; i < n; i++)
		if (failed[sd[i].kind])
			note("replay %s: %ld allocations failed on %s (out of memory) and were "
			     "skipped",
			     t.name, failed[sd[i].kind], side_names[sd[i].kind]);

	if (opts.out) {
		char file[4096];
		FILE *f;

		snprintf(file, sizeof file, "%s/replay-%s.csv", opts.out, t.name);
		f = fopen(file, "w");
		if (!f) {
			fprintf(stderr, "sop-bench: cannot write %s: %s\n", file, strerror(errno));
			exit(1);
		}
		fprintf(f, "op,side,reserved_mib,requested_mib\n");
		for (i = 0; i < N_SIDES; i++) {
			size_t j;

			for (j = 0; j < n_samples[i]; j++)
				fprintf(f, "%zu,%s,%.3f,%.3f\n", samples[i][j].op, side_names[i],
					(double)samples[i][j].reserved / (double)MiB,
					(double)samples[i][j].requested / (double)MiB);
		}
		fclose(f);
	}
	sides_close(sd, n);
	if (side_allowed(SIDE_SOP) && budget_left("replay"))
		replay_compacting(&t, slots, st, label, tight);
	for (i = 0; i < t.n_streams; i++)
		stream_free(st[i]);
	for (i = 0; i < N_SIDES; i++)
		free(samples[i]);
	free(slots);
	free(t.ops);
}

static int
csv_filter(const struct dirent *d)
{
	size_t n = strlen(d->d_name);

	return n > 4 && !strcmp(d->d_name + n - 4, ".csv");
}

void
wl_replay(void)
{
	int i;

	describe(
	    "Each trace replayed from one thread in its global order, on as many streams as it "
	    "names, without kernels; frees are matched to allocations before timing. The first "
	    "pass, on fresh pools and untimed, samples reserved memory (replay-<trace>.csv) and "
	    "gives reserved-high; the timed runs follow on the warm pools. Peak live is the "
	    "most requested bytes live at once in the trace.");
	if (opts.n_traces) {
		for (i = 0; i < opts.n_traces && budget_left("replay"); i++)
			replay_trace(opts.traces[i]);
		return;
	}
#ifdef SOP_BENCH_TRACE_DIR
	{
		struct dirent **list;
		int n = scandir(SOP_BENCH_TRACE_DIR, &list, csv_filter, alphasort);
		char path[4096];

		if (n < 0) {
			note(
			    "replay: no traces (cannot read the traces folder); give --trace FILE");
			return;
		}
		for (i = 0; i < n; i++) {
			snprintf(path, sizeof path, "%s/%s", SOP_BENCH_TRACE_DIR, list[i]->d_name);
			if (budget_left("replay"))
				replay_trace(path);
			free(list[i]);
		}
		free(list);
		if (!n)
			note("replay: the traces folder holds no .csv file; give --trace FILE");
	}
#else
	(void)csv_filter;
	note("replay: no traces folder built in; give --trace FILE");
#endif
}

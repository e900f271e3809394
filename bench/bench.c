/* bench.c - sop-bench's main: the command line, the results and the reports.
 *
 * Every workload records metrics (struct metric): one measured quantity of one case, with a
 * value per repetition for each side. At the end of each workload the reports are written again
 * (results.md and results.csv under --out), so that a run cut short still leaves what it
 * measured; the Markdown report also goes to stdout at the end. Ratios always read "> 1: sop is
 * better": driver / sop for times and bytes, sop / driver for rates.
 */
#include <errno.h>
#include <getopt.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "bench.h"

struct bench_opts opts;

struct metric {
	char workload[16];
	char group[32];
	char cas[128];
	char name[40];
	char unit[24];
	double x;
	bool higher;
	double v[N_SIDES][BENCH_MAX_REPS];
	int n[N_SIDES];
	/* sop's driver calls in its timed runs, and the operations they covered */
	unsigned long long calls[BENCH_COUNT_MAX];
	double ops;
};

struct summary {
	double med, min, max;
	int n;
};

#define MAX_METRICS 1024
#define MAX_NOTES 64

static struct metric *metrics[MAX_METRICS];
static int n_metrics;
static char *notes[MAX_NOTES];
static int n_notes;
static double t_start;
static char command[512];
static char started[32];
static bool budget_hit;
static int current = -1; /* the workload running */

/* ---- Workloads ------------------------------------------------------------------------------ */

struct workload {
	const char *name;
	const char *title;
	void (*run)(void);
};

static const struct workload workloads[] = {
    {"pair", "same-stream alloc+free pair", wl_pair},
    {"batch", "k allocations then k frees, one stream", wl_batch},
    {"random", "RMM random_allocations: 73% allocations, uniform sizes, capped live bytes",
     wl_random},
    {"threads",
     "host threads, one stream each, random sizes up to 1 MiB, 256 live blocks each; then "
     "threads that start cold, arrive one by one, or take a stream per task",
     wl_threads},
    {"streams", "RMM multi_stream_allocations: allocate, launch, free on S streams", wl_streams},
    {"handoff", "allocate and use on stream A, free on stream B after an event", wl_handoff},
    {"fragmentation", "log-uniform sizes 1 B..128 MiB, up to 8 GiB live, fresh pools",
     wl_fragmentation},
    {"growth", "first allocation on a fresh pool; regrowth with release threshold 0", wl_growth},
    {"host",
     "pinned host memory: alloc+free pairs, copy bandwidth, a staging pipeline; sop's host pool "
     "against cuMemHostAlloc, the driver's host pool and an event cache",
     wl_host},
    {"ipc",
     "a pool shared with a second process: export and import of the pool and of pointers, the "
     "importer's frees; sop's IPC pool against the driver's",
     wl_ipc},
    {"replay", "allocation traces replayed in their global order", wl_replay},
};
#define N_WORKLOADS (sizeof workloads / sizeof *workloads)

static char descriptions[N_WORKLOADS][2048];

/* ---- Small helpers --------------------------------------------------------------------------- */

double
now_ns(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

long
scaled(long full, long quick, long smoke)
{
	long base = opts.level == LEVEL_FULL ? full : opts.level == LEVEL_QUICK ? quick : smoke;
	double v = (double)base * opts.scale;

	return v < 1 ? 1 : (long)v;
}

struct list
list_pick(const struct list *given, const size_t *full, int n_full, const size_t *quick,
	  int n_quick, const size_t *smoke, int n_smoke)
{
	struct list l;
	const size_t *src = opts.level == LEVEL_FULL    ? full
			    : opts.level == LEVEL_QUICK ? quick
							: smoke;
	int n = opts.level == LEVEL_FULL ? n_full : opts.level == LEVEL_QUICK ? n_quick : n_smoke;

	if (given->n)
		return *given;
	memset(&l, 0, sizeof l);
	for (l.n = 0; l.n < n && l.n < BENCH_MAX_LIST; l.n++)
		l.v[l.n] = src[l.n];
	return l;
}

bool
budget_left(const char *what)
{
	if ((now_ns() - t_start) / 1e9 < opts.budget_s)
		return true;
	if (!budget_hit)
		note("time budget of %.0f s spent: %s and everything after it skipped",
		     opts.budget_s, what);
	budget_hit = true;
	return false;
}

const char *
fmt_size(char *buf, size_t len, size_t n)
{
	if (n >= GiB && n % GiB == 0)
		snprintf(buf, len, "%zu GiB", n / GiB);
	else if (n >= MiB && n % MiB == 0)
		snprintf(buf, len, "%zu MiB", n / MiB);
	else if (n >= KiB && n % KiB == 0)
		snprintf(buf, len, "%zu KiB", n / KiB);
	else
		snprintf(buf, len, "%zu B", n);
	return buf;
}

void
describe(const char *fmt, ...)
{
	va_list ap;

	if (current < 0)
		return;
	va_start(ap, fmt);
	vsnprintf(descriptions[current], sizeof descriptions[current], fmt, ap);
	va_end(ap);
}

void
note(const char *fmt, ...)
{
	char buf[512];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(buf, sizeof buf, fmt, ap);
	va_end(ap);
	fprintf(stderr, "sop-bench: note: %s\n", buf);
	if (n_notes < MAX_NOTES)
		notes[n_notes++] = strdup(buf);
}

void
progress(const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "[%6.1f s] ", (now_ns() - t_start) / 1e9);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
}

/* ---- Metrics ------------------------------------------------------------------------------- */

struct metric *
metric_new(const char *workload, const char *group, const char *cas, const char *name,
	   const char *unit, double x, bool higher_better)
{
	struct metric *m;

	if (n_metrics == MAX_METRICS) {
		fprintf(stderr, "sop-bench: more than %d metrics\n", MAX_METRICS);
		exit(1);
	}
	m = calloc(1, sizeof *m);
	if (!m) {
		fprintf(stderr, "sop-bench: out of host memory\n");
		exit(1);
	}
	snprintf(m->workload, sizeof m->workload, "%s", workload);
	snprintf(m->group, sizeof m->group, "%s", group);
	snprintf(m->cas, sizeof m->cas, "%s", cas);
	snprintf(m->name, sizeof m->name, "%s", name);
	snprintf(m->unit, sizeof m->unit, "%s", unit);
	m->x = x;
	m->higher = higher_better;
	metrics[n_metrics++] = m;
	return m;
}

void
metric_add(struct metric *m, enum side_kind side, double v)
{
	if (m->n[side] < BENCH_MAX_REPS)
		m->v[side][m->n[side]++] = v;
}

void
metric_calls(struct metric *m, const struct calls *before, const struct calls *after, double ops)
{
	unsigned i, n = calls_entries();

	if (!m || !env.counting)
		return;
	for (i = 0; i < n; i++)
		m->calls[i] += after->n[i] - before->n[i];
	m->ops += ops;
}

void
span_begin(struct span *sp, enum side_kind kind)
{
	sp->kind = kind;
	if (kind == SIDE_SOP)
		calls_read(&sp->c0);
	sp->t0 = now_ns();
}

double
span_end(struct span *sp, struct metric *m, double ops)
{
	double t = now_ns() - sp->t0;
	struct calls c1;

	if (sp->kind == SIDE_SOP && m && env.counting) {
		calls_read(&c1);
		metric_calls(m, &sp->c0, &c1, ops);
	}
	return t;
}

static int
cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

static struct summary
summarize(const struct metric *m, enum side_kind k)
{
	struct summary s = {0, 0, 0, m->n[k]};
	double v[BENCH_MAX_REPS];

	if (!s.n)
		return s;
	memcpy(v, m->v[k], sizeof *v * (size_t)s.n);
	qsort(v, (size_t)s.n, sizeof *v, cmp_double);
	s.med = s.n % 2 ? v[s.n / 2] : (v[s.n / 2 - 1] + v[s.n / 2]) / 2;
	s.min = v[0];
	s.max = v[s.n - 1];
	return s;
}

/* > 1: sop is better. 0 when either side is missing or zero. */
static double
ratio(const struct metric *m, enum side_kind k)
{
	struct summary s = summarize(m, SIDE_SOP), d = summarize(m, k);

	if (!s.n || !d.n || s.med <= 0 || d.med <= 0)
		return 0;
	return m->higher ? s.med / d.med : d.med / s.med;
}

static double
calls_per_op(const struct metric *m)
{
	unsigned long long total = 0;
	unsigned i, n = calls_entries();

	if (!env.counting || m->ops <= 0)
		return -1;
	for (i = 0; i < n; i++)
		total += m->calls[i];
	return (double)total / m->ops;
}

/* "cuEventRecord=0.016 cuEventQuery=0.002": the entries sop called, most called first. */
static void
calls_detail(const struct metric *m, char *buf, size_t len, int most)
{
	unsigned i, n = calls_entries();
	bool used[BENCH_COUNT_MAX] = {false};
	size_t at = 0;
	int shown = 0;

	buf[0] = '\0';
	if (!env.counting || m->ops <= 0)
		return;
	for (;;) {
		unsigned best = n;

		for (i = 0; i < n; i++)
			if (!used[i] && m->calls[i] && (best == n || m->calls[i] > m->calls[best]))
				best = i;
		if (best == n || at + 64 > len || shown++ == most)
			break;
		used[best] = true;
		at += (size_t)snprintf(buf + at, len - at, "%s%s=%.3g", at ? " " : "",
				       calls_name(best), (double)m->calls[best] / m->ops);
	}
}

/* Three significant digits, without an exponent for everyday magnitudes. */
static const char *
num(char *buf, size_t len, double v)
{
	double a = v < 0 ? -v : v;

	if (a >= 1000 || a == 0)
		snprintf(buf, len, "%.0f", v);
	else if (a >= 100)
		snprintf(buf, len, "%.1f", v);
	else if (a >= 10)
		snprintf(buf, len, "%.2f", v);
	else if (a >= 0.01)
		snprintf(buf, len, "%.3f", v);
	else
		snprintf(buf, len, "%.3g", v);
	return buf;
}

void
metric_done(const struct metric *m)
{
	char line[512], a[32];
	size_t at = 0;
	int k;

	for (k = 0; k < N_SIDES; k++) {
		struct summary s = summarize(m, (enum side_kind)k);
		double r = ratio(m, (enum side_kind)k);

		if (!s.n)
			continue;
		at += (size_t)snprintf(line + at, sizeof line - at, "%s%s %s", at ? " | " : "",
				       side_names[k], num(a, sizeof a, s.med));
		if (k != SIDE_SOP && k != SIDE_IDEAL && r > 0)
			at += (size_t)snprintf(line + at, sizeof line - at, " (%.2fx)", r);
		if (at >= sizeof line)
			break;
	}
	progress("%s %s%s%s %s [%s]: %s", m->workload, m->group, *m->group ? ", " : "", m->cas,
		 m->name, m->unit, at ? line : "no data");
}

/* ---- Reports ------------------------------------------------------------------------------- */

static size_t
workload_index(const char *name)
{
	size_t i;

	for (i = 0; i < N_WORKLOADS; i++)
		if (!strcmp(workloads[i].name, name))
			break;
	return i;
}

static void
cell(FILE *f, const struct metric *m, enum side_kind k)
{
	struct summary s = summarize(m, k);
	char a[32], b[32], c[32];

	if (!s.n)
		fputs(" - |", f);
	else if (s.n == 1 || s.min == s.max)
		fprintf(f, " %s |", num(a, sizeof a, s.med));
	else
		fprintf(f, " %s (%s-%s) |", num(a, sizeof a, s.med), num(b, sizeof b, s.min),
			num(c, sizeof c, s.max));
}

/* Where sop called the driver at all, which entry points, per operation. */
static void
write_calls(FILE *f)
{
	char detail[512];
	bool head = false;
	int i;

	for (i = 0; i < n_metrics; i++) {
		const struct metric *m = metrics[i];

		if (calls_per_op(m) <= 0)
			continue;
		if (!head)
			fprintf(
			    f,
			    "\n## sop's driver calls per operation, by entry point\n\n"
			    "| workload | case | calls/op | entry points |\n|---|---|---|---|\n");
		head = true;
		calls_detail(m, detail, sizeof detail, 6);
		fprintf(f, "| %s | %s%s%s | %.3g | %s |\n", m->workload, m->group,
			*m->group ? ", " : "", m->cas, calls_per_op(m), detail);
	}
}

static void
write_md(FILE *f)
{
	char buf[32];
	int i, j, k;

	fprintf(f, "# sop-bench results\n\n");
	fprintf(f, "- device: %s, driver %d.%d%s\n", env.device, env.driver_version / 1000,
		env.driver_version % 1000 / 10,
		env.simulated ? " (SIMULATED driver: no timing here means anything)" : "");
	fprintf(f, "- started: %s UTC; command: `%s`\n", started, command);
	fprintf(f,
		"- %d repetitions, sides interleaved in each (sop, then driver, then "
		"driver-default, then no-alloc where a workload has it); cells are median "
		"(min-max) over repetitions\n",
		opts.reps);
	fprintf(f,
		"- driver: `cuMemAllocFromPoolAsync` on a pool from `cuMemPoolCreate`; "
		"driver-default: `cuMemAllocAsync` on the device's default pool; release threshold "
		"UINT64_MAX on every pool unless a workload says otherwise\n");
	fprintf(f, "- ratio > 1 means sop is better: driver time / sop time, sop rate / driver "
		   "rate, driver bytes / sop bytes\n");
	if (env.counting)
		fprintf(
		    f,
		    "- sop calls/op: driver calls sop made per operation in its timed runs "
		    "(sop_driver_calls); the driver's own pool cannot be counted from outside\n");
	else
		fprintf(f, "- sop calls/op: not available (sop_driver_calls failed)\n");
	for (i = 0; i < n_notes; i++)
		fprintf(f, "- note: %s\n", notes[i]);

	for (i = 0; i < n_metrics; i = j) {
		const char *wl = metrics[i]->workload;
		bool has[N_SIDES] = {false};

		for (j = i; j < n_metrics && !strcmp(metrics[j]->workload, wl); j++)
			for (k = 0; k < N_SIDES; k++)
				has[k] |= metrics[j]->n[k] > 0;
		k = (int)workload_index(wl);
		if (k < (int)N_WORKLOADS) {
			fprintf(f, "\n## %s: %s\n\n", wl, workloads[k].title);
			if (*descriptions[k])
				fprintf(f, "%s\n\n", descriptions[k]);
		}
		fprintf(f, "| case | metric |");
		for (k = 0; k < N_SIDES; k++) {
			if (!has[k])
				continue;
			fprintf(f, " %s |", side_names[k]);
			if (k != SIDE_SOP && k != SIDE_IDEAL && has[SIDE_SOP])
				fprintf(f, " ratio |");
		}
		fprintf(f, " sop calls/op |\n|---|---|");
		for (k = 0; k < N_SIDES; k++) {
			if (!has[k])
				continue;
			fprintf(f, "---|");
			if (k != SIDE_SOP && k != SIDE_IDEAL && has[SIDE_SOP])
				fprintf(f, "---|");
		}
		fprintf(f, "---|\n");
		for (; i < j; i++) {
			const struct metric *m = metrics[i];
			double c = calls_per_op(m);

			fprintf(f, "| %s%s%s | %s (%s, %s) |", m->group, *m->group ? ", " : "",
				m->cas, m->name, m->unit,
				m->higher ? "higher is better" : "lower is better");
			for (k = 0; k < N_SIDES; k++) {
				double r;

				if (!has[k])
					continue;
				cell(f, m, (enum side_kind)k);
				if (k == SIDE_SOP || k == SIDE_IDEAL || !has[SIDE_SOP])
					continue;
				r = ratio(m, (enum side_kind)k);
				if (r > 0)
					fprintf(f, " %.2fx |", r);
				else
					fputs(" - |", f);
			}
			fprintf(f, " %s |\n", c >= 0 ? num(buf, sizeof buf, c) : "-");
		}
	}
	write_calls(f);
}

static void
csv_text(FILE *f, const char *s)
{
	fprintf(f, "\"%s\",", s);
}

static void
write_csv(FILE *f)
{
	char detail[512];
	int i, k;

	fprintf(f, "workload,group,case,x,metric,unit,better,side,n,median,min,max,ratio,"
		   "sop_calls_per_op,sop_calls_detail\n");
	for (i = 0; i < n_metrics; i++) {
		const struct metric *m = metrics[i];

		calls_detail(m, detail, sizeof detail, BENCH_COUNT_MAX);
		for (k = 0; k < N_SIDES; k++) {
			struct summary s = summarize(m, (enum side_kind)k);
			double r = ratio(m, (enum side_kind)k);
			double c = calls_per_op(m);

			if (!s.n)
				continue;
			csv_text(f, m->workload);
			csv_text(f, m->group);
			csv_text(f, m->cas);
			fprintf(f, "%.17g,", m->x);
			csv_text(f, m->name);
			csv_text(f, m->unit);
			csv_text(f, m->higher ? "higher" : "lower");
			csv_text(f, side_names[k]);
			fprintf(f, "%d,%.6g,%.6g,%.6g,", s.n, s.med, s.min, s.max);
			if (k != SIDE_SOP && k != SIDE_IDEAL && r > 0)
				fprintf(f, "%.4g,", r);
			else
				fputs(",", f);
			if (k == SIDE_SOP && c >= 0)
				fprintf(f, "%.4g,\"%s\"\n", c, detail);
			else
				fputs(",\"\"\n", f);
		}
	}
}

static void
write_reports(void)
{
	char path[4096];
	FILE *f;

	if (!opts.out)
		return;
	snprintf(path, sizeof path, "%s/results.md", opts.out);
	f = fopen(path, "w");
	if (!f) {
		fprintf(stderr, "sop-bench: cannot write %s: %s\n", path, strerror(errno));
		exit(1);
	}
	write_md(f);
	fclose(f);
	snprintf(path, sizeof path, "%s/results.csv", opts.out);
	f = fopen(path, "w");
	if (!f) {
		fprintf(stderr, "sop-bench: cannot write %s: %s\n", path, strerror(errno));
		exit(1);
	}
	write_csv(f);
	fclose(f);
}

/* ---- Command line -------------------------------------------------------------------------- */

static void
usage(FILE *f)
{
	size_t i;

	fprintf(f, "usage: sop-bench [options]\n"
		   "  --workload LIST  comma-separated workloads, or all (default):\n");
	for (i = 0; i < N_WORKLOADS; i++)
		fprintf(f, "                     %-13s %s\n", workloads[i].name,
			workloads[i].title);
	fprintf(
	    f, "  --reps N         repetitions per side (default 7; --quick 5; --smoke 2)\n"
	       "  --quick          smaller cases and counts (a first look in well under a minute)\n"
	       "  --smoke          every workload very briefly (a test, not a measurement)\n"
	       "  --scale F        multiply every iteration count by F\n"
	       "  --sides LIST     sop,driver,driver-default (default: all the machine has)\n"
	       "  --sizes LIST     pair sizes in bytes (K, M, G suffixes)\n"
	       "  --batch LIST     batch k values\n"
	       "  --max-mib LIST   random: largest size in MiB\n"
	       "  --threads LIST   threads: host thread counts\n"
	       "  --streams LIST   streams: stream counts\n"
	       "  --trace FILE     replay this trace (repeatable; default: bench/traces/*.csv)\n"
	       "  --out DIR        write results.md, results.csv and replay series there\n"
	       "  --budget SEC     stop starting new cases after SEC seconds (default 420)\n");
}

static size_t
parse_size(const char *s)
{
	char *end;
	unsigned long long v = strtoull(s, &end, 10);

	switch (*end) {
	case 'K':
	case 'k':
		v <<= 10;
		end++;
		break;
	case 'M':
	case 'm':
		v <<= 20;
		end++;
		break;
	case 'G':
	case 'g':
		v <<= 30;
		end++;
		break;
	default:
		break;
	}
	if (end == s || *end || v == 0) {
		fprintf(stderr, "sop-bench: bad number '%s'\n", s);
		exit(2);
	}
	return (size_t)v;
}

static void
parse_list(struct list *l, const char *arg)
{
	char buf[512], *tok, *save = NULL;

	snprintf(buf, sizeof buf, "%s", arg);
	l->n = 0;
	for (tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		if (l->n == BENCH_MAX_LIST) {
			fprintf(stderr, "sop-bench: at most %d values in a list\n", BENCH_MAX_LIST);
			exit(2);
		}
		l->v[l->n++] = parse_size(tok);
	}
}

static unsigned
parse_workloads(const char *arg)
{
	char buf[512], *tok, *save = NULL;
	unsigned mask = 0;
	size_t i;

	snprintf(buf, sizeof buf, "%s", arg);
	for (tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		if (!strcmp(tok, "all")) {
			mask = (1u << N_WORKLOADS) - 1;
			continue;
		}
		for (i = 0; i < N_WORKLOADS; i++)
			if (!strcmp(tok, workloads[i].name))
				break;
		if (i == N_WORKLOADS) {
			fprintf(stderr, "sop-bench: unknown workload '%s'\n", tok);
			usage(stderr);
			exit(2);
		}
		mask |= 1u << i;
	}
	return mask;
}

static unsigned
parse_sides(const char *arg)
{
	char buf[256], *tok, *save = NULL;
	/* The host workload's own baselines are not named: always on. */
	unsigned mask = SIDE_BIT(SIDE_SOP) | SIDE_BIT(SIDE_IDEAL) | SIDE_BIT(SIDE_HOSTALLOC) |
			SIDE_BIT(SIDE_EVCACHE) | SIDE_BIT(SIDE_PAGEABLE);
	int k;

	snprintf(buf, sizeof buf, "%s", arg);
	for (tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		for (k = 0; k < SIDE_IDEAL; k++)
			if (!strcmp(tok, side_names[k]))
				break;
		if (k == SIDE_IDEAL) {
			fprintf(stderr, "sop-bench: unknown side '%s'\n", tok);
			exit(2);
		}
		mask |= SIDE_BIT(k);
	}
	return mask;
}

static unsigned
parse_args(int argc, char **argv)
{
	enum {
		O_REPS = 256,
		O_QUICK,
		O_SMOKE,
		O_SCALE,
		O_SIDES,
		O_SIZES,
		O_BATCH,
		O_MAXMIB,
		O_THREADS,
		O_STREAMS,
		O_TRACE,
		O_OUT,
		O_BUDGET,
		O_WORKLOAD,
		O_HELP
	};
	static const struct option longopts[] = {
	    {"workload", required_argument, NULL, O_WORKLOAD},
	    {"reps", required_argument, NULL, O_REPS},
	    {"quick", no_argument, NULL, O_QUICK},
	    {"smoke", no_argument, NULL, O_SMOKE},
	    {"scale", required_argument, NULL, O_SCALE},
	    {"sides", required_argument, NULL, O_SIDES},
	    {"sizes", required_argument, NULL, O_SIZES},
	    {"batch", required_argument, NULL, O_BATCH},
	    {"max-mib", required_argument, NULL, O_MAXMIB},
	    {"threads", required_argument, NULL, O_THREADS},
	    {"streams", required_argument, NULL, O_STREAMS},
	    {"trace", required_argument, NULL, O_TRACE},
	    {"out", required_argument, NULL, O_OUT},
	    {"budget", required_argument, NULL, O_BUDGET},
	    {"help", no_argument, NULL, O_HELP},
	    {NULL, 0, NULL, 0},
	};
	unsigned wl = (1u << N_WORKLOADS) - 1;
	size_t at = 0;
	int c, i;

	opts.reps = 0;
	opts.scale = 1;
	opts.budget_s = 420;
	opts.sides = ~0u;
	while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
		switch (c) {
		case O_WORKLOAD:
			wl = parse_workloads(optarg);
			break;
		case O_REPS:
			opts.reps = atoi(optarg);
			if (opts.reps < 1 || opts.reps > BENCH_MAX_REPS) {
				fprintf(stderr, "sop-bench: --reps between 1 and %d\n",
					BENCH_MAX_REPS);
				exit(2);
			}
			break;
		case O_QUICK:
			if (opts.level != LEVEL_SMOKE)
				opts.level = LEVEL_QUICK;
			break;
		case O_SMOKE:
			opts.level = LEVEL_SMOKE;
			break;
		case O_SCALE:
			opts.scale = atof(optarg);
			if (!(opts.scale > 0 && opts.scale <= 1000)) {
				fprintf(stderr, "sop-bench: --scale must be in (0, 1000]\n");
				exit(2);
			}
			break;
		case O_SIDES:
			opts.sides = parse_sides(optarg);
			break;
		case O_SIZES:
			parse_list(&opts.sizes, optarg);
			break;
		case O_BATCH:
			parse_list(&opts.batch, optarg);
			break;
		case O_MAXMIB:
			parse_list(&opts.max_mib, optarg);
			break;
		case O_THREADS:
			parse_list(&opts.threads, optarg);
			for (i = 0; i < opts.threads.n; i++)
				if (opts.threads.v[i] > 256) {
					fprintf(stderr, "sop-bench: at most 256 threads\n");
					exit(2);
				}
			break;
		case O_STREAMS:
			parse_list(&opts.streams, optarg);
			for (i = 0; i < opts.streams.n; i++)
				if (opts.streams.v[i] > 64) {
					fprintf(stderr, "sop-bench: at most 64 streams\n");
					exit(2);
				}
			break;
		case O_TRACE:
			if (opts.n_traces == BENCH_MAX_TRACES) {
				fprintf(stderr, "sop-bench: at most %d traces\n", BENCH_MAX_TRACES);
				exit(2);
			}
			opts.traces[opts.n_traces++] = optarg;
			break;
		case O_OUT:
			opts.out = optarg;
			break;
		case O_BUDGET:
			opts.budget_s = atof(optarg);
			break;
		case O_HELP:
			usage(stdout);
			exit(0);
		default:
			usage(stderr);
			exit(2);
		}
	}
	if (optind < argc) {
		fprintf(stderr, "sop-bench: unexpected argument '%s'\n", argv[optind]);
		usage(stderr);
		exit(2);
	}
	if (!opts.reps)
		opts.reps = opts.level == LEVEL_FULL ? 7 : opts.level == LEVEL_QUICK ? 5 : 2;

	/* The command line for the report, without the folder the binary happens to sit in. */
	{
		const char *base = strrchr(argv[0], '/');

		at = (size_t)snprintf(command, sizeof command, "%s", base ? base + 1 : argv[0]);
		for (i = 1; i < argc && at < sizeof command; i++)
			at += (size_t)snprintf(command + at, sizeof command - at, " %s", argv[i]);
	}
	return wl;
}

int
main(int argc, char **argv)
{
	time_t t = time(NULL);
	struct tm tm;
	unsigned wl;
	size_t i;
	int status;

	/* The importer of the ipc workload, started by the harness itself. */
	if (argc == 3 && !strcmp(argv[1], "--ipc-child"))
		return ipc_child(atoi(argv[2]));
	wl = parse_args(argc, argv);

	t_start = now_ns();
	gmtime_r(&t, &tm);
	strftime(started, sizeof started, "%Y-%m-%d %H:%M:%S", &tm);
	/* More hardware queues than the default 8, so that 16 streams can run side by side (the
	 * streams workload); the driver reads this when it creates the context. */
	setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 0);
	status = env_init();
	if (status)
		return status;
	if (opts.out && mkdir(opts.out, 0777) && errno != EEXIST) {
		fprintf(stderr, "sop-bench: cannot create %s: %s\n", opts.out, strerror(errno));
		return 1;
	}
	progress("%s, driver %d, %zu MiB (%zu MiB free)%s%s%s; %d repetitions", env.device,
		 env.driver_version, env.total_mem / MiB, env.free_mem / MiB,
		 env.simulated ? "; SIMULATED driver: timings mean nothing" : "",
		 env.pools ? "" : "; no driver pools: sop only", env.kernels ? "" : "; no kernels",
		 opts.reps);
	if (env.simulated)
		note("simulated driver: no timing in this report means anything");
	if (!env.pools)
		note("the driver's stream-ordered pools are not available: only sop ran");
	if (!env.kernels)
		note("kernels cannot be launched here: the workloads ran without them");

	if (!env.simulated)
		wl_settle();
	for (i = 0; i < N_WORKLOADS; i++) {
		if (!(wl & 1u << i))
			continue;
		if (!budget_left(workloads[i].name))
			break;
		progress("== %s: %s", workloads[i].name, workloads[i].title);
		current = (int)i;
		workloads[i].run();
		current = -1;
		write_reports();
	}
	env_fini();
	write_reports();
	write_md(stdout);
	progress("done");
	for (i = 0; i < (size_t)n_metrics; i++)
		free(metrics[i]);
	for (i = 0; i < (size_t)n_notes; i++)
		free(notes[i]);
	return 0;
}

/* limit.c - device memory limits, as container GPU sharing (HAMi-core) gives them: the caps
 * and what sop's pools hold against them.
 *
 * SOP_DEVICE_MEMORY_LIMIT caps the physical memory that all of the process's sop pools hold on
 * each device, SOP_DEVICE_MEMORY_LIMIT_<ordinal> on one device; both are read once, at sop's
 * start, and sop_device_set_memory_limit changes them later. What the pools of a device hold is
 * one counter per device, charged by vmm.c before it asks the driver for a physical allocation
 * and discharged when one is unmapped: the hot path never touches it. A growth that would pass
 * the cap is refused like one the device cannot back; the allocation then, with no pool lock
 * held, gives back what every pool of the device holds idle and tries again once, and only then
 * returns CUDA_ERROR_OUT_OF_MEMORY (devices.c, which also writes the out-of-memory report that
 * SOP_OOM_REPORT=1 asks for). This file calls nothing of sop's: the layers below and above it
 * read and charge the counters.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* One per device: the cap (0: none) and what sop's pools hold against it. Written on growth
 * and release, read there and by cuMemGetInfo under the interposer: never on the hot path. */
struct devmem {
	_Alignas(64) atomic_size_t held;
	atomic_size_t limit;
};

static struct devmem *devmem;
static int n_devmem;
static bool oom_report;

#define LIMIT_ENV "SOP_DEVICE_MEMORY_LIMIT"

/* A size as HAMi-core reads CUDA_DEVICE_MEMORY_LIMIT: decimal digits, then optionally one of
 * k, m, g in either case (KiB, MiB, GiB). False for anything else, or a value past SIZE_MAX. */
static bool
size_parse(const char *s, size_t *out)
{
	size_t v = 0, unit = 1;
	const char *p;

	if (*s < '0' || *s > '9')
		return false;
	for (p = s; *p >= '0' && *p <= '9'; p++) {
		size_t d = (size_t)(*p - '0');

		if (v > (SIZE_MAX - d) / 10)
			return false;
		v = v * 10 + d;
	}
	switch (*p) {
	case 'k':
	case 'K':
		unit = (size_t)1 << 10;
		p++;
		break;
	case 'm':
	case 'M':
		unit = (size_t)1 << 20;
		p++;
		break;
	case 'g':
	case 'G':
		unit = (size_t)1 << 30;
		p++;
		break;
	default:
		break;
	}
	if (*p || v > SIZE_MAX / unit)
		return false;
	*out = v * unit;
	return true;
}

/* The variable's value: *set false if it is unset or empty. False for a value size_parse
 * refuses. */
static bool
env_size(const char *name, size_t *out, bool *set)
{
	const char *s = getenv(name);

	*set = s && *s;
	return !*set || size_parse(s, out);
}

CUresult
sop__limits_init(int n_devices)
{
	size_t all = 0, one;
	bool set;
	char name[sizeof LIMIT_ENV + 16];
	const char *report = getenv("SOP_OOM_REPORT");
	int i;

	oom_report = report && *report && strcmp(report, "0") != 0;
	devmem = calloc((size_t)n_devices, sizeof *devmem);
	if (!devmem)
		return CUDA_ERROR_OUT_OF_MEMORY;
	n_devmem = n_devices;
	/* A value sop cannot read refuses the start: running with no cap where one was asked for
	 * would let the process take memory its container was meant to leave to others. */
	if (!env_size(LIMIT_ENV, &all, &set))
		return CUDA_ERROR_INVALID_VALUE;
	for (i = 0; i < n_devices; i++) {
		snprintf(name, sizeof name, LIMIT_ENV "_%d", i);
		one = all;
		if (!env_size(name, &one, &set))
			return CUDA_ERROR_INVALID_VALUE;
		atomic_init(&devmem[i].limit, one);
	}
	return CUDA_SUCCESS;
}

bool
sop__limit_charge(CUdevice device, size_t size)
{
	struct devmem *m = &devmem[device];
	size_t limit = atomic_load_explicit(&m->limit, memory_order_relaxed);
	size_t now = atomic_load_explicit(&m->held, memory_order_relaxed);

	/* A compare-and-swap rather than an add undone on refusal, so that no reader (cuMemGetInfo
	 * under the interposer, another growth) ever sees the count past the cap. */
	do {
		if (limit && (size > limit || now > limit - size))
			return false;
	} while (!atomic_compare_exchange_weak_explicit(&m->held, &now, now + size,
							memory_order_relaxed, memory_order_relaxed));
	return true;
}

void
sop__limit_discharge(CUdevice device, size_t size)
{
	atomic_fetch_sub_explicit(&devmem[device].held, size, memory_order_relaxed);
}

void
sop__limit_get(CUdevice device, size_t *limit, size_t *held)
{
	*limit = atomic_load_explicit(&devmem[device].limit, memory_order_relaxed);
	*held = atomic_load_explicit(&devmem[device].held, memory_order_relaxed);
}

void
sop__limit_set(CUdevice device, size_t limit)
{
	atomic_store_explicit(&devmem[device].limit, limit, memory_order_relaxed);
}

bool
sop__limit_reporting(void)
{
	return oom_report;
}

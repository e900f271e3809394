/*
 * A small intrusive hash table for the simulated driver's registries.
 *
 * The driver must answer "is this a live handle?" for every stream, event
 * and allocation handle it is given, so that a stale or made-up handle gives
 * an error instead of touching freed memory. Nodes are embedded in the
 * objects, so inserting never allocates and never fails; growing the bucket
 * array may fail, and then the chains just get longer.
 */
#include <stdlib.h>

#include "sim-internal.h"

static size_t bucket_of(uint64_t key, size_t nbuckets)
{
	/* Fibonacci hashing spreads pointers (low bits all zero) and ids alike. */
	return (size_t)((key * 0x9e3779b97f4a7c15ull) >> 20) & (nbuckets - 1);
}

static void grow(struct sim_table *t)
{
	size_t n = t->nbuckets ? t->nbuckets * 2 : 64;
	struct sim_node **b = calloc(n, sizeof(*b));

	if (!b)
		return;
	for (size_t i = 0; i < t->nbuckets; i++) {
		struct sim_node *node = t->buckets[i];

		while (node) {
			struct sim_node *next = node->next;
			size_t j = bucket_of(node->key, n);

			node->next = b[j];
			b[j] = node;
			node = next;
		}
	}
	free(t->buckets);
	t->buckets = b;
	t->nbuckets = n;
}

struct sim_node *sim_table_find(struct sim_table *t, uint64_t key)
{
	if (!t->nbuckets)
		return NULL;
	for (struct sim_node *n = t->buckets[bucket_of(key, t->nbuckets)]; n; n = n->next)
		if (n->key == key)
			return n;
	return NULL;
}

void sim_table_insert(struct sim_table *t, struct sim_node *node)
{
	size_t i;

	if (t->count >= t->nbuckets * 2)
		grow(t);
	if (!t->nbuckets)
		sim_die("sim: out of memory for the handle registry");
	i = bucket_of(node->key, t->nbuckets);
	node->next = t->buckets[i];
	t->buckets[i] = node;
	t->count++;
}

struct sim_node *sim_table_remove(struct sim_table *t, uint64_t key)
{
	struct sim_node **link;

	if (!t->nbuckets)
		return NULL;
	for (link = &t->buckets[bucket_of(key, t->nbuckets)]; *link; link = &(*link)->next) {
		struct sim_node *n = *link;

		if (n->key == key) {
			*link = n->next;
			t->count--;
			return n;
		}
	}
	return NULL;
}

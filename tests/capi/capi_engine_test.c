/*
 * capi_engine_test.c — the engine through the C ABI (gc_engine_*, gc_hosted_*)
 * as a host program that brings its own communicator would drive it.
 *
 * The "communicator" is capi_host.h's: each rank has a host thread that
 * takes its transport's posts and carries them out with the other ranks'
 * host threads through shared memory (a rendezvous per collective, with a
 * timeout, as gloo or NCCL would time out), and a rank thread that runs the
 * engine's steps. With 4 ranks it runs every case of tests/golden and checks
 * every average and every rank's final engine state against the Go engine's
 * files bit for bit. Then the bad inputs: a post nobody takes, a host
 * error, a completion with a wrong or implausible length, an unknown or
 * finished id, a dead peer, take after destroy, a rank whose configuration
 * is invalid or needs more memory than the machine has, engine misuse, and
 * states that must be refused with the engine unchanged.
 *
 * Run from the repository root (make capi): it reads tests/golden/testdata.
 */
#define _POSIX_C_SOURCE 200809L
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "gradcomp.h"
#include "capi_check.h"
#include "capi_host.h"

/* The ABI's structs have the same layout on every LP64 platform: the
 * Python binding (ctypes) and other hosts mirror them field by field. */
_Static_assert(sizeof(gc_op) == 72, "gc_op is 72 bytes");
_Static_assert(offsetof(gc_engine_config, node) == 84, "node at 84 (ABI 2.4)");
_Static_assert(offsetof(gc_engine_config, node_spec) == 104, "node_spec at 104, the ABI 2.4 size (ABI 2.5)");
_Static_assert(sizeof(gc_engine_config) == 136 && offsetof(gc_engine_config, feedback_decay) == 128,
               "gc_engine_config is 136 bytes, feedback_decay at 128, the ABI 2.7 size (ABI 2.11)");
_Static_assert(offsetof(gc_engine_config, local_size) == 96, "local_size at 96");
_Static_assert(offsetof(gc_op, group) == 20 && offsetof(gc_op, reserved) == 20, "group is 2.3's reserved");
_Static_assert(offsetof(gc_engine_config, momentum_masking) == 80, "momentum_masking at 80");
_Static_assert(sizeof(gc_bucket_stats) == 640, "gc_bucket_stats is 640 bytes");
_Static_assert(sizeof(gc_bucket_verdict) == 32 && offsetof(gc_bucket_verdict, held_back) == 16,
               "gc_bucket_verdict is 32 bytes, held_back at 16 (ABI 2.10)");

#define GOLDEN "tests/golden/testdata"
#define RANKS 4
#define STEPS 3
#define NBUCKETS 2
static const uint64_t sizes[NBUCKETS] = {1000, 37};

/* tests/golden's gradient: a multiple of 1/64, exact in any summation order. */
static float gradient(int r, int s, int b, int i) {
	int64_t h = ((int64_t)r * 1000003 + (int64_t)s * 10007 + (int64_t)b * 101 + (int64_t)i * 7919) % 2003;
	return (float)(h - 1001) / 64.0f;
}

static uint8_t *read_file(const char *path, size_t *len) {
	FILE *f = fopen(path, "rb");
	if (f == NULL) return NULL;
	fseek(f, 0, SEEK_END);
	long n = ftell(f);
	fseek(f, 0, SEEK_SET);
	uint8_t *buf = malloc(n > 0 ? (size_t)n : 1);
	*len = fread(buf, 1, (size_t)n, f);
	fclose(f);
	return buf;
}

static gc_engine_config config(const char *spec, const char *strategy) {
	gc_engine_config c;
	memset(&c, 0, sizeof c);
	c.size = sizeof c;
	c.error_feedback = 1;
	c.spec = spec;
	c.strategy = strategy;
	c.decision = "compressed";
	c.timeout_seconds = 10;
	c.workers = 1;
	c.device = -1;
	return c;
}

/* ---- The golden cases on 4 ranks ---- */

struct rank {
	struct host *host;
	const char *spec, *strategy;
	int r;
	float avg[STEPS][1037];
	uint8_t *state;
	size_t state_len;
	uint64_t bytes_sent;
	char used[32];
};

static void *rank_main(void *arg) {
	struct rank *k = arg;
	gc_engine_config cfg = config(k->spec, k->strategy);
	gc_engine e = 0;
	gc_status st = gc_engine_create(k->host->t, &cfg, sizes, NBUCKETS, &e);
	CHECK(st == GC_OK, "rank %d: gc_engine_create(%s, %s) = %d (%s)", k->r, k->spec, k->strategy, st, gc_last_error());
	if (st != GC_OK) return NULL;
	float g[NBUCKETS][1000];
	for (int s = 0; s < STEPS; s++) {
		for (int b = 0; b < NBUCKETS; b++)
			for (uint64_t i = 0; i < sizes[b]; i++) g[b][i] = gradient(k->r, s, b, (int)i);
		OK(gc_engine_step(e));
		for (int b = NBUCKETS - 1; b >= 0; b--) OK(gc_engine_ready(e, (size_t)b, g[b], sizes[b]));
		st = gc_engine_wait(e, 30);
		CHECK(st == GC_OK, "rank %d step %d: gc_engine_wait = %d (%s)", k->r, s, st, gc_last_error());
		memcpy(k->avg[s], g[0], sizeof(float) * sizes[0]);
		memcpy(k->avg[s] + sizes[0], g[1], sizeof(float) * sizes[1]);
	}
	gc_bucket_stats bs;
	uint64_t step = 0;
	double total = 0, exposed = 0;
	OK(gc_engine_stats(e, 0, &bs, &step, &k->bytes_sent, &total, &exposed));
	CHECK(step == STEPS - 1, "rank %d: stats of step %llu, want %d", k->r, (unsigned long long)step, STEPS - 1);
	CHECK(bs.elements == sizes[0] && bs.bytes_sent > 0 && bs.bytes_sent <= k->bytes_sent,
	      "rank %d: bucket 0 stats: %llu elements, %llu of %llu bytes", k->r, (unsigned long long)bs.elements,
	      (unsigned long long)bs.bytes_sent, (unsigned long long)k->bytes_sent);
	snprintf(k->used, sizeof k->used, "%s", bs.strategy);
	OK(gc_engine_state_size(e, &k->state_len));
	k->state = malloc(k->state_len);
	size_t written = 0;
	OK(gc_engine_state_save(e, k->state, k->state_len, &written));
	CHECK(written == k->state_len, "rank %d: state %zu bytes written, size said %zu", k->r, written, k->state_len);
	OK(gc_engine_destroy(e));
	return NULL;
}

static void test_golden(void) {
	size_t len = 0;
	char *list = (char *)read_file(GOLDEN "/cases.txt", &len);
	CHECK(list != NULL, "cannot read %s (run from the repository root)", GOLDEN "/cases.txt");
	if (list == NULL) return;
	list = realloc(list, len + 1);
	list[len] = '\0';
	int cases = 0;
	for (char *save = NULL, *line = strtok_r(list, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
		char name[64], spec[64], strategy[32];
		if (sscanf(line, "%63s %63s %31s", name, spec, strategy) != 3) continue;
		cases++;
		/* The hosts take the posts, then launchers carry them out. */
		for (int launched = 0; launched < 2; launched++) {
			struct group g;
			group_init(&g, RANKS, 10);
			struct host hs[RANKS];
			hosts_start(hs, &g, RANKS, launched);
			static struct rank ks[RANKS];
			pthread_t th[RANKS];
			for (int r = 0; r < RANKS; r++) {
				memset(&ks[r], 0, sizeof ks[r]);
				ks[r] = (struct rank){.host = &hs[r], .spec = spec, .strategy = strategy, .r = r};
				pthread_create(&th[r], NULL, rank_main, &ks[r]);
			}
			for (int r = 0; r < RANKS; r++) pthread_join(th[r], NULL);
			hosts_stop(hs, RANKS);
			group_free(&g);

			char path[256];
			snprintf(path, sizeof path, GOLDEN "/%s.avg", name);
			size_t alen = 0;
			float *want = (float *)read_file(path, &alen);
			size_t per = (size_t)(sizes[0] + sizes[1]);
			CHECK(want != NULL && alen == sizeof(float) * per * RANKS * STEPS, "%s: %zu bytes, want %zu", path, alen,
			      sizeof(float) * per * RANKS * STEPS);
			int differ = 0;
			for (int s = 0; want && alen == sizeof(float) * per * RANKS * STEPS && s < STEPS; s++)
				for (int r = 0; r < RANKS; r++)
					if (memcmp(ks[r].avg[s], want + ((size_t)s * RANKS + (size_t)r) * per, sizeof(float) * per) != 0) {
						CHECK(0, "%s: step %d rank %d: averages differ from the Go engine's", name, s, r);
						differ++;
					}
			free(want);
			for (int r = 0; r < RANKS; r++) {
				snprintf(path, sizeof path, GOLDEN "/%s.state%d", name, r);
				size_t slen = 0;
				uint8_t *ws = read_file(path, &slen);
				CHECK(ws != NULL && ks[r].state != NULL && slen == ks[r].state_len &&
				          memcmp(ws, ks[r].state, slen) == 0,
				      "%s: rank %d: engine state (%zu bytes) differs from %s (%zu bytes)", name, r, ks[r].state_len,
				      path, slen);
				if (strcmp(strategy, "auto") != 0)
					CHECK(strcmp(ks[r].used, strategy) == 0, "%s: rank %d ran strategy %s, want %s", name, r,
					      ks[r].used, strategy);
				free(ws);
				free(ks[r].state);
			}
			printf("golden %-22s %-12s %-14s 4 ranks x %d steps, %s: %s; %llu bytes sent by rank 0 in the last step\n",
			       name, spec, ks[0].used, STEPS, launched ? "launched" : "taken", differ ? "DIFFER" : "bit-identical to the Go engine",
			       (unsigned long long)ks[0].bytes_sent);
		}
	}
	CHECK(cases >= 7, "%d golden cases, want at least 7", cases);
	free(list);
}

/* ---- Bad inputs ---- */

/* member is one rank of a 2-rank engine whose calls run on threads of
 * their own (a rank's calls block until its peers make theirs). */
struct member {
	struct host *h;
	gc_engine_config cfg;
	gc_engine e;
	gc_status st;
	char msg[512];
	float g[NBUCKETS][1000];
};

static void record(struct member *m, gc_status st) {
	m->st = st;
	snprintf(m->msg, sizeof m->msg, "%s", st == GC_OK ? "" : gc_last_error());
}

static void *create_main(void *arg) {
	struct member *m = arg;
	record(m, gc_engine_create(m->h->t, &m->cfg, sizes, NBUCKETS, &m->e));
	return NULL;
}

/* step_main runs one step: step, ready in order, wait. */
static void *step_main(void *arg) {
	struct member *m = arg;
	gc_status st = gc_engine_step(m->e);
	for (int b = 0; b < NBUCKETS && st == GC_OK; b++) st = gc_engine_ready(m->e, (size_t)b, m->g[b], sizes[b]);
	if (st == GC_OK) st = gc_engine_wait(m->e, 30);
	record(m, st);
	return NULL;
}

/* on runs fn for the members whose bit is set in mask, at once. */
static void on(struct member *ms, int n, unsigned mask, void *(*fn)(void *)) {
	pthread_t th[RANKS];
	for (int r = 0; r < n; r++)
		if (mask >> r & 1) pthread_create(&th[r], NULL, fn, &ms[r]);
	for (int r = 0; r < n; r++)
		if (mask >> r & 1) pthread_join(th[r], NULL);
}

/* pair makes a 2-rank engine of spec (group timeout group_s) with the
 * accuracy guard's threshold guard (0: none), its hosts launchers when
 * launched. */
static int pair(struct member ms[2], struct host hs[2], struct group *g, const char *spec, double timeout,
                double group_s, double guard, int launched) {
	group_init(g, 2, group_s);
	hosts_start(hs, g, 2, launched);
	for (int r = 0; r < 2; r++) {
		memset(&ms[r], 0, sizeof ms[r]);
		ms[r].h = &hs[r];
		ms[r].cfg = config(spec, "auto");
		ms[r].cfg.timeout_seconds = timeout;
		ms[r].cfg.guard = guard;
		for (int b = 0; b < NBUCKETS; b++) fill(ms[r].g[b], sizes[b], (uint64_t)(10 * r + b + 1));
	}
	on(ms, 2, 3, create_main);
	for (int r = 0; r < 2; r++)
		CHECK(ms[r].st == GC_OK, "rank %d: gc_engine_create(%s) = %d (%s)", r, spec, ms[r].st, ms[r].msg);
	return ms[0].st == GC_OK && ms[1].st == GC_OK;
}

static void unpair(struct member ms[2], struct host hs[2], struct group *g) {
	for (int r = 0; r < 2; r++)
		if (ms[r].e) OK(gc_engine_destroy(ms[r].e));
	hosts_stop(hs, 2);
	group_free(g);
}

/* A post nobody takes: create fails with GC_ERR_COMM within the timeout. */
static void test_untaken(void) {
	gc_hosted t;
	OK(gc_hosted_create(0, 2, &t));
	gc_engine_config cfg = config("int8", "auto");
	cfg.timeout_seconds = 0.5;
	gc_engine e = 0;
	double t0 = now();
	FAILS(gc_engine_create(t, &cfg, sizes, NBUCKETS, &e), GC_ERR_COMM, "");
	double took = now() - t0;
	CHECK(took < 5, "gc_engine_create with nobody taking returned after %.2f s, timeout 0.5 s", took);
	CHECK(e == 0, "a failed create set the engine handle");
	/* An ABI 2.0 caller's config (56 bytes, no momentum) and a 2.1
	 * caller's (72, no guard) are accepted (the create then fails for
	 * want of a host, not of a field); test_invalid_config refuses a
	 * shorter one. */
	cfg.size = 72;
	FAILS(gc_engine_create(t, &cfg, sizes, NBUCKETS, &e), GC_ERR_COMM, "");
	cfg.size = 56;
	FAILS(gc_engine_create(t, &cfg, sizes, NBUCKETS, &e), GC_ERR_COMM, "");
	OK(gc_hosted_destroy(t));
	printf("untaken post: gc_engine_create failed with GC_ERR_COMM after %.2f s (timeout 0.5 s): %s\n", took,
	       gc_last_error());
	/* What cannot take part in the handshake fails at once. */
	FAILS(gc_engine_create(t, &cfg, sizes, NBUCKETS, NULL), GC_ERR_INVALID, "null out");
	FAILS(gc_engine_create(t, &cfg, sizes, NBUCKETS, &e), GC_ERR_HANDLE, "");
}

/* One rank's gc_engine_create in test_invalid_config. */
struct creator {
	gc_hosted t;
	const gc_engine_config *cfg;
	const uint64_t *sizes;
	size_t nbuckets;
	gc_engine e;
	gc_status st;
	char msg[512];
};

static void *creator_main(void *arg) {
	struct creator *c = arg;
	c->st = gc_engine_create(c->t, c->cfg, c->sizes, c->nbuckets, &c->e);
	snprintf(c->msg, sizeof c->msg, "%s", c->st == GC_OK ? "" : gc_last_error());
	return NULL;
}

/* create_all runs the n creators' gc_engine_create at once and returns the
 * seconds they took together. */
static double create_all(struct creator *cs, int n) {
	pthread_t th[RANKS];
	double t0 = now();
	for (int r = 0; r < n; r++) pthread_create(&th[r], NULL, creator_main, &cs[r]);
	for (int r = 0; r < n; r++) pthread_join(th[r], NULL);
	return now() - t0;
}

/* A rank whose configuration is invalid before the handshake (a string
 * that does not parse, a value out of range, a short or null cfg, bad
 * sizes) still tells the others: on 4 ranks with a 30 s timeout, rank 2's
 * bad setting fails gc_engine_create with GC_ERR_CONFIG on every rank,
 * naming rank 2 and the setting, long before the timeout. */
static void test_invalid_config(void) {
	enum { BAD = 2 };
	static const uint64_t zero[NBUCKETS] = {1000, 0}, huge[NBUCKETS] = {1ull << 40, 37};
	struct {
		const char *name, *want;
		const uint64_t *sizes;
		int null_cfg;
		gc_engine_config cfg;
	} cases[] = {
		{"strategy", "unknown strategy \"bogus\"", sizes, 0, config("int8", "bogus")},
		{"decision", "unknown decision", sizes, 0, config("int8", "auto")},
		{"schedule", "schedule", sizes, 0, config("int8", "auto")},
		{"warmup", "warmup -1 is negative", sizes, 0, config("int8", "auto")},
		{"timeout", "timeout_seconds NaN", sizes, 0, config("int8", "auto")},
		{"workers", "workers -1 is negative", sizes, 0, config("int8", "auto")},
		{"device", "device -2", sizes, 0, config("int8", "auto")},
		{"size", "cfg->size 48", sizes, 0, config("int8", "auto")},
		{"null spec", "null cfg->spec", sizes, 0, config(NULL, "auto")},
		{"spec", "topk", sizes, 0, config("topk:2", "auto")},
		{"null cfg", "null cfg", sizes, 1, config("int8", "auto")},
		{"null sizes", "null sizes with 2 buckets", NULL, 0, config("int8", "auto")},
		{"empty bucket", "bucket 1 has 0 elements", zero, 0, config("int8", "auto")},
		{"huge bucket", "sizes[0] = 1099511627776", huge, 0, config("int8", "auto")},
		{"feedback decay", "FeedbackDecay 0.5 needs ErrorFeedback", sizes, 0, config("int8", "auto")},
		{"feedback decay range", "FeedbackDecay 1.5 is not in (0, 1]", sizes, 0, config("int8", "auto")},
	};
	cases[1].cfg.decision = "bogus";
	cases[2].cfg.schedule = "x@int8";
	cases[3].cfg.warmup = -1;
	cases[4].cfg.timeout_seconds = NAN;
	cases[5].cfg.workers = -1;
	cases[6].cfg.device = -2;
	cases[7].cfg.size = 48;
	cases[14].cfg.feedback_decay = 0.5;
	cases[14].cfg.error_feedback = 0;
	cases[15].cfg.feedback_decay = 1.5;
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		struct group g;
		struct host hs[RANKS];
		struct creator cs[RANKS];
		gc_engine_config good = config("int8", "auto");
		good.timeout_seconds = 30;
		cases[i].cfg.timeout_seconds = isnan(cases[i].cfg.timeout_seconds) ? NAN : 30;
		group_init(&g, RANKS, 30);
		hosts_start(hs, &g, RANKS, 0);
		for (int r = 0; r < RANKS; r++) {
			cs[r] = (struct creator){.t = hs[r].t, .cfg = &good, .sizes = sizes, .nbuckets = NBUCKETS};
			if (r == BAD) {
				cs[r].cfg = cases[i].null_cfg ? NULL : &cases[i].cfg;
				cs[r].sizes = cases[i].sizes;
			}
		}
		double took = create_all(cs, RANKS);
		for (int r = 0; r < RANKS; r++) {
			CHECK(cs[r].st == GC_ERR_CONFIG && cs[r].e == 0, "invalid %s: rank %d: gc_engine_create = %d (%s), want GC_ERR_CONFIG",
			      cases[i].name, r, cs[r].st, cs[r].msg);
			CHECK(strstr(cs[r].msg, "gc_engine_create: overlap: rank 2 has an invalid configuration: ") == cs[r].msg &&
			          strstr(cs[r].msg, cases[i].want) != NULL,
			      "invalid %s: rank %d's message %s does not name rank 2 and say %s", cases[i].name, r, cs[r].msg,
			      cases[i].want);
			if (cs[r].e) OK(gc_engine_destroy(cs[r].e));
		}
		CHECK(took < 15, "invalid %s: gc_engine_create took %.2f s (timeout 30 s)", cases[i].name, took);
		hosts_stop(hs, RANKS);
		group_free(&g);
		printf("invalid %-13s every rank GC_ERR_CONFIG after %.2f s: %s\n", cases[i].name, took, cs[0].msg);
	}
}

/* gc_engine_config is read as far as its size says and no further (since
 * 2.10): each config lies at the end of a readable page, the next one
 * unreadable. Every older ABI's size and this header's are accepted; a
 * size the library does not know (the 4 GiB an 88-byte struct claims, a
 * newer header's 144, one between two ABIs') is refused on every rank with
 * GC_ERR_CONFIG naming it and the library's size, and nothing past the
 * size is read: no fault. */
static void test_config_size(void) {
	enum { BAD = 1 };
	static const struct {
		uint32_t claim, room; /* cfg->size, and the bytes the caller's struct has */
		const char *want;     /* "" where accepted */
	} cases[] = {
		{56, 56, ""}, {72, 72, ""}, {88, 88, ""}, {104, 104, ""}, {112, 112, ""}, {128, 128, ""},
		{sizeof(gc_engine_config), sizeof(gc_engine_config), ""},
		{0xFFFFFFFFu, 88, "cfg->size 4294967295: this library (ABI 2.11) reads a gc_engine_config of 136 bytes"},
		{144, 144, "cfg->size 144: "},
		{96, 96, "cfg->size 96: "},
	};
	long page = sysconf(_SC_PAGESIZE);
	uint8_t *mem = mmap(NULL, 2 * (size_t)page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	CHECK(mem != MAP_FAILED && mprotect(mem + page, (size_t)page, PROT_NONE) == 0, "mmap/mprotect: %s", strerror(errno));
	if (mem == MAP_FAILED) return;
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		gc_engine_config full = config("int8", "auto");
		full.size = cases[i].claim;
		uint8_t *at = mem + page - cases[i].room;
		memset(at, 0, cases[i].room);
		memcpy(at, &full, cases[i].room < sizeof full ? cases[i].room : sizeof full);
		gc_engine_config good = config("int8", "auto");
		struct group g;
		struct host hs[2];
		struct creator cs[2];
		group_init(&g, 2, 10);
		hosts_start(hs, &g, 2, 0);
		for (int r = 0; r < 2; r++) {
			int bad = *cases[i].want && r == BAD;
			cs[r] = (struct creator){.t = hs[r].t, .cfg = *cases[i].want && !bad ? &good : (const gc_engine_config *)at,
			                         .sizes = sizes, .nbuckets = NBUCKETS};
		}
		create_all(cs, 2);
		for (int r = 0; r < 2; r++) {
			if (!*cases[i].want) {
				CHECK(cs[r].st == GC_OK, "size %u: rank %d: gc_engine_create = %d (%s)", cases[i].claim, r, cs[r].st, cs[r].msg);
			} else {
				CHECK(cs[r].st == GC_ERR_CONFIG && strstr(cs[r].msg, "rank 1 has an invalid configuration: ") != NULL &&
				          strstr(cs[r].msg, cases[i].want) != NULL,
				      "size %u in %u bytes: rank %d: gc_engine_create = %d (%s), want GC_ERR_CONFIG saying %s", cases[i].claim,
				      cases[i].room, r, cs[r].st, cs[r].msg, cases[i].want);
			}
			if (cs[r].e) OK(gc_engine_destroy(cs[r].e));
		}
		hosts_stop(hs, 2);
		group_free(&g);
		if (*cases[i].want && cases[i].claim == 0xFFFFFFFFu) printf("config size: 4 GiB claimed: %s\n", cs[0].msg);
	}
	/* The other readers of gc_engine_config refuse it alike. */
	gc_engine_config *huge = (gc_engine_config *)(mem + page - 88);
	huge->size = 0xFFFFFFFFu;
	FAILS(gc_engine_state_check((const uint8_t *)"GCOV", 4, huge, sizes, NBUCKETS, 1), GC_ERR_CONFIG, "cfg->size 4294967295");
	munmap(mem, 2 * (size_t)page);
}

/* Buffers no machine has (256 buckets of 2^31 - 1 elements: 6 TB of error
 * feedback) are refused before anything is allocated: the rank that asked
 * gets GC_ERR_NOMEM saying how much, the other GC_ERR_CONFIG naming it;
 * when both ask, both get GC_ERR_NOMEM. */
static void test_nomem(void) {
	enum { HUGE_BUCKETS = 256 };
	static uint64_t huge[HUGE_BUCKETS];
	for (int i = 0; i < HUGE_BUCKETS; i++) huge[i] = (1ull << 31) - 1;
	for (unsigned both = 0; both < 2; both++) {
		struct group g;
		struct host hs[2];
		struct creator cs[2];
		gc_engine_config cfg = config("int8", "auto");
		cfg.timeout_seconds = 30;
		group_init(&g, 2, 30);
		hosts_start(hs, &g, 2, 0);
		for (int r = 0; r < 2; r++) {
			cs[r] = (struct creator){.t = hs[r].t, .cfg = &cfg, .sizes = sizes, .nbuckets = NBUCKETS};
			if (r == 1 || both) cs[r].sizes = huge, cs[r].nbuckets = HUGE_BUCKETS;
		}
		double took = create_all(cs, 2);
		for (int r = 0; r < 2; r++) {
			int asked = r == 1 || both;
			CHECK(cs[r].st == (asked ? GC_ERR_NOMEM : GC_ERR_CONFIG) && cs[r].e == 0,
			      "huge buckets (both %u): rank %d: gc_engine_create = %d (%s), want %s", both, r, cs[r].st, cs[r].msg,
			      asked ? "GC_ERR_NOMEM" : "GC_ERR_CONFIG");
			char want[128];
			snprintf(want, sizeof want, "rank %d has an invalid configuration: the host buffers of 256 buckets on rank %d need",
			         asked ? r : 1, asked ? r : 1);
			CHECK(strstr(cs[r].msg, want) != NULL, "huge buckets (both %u): rank %d's message %s does not say %s", both, r,
			      cs[r].msg, want);
			if (cs[r].e) OK(gc_engine_destroy(cs[r].e));
		}
		CHECK(took < 15, "huge buckets: gc_engine_create took %.2f s (timeout 30 s)", took);
		hosts_stop(hs, 2);
		group_free(&g);
		if (both) printf("huge buckets: GC_ERR_NOMEM after %.2f s: %s\n", took, cs[1].msg);
	}
}

/* The accuracy guard through the ABI: top-k 5 % with threshold 1.2 on 2
 * ranks; a step whose held_back passes it is followed by a guarded one
 * (dense with the residual, held_back 0), alike on both ranks; the
 * verdicts (since 2.10) say so as values: the trip's guard state
 * GC_GUARD_TRIPPED, the flush's origin GC_ORIGIN_GUARD, every other step
 * pinned and clear. */
static void test_guard(void) {
	struct member ms[2];
	struct host hs[2];
	struct group g;
	int tripped = -1, guarded = -1;
	double rho[2] = {0, 0};
	if (pair(ms, hs, &g, "topk:0.05", 10, 10, 1.2, 0)) {
		gc_bucket_verdict v[2] = {{.size = sizeof v[0]}, {.size = sizeof v[1]}};
		FAILS(gc_engine_held_back(ms[0].e, 0, &rho[0]), GC_ERR_STATE, "");
		FAILS(gc_engine_verdict(ms[0].e, 0, &v[0]), GC_ERR_STATE, "");
		for (int s = 0; s < 16 && guarded < 0 && failures == 0; s++) {
			for (int r = 0; r < 2; r++)
				for (int b = 0; b < NBUCKETS; b++) fill(ms[r].g[b], sizes[b], (uint64_t)(1000 * s + 10 * r + b + 1));
			on(ms, 2, 3, step_main);
			gc_bucket_stats bs[2];
			for (int r = 0; r < 2; r++) {
				CHECK(ms[r].st == GC_OK, "guard step %d rank %d: %d (%s)", s, r, ms[r].st, ms[r].msg);
				OK(gc_engine_stats(ms[r].e, 0, &bs[r], NULL, NULL, NULL, NULL));
				OK(gc_engine_held_back(ms[r].e, 0, &rho[r]));
				OK(gc_engine_verdict(ms[r].e, 0, &v[r]));
				CHECK(v[r].size == sizeof v[r] && v[r].held_back == rho[r] && v[r].guard_threshold == 1.2 &&
				          v[r].caution == GC_CAUTION_NONE,
				      "step %d rank %d: verdict size %u, held back %g (gc_engine_held_back: %g), threshold %g, caution %d", s, r,
				      v[r].size, v[r].held_back, rho[r], v[r].guard_threshold, v[r].caution);
			}
			CHECK(bs[0].guarded == bs[1].guarded && rho[0] == rho[1] && v[0].origin == v[1].origin && v[0].guard == v[1].guard,
			      "step %d: the ranks disagree: guarded %d/%d, held back %g/%g, origin %d/%d, guard %d/%d", s, bs[0].guarded,
			      bs[1].guarded, rho[0], rho[1], v[0].origin, v[1].origin, v[0].guard, v[1].guard);
			if (bs[0].guarded) {
				guarded = s;
				CHECK(tripped == s - 1 && rho[0] == 0 && !bs[0].compressed && strstr(bs[0].reason, "accuracy guard") &&
				          v[0].origin == GC_ORIGIN_GUARD && v[0].guard == GC_GUARD_CLEAR,
				      "step %d guarded after a trip at %d: held back %g, compressed %d, origin %s, guard %s, reason %s", s,
				      tripped, rho[0], bs[0].compressed, gc_name(GC_NAMES_ORIGIN, v[0].origin),
				      gc_name(GC_NAMES_GUARD, v[0].guard), bs[0].reason);
			} else if (rho[0] > 1.2) {
				tripped = s;
				CHECK(v[0].guard == GC_GUARD_TRIPPED && strcmp(gc_name(GC_NAMES_GUARD, v[0].guard), "tripped") == 0 &&
				          v[0].origin == GC_ORIGIN_PINNED,
				      "step %d held back %g > 1.2: guard %d, origin %d", s, rho[0], v[0].guard, v[0].origin);
			} else {
				CHECK(v[0].guard == GC_GUARD_CLEAR && v[0].origin == GC_ORIGIN_PINNED,
				      "step %d held back %g: guard %d, origin %d, want clear and pinned", s, rho[0], v[0].guard, v[0].origin);
			}
		}
		CHECK(guarded > 0, "no step was guarded in 16 (last held back %g)", rho[0]);
		FAILS(gc_engine_held_back(ms[0].e, 0, NULL), GC_ERR_INVALID, "null out");
		FAILS(gc_engine_held_back(ms[0].e, 7, &rho[0]), GC_ERR_INVALID, "bucket 7");
		/* A newer header's larger struct gets this library's fields, and
		 * its size says how many; a size below 2.10's is refused. */
		struct {
			gc_bucket_verdict v;
			uint64_t newer;
		} w = {.v.size = sizeof w, .newer = 0x5a5a5a5a5a5a5a5aull};
		OK(gc_engine_verdict(ms[0].e, 0, &w.v));
		CHECK(w.v.size == sizeof(gc_bucket_verdict) && w.newer == 0x5a5a5a5a5a5a5a5aull && w.v.guard_threshold == 1.2,
		      "a %zu-byte verdict: size %u, the newer field %#llx, threshold %g", sizeof w, w.v.size,
		      (unsigned long long)w.newer, w.v.guard_threshold);
		v[0].size = 16;
		FAILS(gc_engine_verdict(ms[0].e, 0, &v[0]), GC_ERR_INVALID, "out->size 16: want sizeof(gc_bucket_verdict), 32");
		FAILS(gc_engine_verdict(ms[0].e, 0, NULL), GC_ERR_INVALID, "null out");
		v[0].size = sizeof v[0];
		FAILS(gc_engine_verdict(ms[0].e, 7, &v[0]), GC_ERR_INVALID, "bucket 7");
	}
	unpair(ms, hs, &g);
	printf("accuracy guard: held back past 1.2 at step %d, step %d guarded\n", tripped, guarded);
}

/* The names the library gives (since 2.10): every list read with i = 0,
 * 1, ... until NULL, in the order of the header's enumerations; unknown
 * lists and negative indices are NULL. */
static void test_names(void) {
	static const struct {
		gc_name_list list;
		int count;
		int at;
		const char *name; /* name at index at */
	} lists[] = {
		{GC_NAMES_STRATEGY, -1, 0, "auto"},  {GC_NAMES_DECISION, 3, 2, "dense"},
		{GC_NAMES_ORIGIN, GC_ORIGIN_FALLBACK + 1, GC_ORIGIN_COST_MODEL, "cost-model"},
		{GC_NAMES_CAUTION, GC_CAUTION_RANDOMK_RATIO + 1, GC_CAUTION_NONE, "none"},
		{GC_NAMES_GUARD, GC_GUARD_PENDING + 1, GC_GUARD_TRIPPED, "tripped"},
	};
	int hier = 0, lowrank = 0;
	for (size_t l = 0; l < sizeof lists / sizeof lists[0]; l++) {
		int n = 0;
		while (gc_name(lists[l].list, n) != NULL && n < 100) n++;
		CHECK(lists[l].count < 0 || n == lists[l].count, "list %d has %d names, want %d", lists[l].list, n, lists[l].count);
		const char *at = gc_name(lists[l].list, lists[l].at);
		CHECK(at != NULL && strcmp(at, lists[l].name) == 0 && at == gc_name(lists[l].list, lists[l].at),
		      "list %d name %d: %s, want %s (static, the same each call)", lists[l].list, lists[l].at, at ? at : "NULL",
		      lists[l].name);
		CHECK(gc_name(lists[l].list, -1) == NULL, "list %d: name -1 is not NULL", lists[l].list);
		for (int i = 0; lists[l].list == GC_NAMES_STRATEGY && i < n; i++) {
			hier |= strcmp(gc_name(GC_NAMES_STRATEGY, i), "hier") == 0;
			lowrank |= strcmp(gc_name(GC_NAMES_STRATEGY, i), "low-rank") == 0;
		}
	}
	CHECK(hier && lowrank, "the strategies lack hier (%d) or low-rank (%d)", hier, lowrank);
	CHECK(gc_name((gc_name_list)6, 0) == NULL && gc_name((gc_name_list)-1, 0) == NULL, "unknown lists are not NULL");
}

/* PowerSGD through the C ABI (spec "powersgd:2", strategy "low-rank"): the
 * shapes come with the config (bucket 0 a 40×25 matrix, bucket 1 a 1×37
 * bias); gradients whose matrices share a 2-dimensional column space are
 * averaged exactly, the same on both ranks. Without shapes, or with one of
 * the two arrays, every rank gets GC_ERR_CONFIG. */
static void test_lowrank(void) {
	static const uint64_t counts[NBUCKETS] = {1, 1};
	static const uint64_t shapes[4] = {40, 25, 1, 37};
	struct {
		const uint64_t *counts, *shapes;
		gc_status want;
		const char *say;
	} cases[] = {
		{counts, shapes, GC_OK, ""},
		{NULL, NULL, GC_ERR_CONFIG, "needs Config.Shapes"},
		{counts, NULL, GC_ERR_CONFIG, "give both or neither"},
	};
	for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
		struct group g;
		struct host hs[2];
		struct member ms[2];
		group_init(&g, 2, 10);
		hosts_start(hs, &g, 2, 0);
		float a[40][2], want[1000] = {0};
		for (int i = 0; i < 40; i++) a[i][0] = (float)(i % 7) - 3, a[i][1] = (float)(i % 5) * 0.5f - 1;
		for (int r = 0; r < 2; r++) {
			memset(&ms[r], 0, sizeof ms[r]);
			ms[r].h = &hs[r];
			ms[r].cfg = config("powersgd:2", "low-rank");
			ms[r].cfg.tensor_counts = cases[c].counts;
			ms[r].cfg.shapes = cases[c].shapes;
			for (int i = 0; i < 40; i++)
				for (int j = 0; j < 25; j++) {
					float b0 = (float)((j + r) % 4) - 1.5f, b1 = (float)((3 * j + r) % 6) * 0.25f;
					ms[r].g[0][i * 25 + j] = a[i][0] * b0 + a[i][1] * b1;
					want[i * 25 + j] += ms[r].g[0][i * 25 + j] / 2;
				}
			for (int i = 0; i < 37; i++) ms[r].g[1][i] = (float)(r * 37 + i);
		}
		on(ms, 2, 3, create_main);
		for (int r = 0; r < 2; r++)
			CHECK(ms[r].st == cases[c].want && strstr(ms[r].msg, cases[c].say) != NULL,
			      "low-rank case %zu: rank %d: gc_engine_create = %d (%s), want %d saying %s", c, r, ms[r].st, ms[r].msg,
			      cases[c].want, cases[c].say);
		if (cases[c].want == GC_OK && ms[0].st == GC_OK && ms[1].st == GC_OK) {
			on(ms, 2, 3, step_main);
			double err = 0, scale = 0;
			for (int i = 0; i < 1000; i++) {
				err = fmax(err, fabs((double)ms[0].g[0][i] - want[i]));
				scale = fmax(scale, fabs((double)want[i]));
			}
			CHECK(ms[0].st == GC_OK && ms[1].st == GC_OK, "low-rank step: %d (%s), %d (%s)", ms[0].st, ms[0].msg, ms[1].st,
			      ms[1].msg);
			CHECK(memcmp(ms[0].g, ms[1].g, sizeof ms[0].g) == 0, "low-rank: the ranks' averages differ");
			CHECK(err <= 1e-5 * scale, "low-rank: largest difference from the mean %g (scale %g)", err, scale);
			CHECK(ms[0].g[1][5] == (5.0f + 42.0f) / 2, "low-rank: the bias averaged to %g, want %g", ms[0].g[1][5],
			      (5.0 + 42.0) / 2);
			gc_bucket_stats bs;
			uint64_t step = 0, sent = 0;
			double total = 0, exposed = 0;
			OK(gc_engine_stats(ms[0].e, 0, &bs, &step, &sent, &total, &exposed));
			CHECK(bs.compressed == 1 && strcmp(bs.strategy, "low-rank") == 0, "low-rank: bucket 0 compressed %d by %s",
			      bs.compressed, bs.strategy);
			printf("low-rank (powersgd:2) 2 ranks: a rank-2 gradient averaged within %.2g of the mean; "
			       "bucket 0 sent %llu bytes for 1000 elements\n",
			       err / scale, (unsigned long long)bs.bytes_sent);
		}
		unpair(ms, hs, &g);
	}
}

/* A fault of rank 0's host in the step's first collective: rank 0's step
 * fails with GC_ERR_COMM saying want0; rank 1's, whose host then waits in
 * vain for rank 0's, fails too; both engines are broken. With launched,
 * the hosts are launchers, which complete the faulty op from within. */
static void test_fault(enum fault f, const char *name, gc_status want_complete, const char *want0, int launched) {
	struct group g;
	struct host hs[2];
	struct member ms[2];
	if (pair(ms, hs, &g, "int8", 10, 3, 0, launched)) {
		hs[0].fault = f;
		__atomic_store_n(&hs[0].armed, 1, __ATOMIC_RELEASE);
		double t0 = now();
		on(ms, 2, 3, step_main);
		double took = now() - t0;
		for (int r = 0; r < 2; r++)
			CHECK(ms[r].st == GC_ERR_COMM, "%s: rank %d: wait = %d (%s), want GC_ERR_COMM", name, r, ms[r].st,
			      ms[r].msg);
		CHECK(strstr(ms[0].msg, want0) != NULL, "%s: rank 0's error %s does not say %s", name, ms[0].msg, want0);
		CHECK(took < 15, "%s: the failed step took %.2f s", name, took);
		CHECK(hs[0].fault_status == want_complete, "%s: gc_hosted_complete = %d, want %d", name,
		      hs[0].fault_status, want_complete);
		FAILS(gc_engine_step(ms[0].e), GC_ERR_BROKEN, "");
		printf("%-24s %s both ranks GC_ERR_COMM after %.2f s; rank 0: %s\n", name, launched ? "(launched)" : "", took,
		       ms[0].msg);
	}
	unpair(ms, hs, &g);
}

/* A rank whose host stops taking (a dead peer, to the others): its step
 * fails within the engine's timeout, its peer's when its host's
 * collective times out. */
static void test_dead_peer(void) {
	struct group g;
	struct host hs[2];
	struct member ms[2];
	if (pair(ms, hs, &g, "topk:0.05", 2, 4, 0, 0)) {
		__atomic_store_n(&hs[0].paused, 1, __ATOMIC_RELEASE); /* rank 0's host stops taking */
		double t0 = now();
		on(ms, 2, 3, step_main);
		double took = now() - t0;
		for (int r = 0; r < 2; r++)
			CHECK(ms[r].st == GC_ERR_COMM, "dead peer: rank %d: wait = %d (%s), want GC_ERR_COMM", r, ms[r].st,
			      ms[r].msg);
		CHECK(took < 15, "dead peer: the failed step took %.2f s", took);
		printf("dead peer                both ranks GC_ERR_COMM after %.2f s; rank 1: %s\n", took, ms[1].msg);
	}
	unpair(ms, hs, &g);
}

static void *take_main(void *arg) {
	struct member *m = arg;
	gc_op op;
	m->st = gc_hosted_take(m->h->t, 10, &op);
	return NULL;
}

/* A take blocked in gc_hosted_take when the transport is destroyed returns
 * GC_ERR_CLOSED; a take on the destroyed handle is an error at once. */
static void test_take_after_destroy(void) {
	struct host h;
	struct member m;
	memset(&m, 0, sizeof m);
	m.h = &h;
	OK(gc_hosted_create(0, 2, &h.t));
	pthread_t th;
	pthread_create(&th, NULL, take_main, &m);
	struct timespec ts = {0, 100 * 1000 * 1000};
	nanosleep(&ts, NULL);
	double t0 = now();
	OK(gc_hosted_destroy(h.t));
	pthread_join(th, NULL);
	CHECK(m.st == GC_ERR_CLOSED, "a take blocked across destroy returned %d, want GC_ERR_CLOSED", m.st);
	CHECK(now() - t0 < 2, "the blocked take returned %.2f s after destroy", now() - t0);
	gc_op op;
	FAILS(gc_hosted_take(h.t, 0, &op), GC_ERR_HANDLE, "");
	FAILS(gc_hosted_destroy(h.t), GC_ERR_HANDLE, "");
	FAILS(gc_hosted_complete(h.t, 1, GC_OK, NULL, 0), GC_ERR_HANDLE, "");
}

/* state_crc makes a state's CRC32C (its last 4 bytes, little-endian) good
 * again after an edit. */
static void state_crc(uint8_t *state, size_t len) {
	uint32_t c = 0xFFFFFFFFu;
	for (size_t i = 0; i + 4 < len; i++) {
		c ^= state[i];
		for (int k = 0; k < 8; k++) c = c >> 1 ^ (0x82F63B78u & -(c & 1u));
	}
	c = ~c;
	for (int k = 0; k < 4; k++) state[len - 4 + (size_t)k] = (uint8_t)(c >> (8 * k));
}

static uint8_t *save(gc_engine e, size_t *len) {
	OK(gc_engine_state_size(e, len));
	uint8_t *buf = malloc(*len);
	size_t w = 0;
	OK(gc_engine_state_save(e, buf, *len, &w));
	return buf;
}

/* gc_engine_state_check of e's state (saved with cfg on 2 ranks) says
 * what gc_engine_state_load says, with the same message: a state whose
 * strategy byte is 77 (no strategy; its checksum made good) is refused by
 * both, and so is a state checked against another strategy; bad arguments
 * and an invalid cfg are refused. */
static void test_state_check(gc_engine e, const gc_engine_config *cfg, const uint8_t *state, size_t len) {
	enum { STRATEGY_AT = 4 + 1 + 4 + 4 + 8 + 4 + 4 }; /* after the spec, "int8" */
	OK(gc_engine_state_check(state, len, cfg, sizes, NBUCKETS, 2));
	uint8_t *bad = malloc(len);
	memcpy(bad, state, len);
	bad[STRATEGY_AT] = 77;
	state_crc(bad, len);
	FAILS(gc_engine_state_load(e, bad, len), GC_ERR_CORRUPT, "strategy byte 77 names no strategy");
	char want[512];
	snprintf(want, sizeof want, "%s", gc_last_error() + strlen("gc_engine_state_load"));
	FAILS(gc_engine_state_check(bad, len, cfg, sizes, NBUCKETS, 2), GC_ERR_CORRUPT, want);
	free(bad);
	gc_engine_config other = *cfg;
	other.strategy = "sra";
	FAILS(gc_engine_state_check(state, len, &other, sizes, NBUCKETS, 2), GC_ERR_CORRUPT,
	      "saved with strategy auto (allgather), this engine has sra");
	other = *cfg;
	other.warmup = 7; /* a run-time setting: may change */
	other.decision = "dense";
	OK(gc_engine_state_check(state, len, &other, sizes, NBUCKETS, 2));
	other.warmup = -1;
	FAILS(gc_engine_state_check(state, len, &other, sizes, NBUCKETS, 2), GC_ERR_CONFIG, "warmup -1 is negative");
	const uint64_t fewer[1] = {sizes[0]};
	FAILS(gc_engine_state_check(state, len, cfg, fewer, 1, 2), GC_ERR_CORRUPT, "saved with 2 buckets, this engine has 1");
	FAILS(gc_engine_state_check(state, len, cfg, sizes, NBUCKETS, 0), GC_ERR_INVALID, "world_size 0");
	FAILS(gc_engine_state_check(NULL, len, cfg, sizes, NBUCKETS, 2), GC_ERR_INVALID, "null src");
	FAILS(gc_engine_state_check(state, len - 1, cfg, sizes, NBUCKETS, 2), GC_ERR_CORRUPT, "");
}

/* Misuse of one engine takes nothing and leaves it usable; states of
 * another spec or strategy or a corrupt one are refused with the engine
 * unchanged, by gc_engine_state_load and gc_engine_state_check alike. */
static void test_misuse_and_states(void) {
	struct group g;
	struct host hs[2];
	struct member ms[2];
	if (pair(ms, hs, &g, "int8", 5, 5, 0, 0)) {
		gc_engine e = ms[0].e;
		float *g0 = ms[0].g[0];
		FAILS(gc_engine_ready(e, 0, g0, sizes[0]), GC_ERR_STATE, "");
		FAILS(gc_engine_wait(e, 1), GC_ERR_STATE, "");
		FAILS(gc_engine_stats(e, 0, NULL, NULL, NULL, NULL, NULL), GC_ERR_STATE, "");
		OK(gc_engine_step(e));
		FAILS(gc_engine_step(e), GC_ERR_STATE, "");
		FAILS(gc_engine_ready(e, 0, g0, sizes[0] - 1), GC_ERR_SIZE, "");
		FAILS(gc_engine_ready(e, NBUCKETS, g0, sizes[0]), GC_ERR_STATE, "");
		FAILS(gc_engine_ready(e, 0, NULL, sizes[0]), GC_ERR_INVALID, "");
		OK(gc_engine_ready(e, 0, g0, sizes[0]));
		FAILS(gc_engine_ready(e, 0, g0, sizes[0]), GC_ERR_STATE, "");
		size_t len = 0;
		FAILS(gc_engine_state_size(e, &len), GC_ERR_STATE, "");
		OK(gc_engine_ready(e, 1, ms[0].g[1], sizes[1]));
		/* rank 1 steps normally; rank 0 waits: the misuse took nothing */
		gc_status st0;
		{
			pthread_t th;
			pthread_create(&th, NULL, step_main, &ms[1]);
			st0 = gc_engine_wait(e, 30);
			pthread_join(th, NULL);
		}
		CHECK(st0 == GC_OK && ms[1].st == GC_OK, "the step after misuse: rank 0 %d, rank 1 %d (%s)", st0, ms[1].st,
		      ms[1].msg);

		size_t before_len = 0, after_len = 0, glen = 0;
		uint8_t *before = save(e, &before_len);
		uint8_t *other = read_file(GOLDEN "/int4-allgather.state0", &glen);
		CHECK(other != NULL, "cannot read the int4 golden state");
		if (other) {
			FAILS(gc_engine_state_load(e, other, glen), GC_ERR_CORRUPT, "saved with spec int4, this engine has int8");
			FAILS(gc_engine_state_check(other, glen, &ms[0].cfg, sizes, NBUCKETS, 2), GC_ERR_CORRUPT,
			      "saved with spec int4, this engine has int8");
			char spec[64], strategy[32];
			int world = 0, rank = -1;
			uint64_t next = 0, bs[4] = {0};
			size_t nb = 0;
			OK(gc_engine_state_info(other, glen, spec, sizeof spec, strategy, sizeof strategy, &world, &rank,
			                        &next, &nb, bs, 4));
			CHECK(strcmp(spec, "int4") == 0 && strcmp(strategy, "allgather") == 0 && world == 4 && rank == 0 &&
			          next == STEPS && nb == NBUCKETS && bs[0] == sizes[0] && bs[1] == sizes[1],
			      "state info: %s %s world %d rank %d next %llu, %zu buckets %llu %llu", spec, strategy, world,
			      rank, (unsigned long long)next, nb, (unsigned long long)bs[0], (unsigned long long)bs[1]);
			other[glen / 2] ^= 1;
			FAILS(gc_engine_state_info(other, glen, spec, sizeof spec, strategy, sizeof strategy, &world, &rank,
			                           &next, &nb, bs, 4),
			      GC_ERR_CORRUPT, "");
			free(other);
		}
		test_state_check(e, &ms[0].cfg, before, before_len);
		FAILS(gc_engine_state_load(e, before, before_len - 1), GC_ERR_CORRUPT, "");
		before[before_len - 1] ^= 0x80;
		FAILS(gc_engine_state_load(e, before, before_len), GC_ERR_CORRUPT, "");
		before[before_len - 1] ^= 0x80;
		uint8_t *after = save(e, &after_len);
		CHECK(after_len == before_len && memcmp(before, after, before_len) == 0,
		      "refused loads changed the engine's state");
		free(after);
		/* The SRA golden state of 4 ranks (strategy "sra") is refused by
		 * this 2-rank engine ("auto": allgather in use), and fits a 2-rank
		 * engine configured "sra": the world size may change. */
		uint8_t *four = read_file(GOLDEN "/int8-sra.state0", &glen);
		if (four) {
			FAILS(gc_engine_state_load(e, four, glen), GC_ERR_CORRUPT,
			      "saved with strategy sra, this engine has auto (allgather)");
			gc_engine_config sra = ms[0].cfg;
			sra.strategy = "sra";
			OK(gc_engine_state_check(four, glen, &sra, sizes, NBUCKETS, 2));
			free(four);
		}
		free(before);
	}
	unpair(ms, hs, &g);
}

/* ---- Strategy hier: 4 ranks as 2 nodes x 2 ---- */

/* A rank of the hierarchical test: three host threads (the world, its node
 * group, its cross-node group) on one transport, each taking its group's
 * posts with gc_hosted_take_group and carrying them out with that group's
 * host threads. */
struct hier_rank {
	struct host hosts[3];
	gc_engine_config cfg;
	const char *spec;
	int r;
	gc_status st;
	char msg[512];
	float avg[STEPS][1037];
	uint8_t *state;
	size_t state_len;
	char reason[512];
};

static void *hier_main(void *arg) {
	struct hier_rank *k = arg;
	gc_engine e = 0;
	k->st = gc_engine_create(k->hosts[0].t, &k->cfg, sizes, NBUCKETS, &e);
	snprintf(k->msg, sizeof k->msg, "%s", k->st == GC_OK ? "" : gc_last_error());
	if (k->st != GC_OK) return NULL;
	float g[NBUCKETS][1000];
	for (int s = 0; s < STEPS; s++) {
		for (int b = 0; b < NBUCKETS; b++)
			for (uint64_t i = 0; i < sizes[b]; i++) g[b][i] = gradient(k->r, s, b, (int)i);
		OK(gc_engine_step(e));
		for (int b = NBUCKETS - 1; b >= 0; b--) OK(gc_engine_ready(e, (size_t)b, g[b], sizes[b]));
		gc_status st = gc_engine_wait(e, 30);
		CHECK(st == GC_OK, "hier rank %d step %d: gc_engine_wait = %d (%s)", k->r, s, st, gc_last_error());
		memcpy(k->avg[s], g[0], sizeof(float) * sizes[0]);
		memcpy(k->avg[s] + sizes[0], g[1], sizeof(float) * sizes[1]);
	}
	gc_bucket_stats bs;
	OK(gc_engine_stats(e, 0, &bs, NULL, NULL, NULL, NULL));
	snprintf(k->reason, sizeof k->reason, "%s", bs.reason);
	OK(gc_engine_state_size(e, &k->state_len));
	k->state = malloc(k->state_len);
	size_t written = 0;
	OK(gc_engine_state_save(e, k->state, k->state_len, &written));
	OK(gc_engine_destroy(e));
	return NULL;
}

/* hier_run creates 4 ranks' transports and hosts (2 nodes x 2: rank r on
 * node r/2), runs hier_main on each with cfgs[r], and stops the hosts. */
static void hier_run(struct hier_rank *ks, const gc_engine_config *cfgs) {
	struct group world, node[2], cross[2];
	group_init(&world, RANKS, 10);
	for (int i = 0; i < 2; i++) {
		group_init(&node[i], 2, 10);
		group_init(&cross[i], 2, 10);
	}
	for (int r = 0; r < RANKS; r++) {
		struct hier_rank *k = &ks[r];
		memset(k, 0, sizeof *k);
		k->r = r;
		k->cfg = cfgs[r];
		gc_hosted t;
		OK(gc_hosted_create(r, RANKS, &t));
		struct group *gs[3] = {&world, &node[r / 2], &cross[r % 2]};
		int ranks[3] = {r, r % 2, r / 2};
		for (int i = 0; i < 3; i++) {
			struct host *h = &k->hosts[i];
			h->t = t;
			h->g = gs[i];
			h->rank = ranks[i];
			h->split = 1;
			h->gid = i; /* GC_GROUP_WORLD, GC_GROUP_NODE, GC_GROUP_CROSS */
			pthread_create(&h->thread, NULL, host_main, h);
		}
	}
	pthread_t th[RANKS];
	for (int r = 0; r < RANKS; r++) pthread_create(&th[r], NULL, hier_main, &ks[r]);
	for (int r = 0; r < RANKS; r++) pthread_join(th[r], NULL);
	for (int r = 0; r < RANKS; r++) OK(gc_hosted_destroy(ks[r].hosts[0].t));
	for (int r = 0; r < RANKS; r++)
		for (int i = 0; i < 3; i++) pthread_join(ks[r].hosts[i].thread, NULL);
	group_free(&world);
	for (int i = 0; i < 2; i++) {
		group_free(&node[i]);
		group_free(&cross[i]);
	}
}

static gc_engine_config hier_config(const char *spec, int r) {
	gc_engine_config c = config(spec, "hier");
	c.error_feedback = strcmp(spec, "none") != 0;
	c.node = r / 2;
	c.nodes = 2;
	c.local_rank = r % 2;
	c.local_size = 2;
	return c;
}

static void test_hier(void) {
	static struct hier_rank ks[RANKS];
	gc_engine_config cfgs[RANKS];
	/* The third run codes the node stages in bf16 (node_spec, ABI 2.5). */
	const char *specs[] = {"none", "int8", "none"}, *node_specs[] = {NULL, NULL, "bf16"};
	for (int c = 0; c < 3; c++) {
		const char *spec = specs[c];
		for (int r = 0; r < RANKS; r++) {
			cfgs[r] = hier_config(spec, r);
			cfgs[r].node_spec = node_specs[c];
		}
		hier_run(ks, cfgs);
		double worst = 0;
		int node_ops = 0, cross_ops = 0;
		for (int r = 0; r < RANKS; r++) {
			CHECK(ks[r].st == GC_OK, "hier %s: rank %d: gc_engine_create = %d (%s)", spec, r, ks[r].st, ks[r].msg);
			node_ops += ks[r].hosts[1].ops;
			cross_ops += ks[r].hosts[2].ops;
			for (int s = 0; s < STEPS && ks[r].st == GC_OK; s++)
				for (int b = 0, off = 0; b < NBUCKETS; off += (int)sizes[b], b++)
					for (int i = 0; i < (int)sizes[b]; i++) {
						double want = 0;
						for (int q = 0; q < RANKS; q++) want += gradient(q, s, b, i);
						want /= RANKS;
						double d = fabs(ks[r].avg[s][off + i] - want);
						if (d > worst) worst = d;
					}
		}
		/* Dense: the gradients are multiples of 1/64, so every partial
		 * sum and halving is exact. int8 with error feedback: within a
		 * quantization step of the average. bf16 node stages: within
		 * bf16's rounding (8 significant bits) of the average. */
		double tol = node_specs[c] != NULL ? 0.05 : strcmp(spec, "none") == 0 ? 0 : 0.5;
		CHECK(worst <= tol, "hier %s: the result is %g from the average, want at most %g", spec, worst, tol);
		CHECK(node_ops > 0 && cross_ops > 0, "hier %s: %d node ops, %d cross-node ops: want both", spec, node_ops,
		      cross_ops);
		CHECK(strstr(ks[0].reason, "hierarchical (2 nodes") != NULL, "hier %s: bucket 0's reason %s", spec,
		      ks[0].reason);
		if (c == 1 && ks[0].state != NULL) {
			/* The state records the layout: another one is refused. */
			gc_engine_config other = hier_config(spec, 0);
			OK(gc_engine_state_check(ks[0].state, ks[0].state_len, &other, sizes, NBUCKETS, RANKS));
			other.nodes = 4;
			other.local_size = 1;
			FAILS(gc_engine_state_check(ks[0].state, ks[0].state_len, &other, sizes, NBUCKETS, RANKS),
			      GC_ERR_CORRUPT, "layout 2 nodes × 2 ranks, this engine has 4 nodes × 1 ranks");
			other = hier_config(spec, 1);
			FAILS(gc_engine_state_check(ks[0].state, ks[0].state_len, &other, sizes, NBUCKETS, RANKS),
			      GC_ERR_CORRUPT, "local rank 0 of 2");
		}
		printf("hier %-5s node %-4s 4 ranks as 2 nodes x 2, %d steps: %d node and %d cross-node ops carried out, "
		       "largest difference from the average %g\n", spec, node_specs[c] ? node_specs[c] : "fp32", STEPS,
		       node_ops, cross_ops, worst);
		for (int r = 0; r < RANKS; r++) free(ks[r].state);
	}

	/* Bad topologies: every rank gets GC_ERR_CONFIG at once. */
	struct {
		const char *name, *want;
		int rank, node, nodes, local_rank, local_size;
	} bad[] = {
		{"hier without a topology", "strategy hier needs this rank's place", 2, 0, 0, 0, 0},
		{"a local rank out of range", "local_rank 2 of local_size 2", 2, 1, 2, 2, 2},
		{"3 nodes x 2 on 4 ranks", "want nodes × local size = 4", 2, 1, 3, 0, 2},
		{"two ranks at one place", "ranks disagree on the topology", 3, 1, 2, 0, 2},
	};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		for (int r = 0; r < RANKS; r++) cfgs[r] = hier_config("int8", r);
		gc_engine_config *c = &cfgs[bad[i].rank];
		c->node = bad[i].node;
		c->nodes = bad[i].nodes;
		c->local_rank = bad[i].local_rank;
		c->local_size = bad[i].local_size;
		double t0 = now();
		hier_run(ks, cfgs);
		double took = now() - t0;
		for (int r = 0; r < RANKS; r++)
			CHECK(ks[r].st == GC_ERR_CONFIG && strstr(ks[r].msg, bad[i].want) != NULL,
			      "%s: rank %d: gc_engine_create = %d (%s), want GC_ERR_CONFIG saying \"%s\"", bad[i].name, r,
			      ks[r].st, ks[r].msg, bad[i].want);
		CHECK(took < 5, "%s: took %.2f s", bad[i].name, took);
		printf("hier refused, %s: on every rank in %.2f s: %s\n", bad[i].name, took, ks[0].msg);
	}
}

int main(void) {
	size_t live = 1;
	OK(gc_live_handles(&live));
	CHECK(live == 0, "%zu live handles at start", live);
	test_golden();
	test_hier();
	test_lowrank();
	test_untaken();
	test_invalid_config();
	test_config_size();
	test_nomem();
	test_guard();
	test_names();
	for (int launched = 0; launched < 2; launched++) {
		test_fault(FAULT_ERROR, "host error", GC_OK, "injected host failure", launched);
		test_fault(FAULT_WRONG_LENGTH, "wrong length", GC_ERR_STATE, "", launched);
		test_fault(FAULT_HUGE_LENGTH, "implausible length", GC_ERR_INVALID,
		           "recv_bytes 9223372036854775808 is not a plausible length", launched);
		test_fault(FAULT_UNKNOWN_ID, "unknown id", GC_ERR_STATE, "", launched);
		test_fault(FAULT_TWICE, "completed twice", GC_ERR_STATE, "", launched);
	}
	test_dead_peer();
	test_take_after_destroy();
	test_misuse_and_states();
	OK(gc_live_handles(&live));
	CHECK(live == 0, "%zu handles still live at the end", live);
	printf("capi_engine_test: %d checks, %d failed (libgradcomp %s, ABI %#x)\n", checks, failures, gc_version(),
	       gc_abi_version());
	return failures != 0;
}

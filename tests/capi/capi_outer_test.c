/*
 * capi_outer_test.c — the outer loop through the C ABI (gc_outer_*, ABI
 * 2.11) on rank threads whose collectives the program carries out itself
 * (capi_host.h's hosts, as capi_engine_test.c runs engines).
 *
 * DiLoCo (codec none, Nesterov) on 2 ranks against a reference computed
 * here, bit for bit, over 3 syncs; the reports and gc_outer_due against the
 * schedule (streaming: 2 fragments, delay 1); SparseLoCo's settings
 * (top-k, error feedback with feedback_decay, SGD) saved mid-run and
 * resumed in new loops bit for bit, and a damaged state refused on every
 * rank; configurations refused on every rank (sizes this library does not
 * read, ranks that disagree, a device or shapes in the engine config, null
 * params); misuse of the handles.
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
#include <unistd.h>

#include "gradcomp.h"
#include "capi_check.h"
#include "capi_host.h"

_Static_assert(sizeof(gc_outer_config) == 72 && offsetof(gc_outer_config, alpha) == 16 &&
                   offsetof(gc_outer_config, lr) == 32 && offsetof(gc_outer_config, fragment_of) == 56,
               "gc_outer_config is 72 bytes, alpha at 16, lr at 32, fragment_of at 56 (ABI 2.11)");
_Static_assert(sizeof(gc_outer_report) == 64 && offsetof(gc_outer_report, step) == 32 &&
                   offsetof(gc_outer_report, first_skipped) == 60,
               "gc_outer_report is 64 bytes, step at 32, first_skipped at 60 (ABI 2.11)");

#define RANKS 2
#define NT 3     /* tensors */
#define MAXN 40  /* the largest */
#define STEPS 12 /* inner steps of a run */
#define SETTLED 11 /* the streaming runs' last step: no sync in flight after it (a loop destroyed with one
                    * leaves its peer's host waiting for the group's timeout) */
static const uint64_t sizes[NT] = {40, 7, 25};

/* An inner step's gradient: a multiple of 1/64. */
static float grad(int r, int s, int t, int i) { return (float)((r * 131 + s * 17 + t * 7 + i * 3) % 41 - 20) / 64.0f; }

/* The inner optimizer: p ← p − g/8 (exact on these values). */
static void inner(float p[NT][MAXN], int r, int s) {
	for (int t = 0; t < NT; t++)
		for (uint64_t i = 0; i < sizes[t]; i++) p[t][i] -= grad(r, s, t, (int)i) / 8.0f;
}

/* Rank r's initial weights (create makes rank 0's everyone's). */
static void init(float p[NT][MAXN], int r) {
	for (int t = 0; t < NT; t++)
		for (uint64_t i = 0; i < sizes[t]; i++) p[t][i] = (float)((r + 1) * ((int)(i * 5 + t) % 11 - 5)) / 32.0f;
}

static gc_engine_config engine_config(const char *spec) {
	gc_engine_config c;
	memset(&c, 0, sizeof c);
	c.size = sizeof c;
	c.spec = spec;
	c.error_feedback = strcmp(spec, "none") != 0;
	c.decision = "compressed";
	c.timeout_seconds = 10;
	c.workers = 1;
	c.device = -1;
	return c;
}

static gc_outer_config outer_config(int sync_every) {
	gc_outer_config c;
	memset(&c, 0, sizeof c);
	c.size = sizeof c;
	c.sync_every = sync_every;
	return c;
}

/* One step of a rank: what gc_outer_due said before it and what it
 * reported. */
struct step_record {
	gc_outer_report rep;
	int32_t started[NT], finished[NT], skipped[NT];
	int32_t due_starts[NT], due_finishes[NT];
	size_t ndue_starts, ndue_finishes;
};

/* One rank: its weights, its loop and its steps. */
struct worker {
	struct host *host;
	int r;
	const gc_outer_config *ocfg;
	const gc_engine_config *ecfg;
	float p[NT][MAXN];
	float *ptrs[NT];
	const void *params; /* what create passes: ptrs, or NULL */
	gc_outer o;
	gc_status st;
	char msg[512];
	int from, to; /* the inner steps to run, s = from+1 ... to */
	struct step_record steps[STEPS];
};

static void record(struct worker *w, gc_status st) {
	if (w->st == GC_OK) {
		w->st = st;
		snprintf(w->msg, sizeof w->msg, "%s", st == GC_OK ? "" : gc_last_error());
	}
}

static void *create_main(void *arg) {
	struct worker *w = arg;
	for (int t = 0; t < NT; t++) w->ptrs[t] = w->p[t];
	record(w, gc_outer_create(w->host->t, w->ocfg, w->ecfg, w->params, sizes, NT, &w->o));
	return NULL;
}

/* run_main runs inner steps from+1 to to: the inner optimizer, then
 * gc_outer_due and gc_outer_step, keeping both answers. */
static void *run_main(void *arg) {
	struct worker *w = arg;
	for (int s = w->from; s < w->to && w->st == GC_OK; s++) {
		inner(w->p, w->r, s);
		struct step_record *k = &w->steps[s];
		record(w, gc_outer_due(w->o, k->due_starts, k->due_finishes, NT, &k->ndue_starts, &k->ndue_finishes));
		k->rep = (gc_outer_report){.size = sizeof k->rep, .capacity = NT, .started = k->started,
		                           .finished = k->finished, .skipped = k->skipped};
		record(w, gc_outer_step(w->o, &k->rep));
	}
	return NULL;
}

/* on runs fn on every worker at once. */
static void on(struct worker *ws, void *(*fn)(void *)) {
	pthread_t th[RANKS];
	for (int r = 0; r < RANKS; r++) pthread_create(&th[r], NULL, fn, &ws[r]);
	for (int r = 0; r < RANKS; r++) pthread_join(th[r], NULL);
}

/* start gives each worker r its host, ocfg and ecfg and its initial
 * weights, and creates the loops; 1 when every rank's create succeeded. */
static int start(struct worker *ws, struct host *hs, const gc_outer_config *ocfg, const gc_engine_config *ecfg) {
	for (int r = 0; r < RANKS; r++) {
		memset(&ws[r], 0, sizeof ws[r]);
		ws[r] = (struct worker){.host = &hs[r], .r = r, .ocfg = ocfg, .ecfg = ecfg};
		ws[r].params = ws[r].ptrs;
		init(ws[r].p, r);
	}
	on(ws, create_main);
	int ok = 1;
	for (int r = 0; r < RANKS; r++) {
		CHECK(ws[r].st == GC_OK, "rank %d: gc_outer_create = %d (%s)", r, ws[r].st, ws[r].msg);
		ok &= ws[r].st == GC_OK;
	}
	return ok;
}

static void run(struct worker *ws, int from, int to) {
	for (int r = 0; r < RANKS; r++) ws[r].from = from, ws[r].to = to;
	on(ws, run_main);
	for (int r = 0; r < RANKS; r++) CHECK(ws[r].st == GC_OK, "rank %d: steps %d to %d: %d (%s)", r, from + 1, to, ws[r].st, ws[r].msg);
}

static void stop(struct worker *ws) {
	for (int r = 0; r < RANKS; r++)
		if (ws[r].o) OK(gc_outer_destroy(ws[r].o));
}

/* global reads rank r's θ_global, every tensor. */
static void global(struct worker *w, float g[NT][MAXN]) {
	for (int t = 0; t < NT; t++) OK(gc_outer_global(w->o, (size_t)t, g[t], sizes[t]));
}

/* same is memcmp of two ranks' weights, tensor by tensor. */
static int same(float a[NT][MAXN], float b[NT][MAXN]) {
	for (int t = 0; t < NT; t++)
		if (memcmp(a[t], b[t], sizeof(float) * sizes[t]) != 0) return 0;
	return 1;
}

/* DiLoCo: every 4 steps all tensors are averaged (codec none) and the
 * global weights take torch's SGD(nesterov=True, lr=0.7, momentum=0.9)
 * step; the local weights become the global ones. The reference below
 * does the same in float32, every product rounded on its own. */
static void test_diloco(void) {
	enum { H = 4 };
	struct group g;
	struct host hs[RANKS];
	struct worker ws[RANKS];
	group_init(&g, RANKS, 10);
	hosts_start(hs, &g, RANKS, 0);
	gc_outer_config ocfg = outer_config(H);
	gc_engine_config ecfg = engine_config("none");
	if (start(ws, hs, &ocfg, &ecfg)) {
		run(ws, 0, STEPS);
		static float loc[RANKS][NT][MAXN], glob[NT][MAXN], mom[NT][MAXN];
		memset(mom, 0, sizeof mom);
		for (int r = 0; r < RANKS; r++) init(loc[r], 0);
		init(glob, 0);
		const float lr = 0.7f, mu = 0.9f;
		for (int s = 0; s < STEPS; s++) {
			for (int r = 0; r < RANKS; r++) inner(loc[r], r, s);
			if ((s + 1) % H != 0) continue;
			for (int t = 0; t < NT; t++)
				for (uint64_t i = 0; i < sizes[t]; i++) {
					float sum = 0;
					for (int r = 0; r < RANKS; r++) sum += glob[t][i] - loc[r][t][i];
					float avg = sum / RANKS;
					float mm = mu * mom[t][i];
					mom[t][i] = mm + avg;
					float nm = mu * mom[t][i];
					float step = lr * (avg + nm);
					glob[t][i] -= step;
					for (int r = 0; r < RANKS; r++) loc[r][t][i] = glob[t][i];
				}
		}
		for (int r = 0; r < RANKS; r++) {
			float gl[NT][MAXN];
			global(&ws[r], gl);
			CHECK(same(gl, glob) && same(ws[r].p, loc[r]), "rank %d: DiLoCo's global or local weights differ from the reference", r);
			for (int s = 0; s < STEPS; s++) {
				gc_outer_report *rep = &ws[r].steps[s].rep;
				int sync = (s + 1) % H == 0;
				CHECK(rep->step == (uint64_t)s + 1 && rep->nstarted == (uint32_t)sync && rep->nfinished == (uint32_t)sync &&
				          rep->nskipped == 0 && rep->first_skipped == -1 && (rep->bytes_sent > 0) == sync &&
				          (!sync || (rep->started[0] == 0 && rep->finished[0] == 0)),
				      "rank %d step %d: report step %llu, %u started, %u finished, %u skipped (first %d), %llu bytes", r, s + 1,
				      (unsigned long long)rep->step, rep->nstarted, rep->nfinished, rep->nskipped, rep->first_skipped,
				      (unsigned long long)rep->bytes_sent);
			}
		}
		printf("DiLoCo, 2 ranks, H = %d, %d steps (%d syncs, codec none, Nesterov): bit-identical to the reference; "
		       "%llu bytes sent by rank 0 per sync\n",
		       H, STEPS, STEPS / H, (unsigned long long)ws[0].steps[H - 1].rep.bytes_sent);
	}
	stop(ws);
	hosts_stop(hs, RANKS);
	group_free(&g);
}

/* Streaming: F = 2 (tensors 0 and 1 in fragment 1, tensor 2 in fragment
 * 0, by fragment_of), H = 4, τ = 1, α = 0.5, int4 with error feedback:
 * fragment 0 starts at 2, 6, 10, fragment 1 at 4 and 8, each finishing a
 * step later; gc_outer_due names beforehand what each step reports; the
 * ranks' global weights agree. */
static void test_streaming(void) {
	struct group g;
	struct host hs[RANKS];
	struct worker ws[RANKS];
	group_init(&g, RANKS, 10);
	hosts_start(hs, &g, RANKS, 1);
	static const int32_t of[NT] = {1, 1, 0};
	gc_outer_config ocfg = outer_config(4);
	ocfg.delay = 1;
	ocfg.alpha = 0.5;
	ocfg.fragment_of = of;
	gc_engine_config ecfg = engine_config("int4");
	if (start(ws, hs, &ocfg, &ecfg)) {
		int32_t layout[NT];
		size_t nfrag = 0;
		OK(gc_outer_layout(ws[0].o, layout, NT, &nfrag));
		CHECK(nfrag == 2 && memcmp(layout, of, sizeof of) == 0, "layout: %zu fragments, %d %d %d", nfrag, layout[0], layout[1], layout[2]);
		OK(gc_outer_layout(ws[0].o, NULL, 0, &nfrag));
		FAILS(gc_outer_layout(ws[0].o, layout, 2, &nfrag), GC_ERR_SIZE, "ntensors 2: the loop has 3 tensors");
		run(ws, 0, SETTLED);
		for (int r = 0; r < RANKS; r++)
			for (int s = 0; s < SETTLED; s++) {
				struct step_record *k = &ws[r].steps[s];
				int step = s + 1;
				int starts = step % 2 == 0 ? (step % 4 == 2 ? 0 : 1) : -1;                         /* fragment starting, or -1 */
				int finishes = step % 2 == 1 && step > 1 ? ((step - 1) % 4 == 2 ? 0 : 1) : -1; /* finishing, or -1 */
				CHECK(k->rep.nstarted == (starts >= 0) && (starts < 0 || k->started[0] == starts) &&
				          k->rep.nfinished == (finishes >= 0) && (finishes < 0 || k->finished[0] == finishes) &&
				          (k->rep.bytes_sent > 0) == (finishes >= 0),
				      "rank %d step %d: %u started (%d), %u finished (%d), %llu bytes; want start %d, finish %d", r, step,
				      k->rep.nstarted, k->started[0], k->rep.nfinished, k->finished[0], (unsigned long long)k->rep.bytes_sent,
				      starts, finishes);
				CHECK(k->ndue_starts == k->rep.nstarted && k->ndue_finishes == k->rep.nfinished &&
				          (k->ndue_starts == 0 || k->due_starts[0] == k->started[0]) &&
				          (k->ndue_finishes == 0 || k->due_finishes[0] == k->finished[0]),
				      "rank %d step %d: gc_outer_due said %zu starts, %zu finishes; the step reported %u, %u", r, step,
				      k->ndue_starts, k->ndue_finishes, k->rep.nstarted, k->rep.nfinished);
			}
		float g0[NT][MAXN], g1[NT][MAXN];
		global(&ws[0], g0);
		global(&ws[1], g1);
		CHECK(same(g0, g1), "streaming: the ranks' global weights differ");
		printf("streaming, F = 2, H = 4, delay 1, alpha 0.5, int4 with error feedback (hosts launched): the schedule "
		       "and gc_outer_due as expected, the ranks' global weights identical\n");
	}
	stop(ws);
	hosts_stop(hs, RANKS);
	group_free(&g);
}

/* save returns the loop's state (gc_outer_state_size, then save). */
static uint8_t *save(gc_outer o, size_t *len) {
	OK(gc_outer_state_size(o, len));
	uint8_t *b = malloc(*len);
	size_t written = 0;
	FAILS(gc_outer_state_save(o, b, *len - 1, &written), GC_ERR_SIZE, "the state needs");
	CHECK(written == *len, "a short buffer: written %zu, want %zu", written, *len);
	OK(gc_outer_state_save(o, b, *len, &written));
	CHECK(written == *len, "written %zu, size said %zu", written, *len);
	return b;
}

struct loader {
	struct worker *w;
	const uint8_t *src;
	size_t len;
	gc_status st;
	char msg[512];
};

static void *load_main(void *arg) {
	struct loader *l = arg;
	l->st = gc_outer_state_load(l->w->o, l->src, l->len);
	snprintf(l->msg, sizeof l->msg, "%s", l->st == GC_OK ? "" : gc_last_error());
	return NULL;
}

static void load_all(struct loader *ls) {
	pthread_t th[RANKS];
	for (int r = 0; r < RANKS; r++) pthread_create(&th[r], NULL, load_main, &ls[r]);
	for (int r = 0; r < RANKS; r++) pthread_join(th[r], NULL);
}

/* SparseLoCo's settings (top-k 25 %, error feedback decayed by 0.9, SGD
 * lr 1) on F = 2, H = 4, τ = 1: states saved after step 6, with
 * fragment 0's sync in flight, and loaded into new loops (the params
 * restored by the caller) give the uninterrupted run's next 5 steps bit
 * for bit; a damaged state is refused on every rank, nothing changed. */
static void test_resume(void) {
	enum { SAVE_AT = 6 };
	struct group g;
	struct host hs[RANKS];
	struct worker ws[RANKS];
	gc_outer_config ocfg = outer_config(4);
	ocfg.fragments = 2;
	ocfg.delay = 1;
	ocfg.optimizer = GC_OUTER_SGD;
	ocfg.lr = 1;
	gc_engine_config ecfg = engine_config("topk:0.25");
	ecfg.feedback_decay = 0.9;
	uint8_t *states[RANKS] = {0};
	size_t lens[RANKS] = {0};
	static float at_save[RANKS][NT][MAXN], want_p[RANKS][NT][MAXN], want_g[RANKS][NT][MAXN];
	group_init(&g, RANKS, 10);
	hosts_start(hs, &g, RANKS, 0);
	if (start(ws, hs, &ocfg, &ecfg)) {
		run(ws, 0, SAVE_AT);
		for (int r = 0; r < RANKS; r++) {
			memcpy(at_save[r], ws[r].p, sizeof at_save[r]);
			states[r] = save(ws[r].o, &lens[r]);
		}
		run(ws, SAVE_AT, SETTLED);
		for (int r = 0; r < RANKS; r++) {
			memcpy(want_p[r], ws[r].p, sizeof want_p[r]);
			global(&ws[r], want_g[r]);
		}
	}
	stop(ws);
	hosts_stop(hs, RANKS);
	group_free(&g);
	if (!states[0] || !states[1]) return;

	group_init(&g, RANKS, 10);
	hosts_start(hs, &g, RANKS, 0);
	if (start(ws, hs, &ocfg, &ecfg)) {
		struct loader ls[RANKS];
		uint8_t *bad = malloc(lens[1]);
		memcpy(bad, states[1], lens[1]);
		bad[lens[1] / 2] ^= 1;
		for (int r = 0; r < RANKS; r++) ls[r] = (struct loader){.w = &ws[r], .src = r ? bad : states[r], .len = lens[r]};
		load_all(ls);
		for (int r = 0; r < RANKS; r++)
			CHECK(ls[r].st == GC_ERR_CORRUPT, "a damaged state on rank 1: rank %d: gc_outer_state_load = %d (%s), want GC_ERR_CORRUPT",
			      r, ls[r].st, ls[r].msg);
		printf("damaged state refused on every rank: %s\n", ls[0].msg);
		free(bad);
		for (int r = 0; r < RANKS; r++) ls[r] = (struct loader){.w = &ws[r], .src = states[r], .len = lens[r]};
		load_all(ls);
		for (int r = 0; r < RANKS; r++) {
			CHECK(ls[r].st == GC_OK, "rank %d: gc_outer_state_load = %d (%s)", r, ls[r].st, ls[r].msg);
			memcpy(ws[r].p, at_save[r], sizeof at_save[r]); /* the caller restores its params */
		}
		size_t ns = 0, nf = 0;
		int32_t st[NT], fi[NT];
		OK(gc_outer_due(ws[0].o, st, fi, NT, &ns, &nf));
		CHECK(ns == 0 && nf == 1 && fi[0] == 0, "after the load, step 7: due %zu starts, %zu finishes (%d); want fragment 0 to finish",
		      ns, nf, fi[0]);
		run(ws, SAVE_AT, SETTLED);
		for (int r = 0; r < RANKS; r++) {
			float gl[NT][MAXN];
			global(&ws[r], gl);
			CHECK(same(ws[r].p, want_p[r]) && same(gl, want_g[r]), "rank %d: the resumed run differs from the uninterrupted one", r);
		}
		printf("SparseLoCo settings (topk:0.25, feedback_decay 0.9, sgd lr 1, F = 2, delay 1): saved at step %d with a sync "
		       "in flight (%zu bytes), resumed bit for bit through step %d\n",
		       SAVE_AT, lens[0], SETTLED);
	}
	stop(ws);
	hosts_stop(hs, RANKS);
	group_free(&g);
	free(states[0]);
	free(states[1]);
}

/* refused runs create on both ranks, rank 1 with ocfg1, ecfg1 and (but
 * for null_params) its params, and checks that every rank gets
 * GC_ERR_CONFIG at once with a message saying want. */
static void refused(const char *name, const gc_outer_config *ocfg1, const gc_engine_config *ecfg1, int null_params,
                    const char *want) {
	struct group g;
	struct host hs[RANKS];
	struct worker ws[RANKS];
	gc_outer_config ocfg = outer_config(4);
	gc_engine_config ecfg = engine_config("none");
	group_init(&g, RANKS, 30);
	hosts_start(hs, &g, RANKS, 0);
	for (int r = 0; r < RANKS; r++) {
		memset(&ws[r], 0, sizeof ws[r]);
		ws[r] = (struct worker){.host = &hs[r], .r = r, .ocfg = r ? ocfg1 : &ocfg, .ecfg = r ? ecfg1 : &ecfg};
		ws[r].params = r && null_params ? NULL : ws[r].ptrs;
	}
	double t0 = now();
	on(ws, create_main);
	double took = now() - t0;
	for (int r = 0; r < RANKS; r++) {
		CHECK(ws[r].st == GC_ERR_CONFIG && ws[r].o == 0 && strstr(ws[r].msg, want) != NULL,
		      "%s: rank %d: gc_outer_create = %d (%s), want GC_ERR_CONFIG saying %s", name, r, ws[r].st, ws[r].msg, want);
		if (ws[r].o) OK(gc_outer_destroy(ws[r].o));
	}
	CHECK(took < 10, "%s: took %.2f s (timeout 30 s)", name, took);
	printf("refused, %-24s every rank GC_ERR_CONFIG after %.2f s: %s\n", name, took, ws[0].msg);
	hosts_stop(hs, RANKS);
	group_free(&g);
}

/* Configurations refused on every rank at once, naming rank 1 and what
 * it got wrong: its ocfg's size (one this library does not read: the
 * struct's size field is the last readable bytes before an unreadable
 * page, so a read past it would fault), its sync_every (disagreeing with
 * rank 0's), its delay, its engine config's device, shapes or
 * feedback_decay, its params. */
static void test_refused(void) {
	long page = sysconf(_SC_PAGESIZE);
	uint8_t *mem = mmap(NULL, 2 * (size_t)page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	CHECK(mem != MAP_FAILED && mprotect(mem + page, (size_t)page, PROT_NONE) == 0, "mmap/mprotect: %s", strerror(errno));
	if (mem == MAP_FAILED) return;
	gc_engine_config ecfg = engine_config("none");
	static const uint32_t bad_sizes[] = {0, 64, 80, 0xFFFFFFFFu};
	for (size_t i = 0; i < sizeof bad_sizes / sizeof bad_sizes[0]; i++) {
		gc_outer_config *at = (gc_outer_config *)(mem + page - 4);
		at->size = bad_sizes[i];
		char want[160], name[32];
		snprintf(want, sizeof want, "rank 1: invalid ocfg: ocfg->size %u: this library (ABI 2.11) reads a gc_outer_config of 72 bytes;",
		         bad_sizes[i]);
		snprintf(name, sizeof name, "ocfg->size %u", bad_sizes[i]);
		refused(name, at, &ecfg, 0, want);
	}
	munmap(mem, 2 * (size_t)page);
	gc_outer_config other = outer_config(5);
	refused("sync_every 5 against 4", &other, &ecfg, 0, "ranks disagree on SyncEvery: rank 1 has 5, rank 0 has 4");
	gc_outer_config delay = outer_config(4);
	delay.delay = 4;
	refused("delay 4 with H 4", &delay, &ecfg, 0, "rank 1: invalid Delay: 4 with Fragments 1 and SyncEvery 4");
	gc_outer_config good = outer_config(4);
	gc_engine_config dev = ecfg;
	dev.device = 0;
	refused("ecfg->device 0", &good, &dev, 0, "rank 1: invalid ecfg->device: 0: the outer loop's engines average host buffers");
	static const uint64_t counts[1] = {1}, pairs[2] = {1, 40};
	gc_engine_config shaped = ecfg;
	shaped.tensor_counts = counts;
	shaped.shapes = pairs;
	refused("ecfg->shapes", &good, &shaped, 0, "rank 1: invalid ecfg->tensor_counts: the outer loop's tensor shapes are ocfg->shapes");
	refused("null params", &good, &ecfg, 1, "rank 1: invalid params: null with 3 tensors");
	gc_engine_config decay = ecfg;
	decay.feedback_decay = 0.5;
	refused("decay without feedback", &good, &decay, 0, "FeedbackDecay 0.5 needs ErrorFeedback");
}

/* Calls that fail without a collective: bad handles, reports and
 * arguments; a second loop or an engine on a transport in use. */
static void test_misuse(void) {
	struct group g;
	struct host hs[RANKS];
	struct worker ws[RANKS];
	group_init(&g, RANKS, 10);
	hosts_start(hs, &g, RANKS, 0);
	gc_outer_config ocfg = outer_config(4);
	gc_engine_config ecfg = engine_config("none");
	if (start(ws, hs, &ocfg, &ecfg)) {
		gc_outer o = ws[0].o, other = 0;
		gc_engine e = 0;
		FAILS(gc_outer_create(hs[0].t, &ocfg, &ecfg, (float *const *)ws[0].ptrs, sizes, NT, &other), GC_ERR_STATE,
		      "the transport already has an outer loop");
		FAILS(gc_engine_create(hs[0].t, &ecfg, sizes, NT, &e), GC_ERR_STATE, "the transport already has an outer loop");
		FAILS(gc_outer_create(hs[0].t, &ocfg, &ecfg, (float *const *)ws[0].ptrs, sizes, NT, NULL), GC_ERR_INVALID, "null out");
		FAILS(gc_outer_step(o, NULL), GC_ERR_INVALID, "null rep");
		gc_outer_report small = {.size = 32};
		FAILS(gc_outer_step(o, &small), GC_ERR_INVALID, "rep->size 32: want sizeof(gc_outer_report), 64 in ABI 2.11");
		float dst[MAXN];
		FAILS(gc_outer_global(o, 1, dst, 8), GC_ERR_SIZE, "tensor 1 has 7 elements, n = 8");
		FAILS(gc_outer_global(o, NT, dst, 7), GC_ERR_INVALID, "tensor 3: the loop has tensors 0 to 2");
		FAILS(gc_outer_global(o, 0, NULL, 40), GC_ERR_INVALID, "null dst");
		size_t ns, nf;
		FAILS(gc_outer_due(o, NULL, NULL, 2, &ns, &nf), GC_ERR_INVALID, "null starts or finishes");
		OK(gc_outer_due(o, NULL, NULL, 0, &ns, &nf));
		CHECK(ns == 0 && nf == 0, "due before step 1 of H 4: %zu starts, %zu finishes", ns, nf);
		FAILS(gc_outer_state_load(o, NULL, 10), GC_ERR_INVALID, "null src with 10 bytes");
		gc_outer_report rep = {.size = sizeof rep};
		FAILS(gc_outer_step(12345, &rep), GC_ERR_HANDLE, "handle 12345 is not a live outer loop");
		stop(ws);
		FAILS(gc_outer_destroy(o), GC_ERR_HANDLE, "is not a live outer loop");
		/* The transports are free again. */
		for (int r = 0; r < RANKS; r++) ws[r].o = 0;
		CHECK(start(ws, hs, &ocfg, &ecfg), "a new loop on the freed transports");
		stop(ws);
	}
	hosts_stop(hs, RANKS);
	group_free(&g);
}

/* gc_name lists the outer optimizers by value. */
static void test_names(void) {
	CHECK(strcmp(gc_name(GC_NAMES_OUTER_OPTIMIZER, GC_OUTER_NESTEROV), "nesterov") == 0 &&
	          strcmp(gc_name(GC_NAMES_OUTER_OPTIMIZER, GC_OUTER_SGD), "sgd") == 0 &&
	          strcmp(gc_name(GC_NAMES_OUTER_OPTIMIZER, GC_OUTER_NONE), "none") == 0 &&
	          gc_name(GC_NAMES_OUTER_OPTIMIZER, 3) == NULL,
	      "GC_NAMES_OUTER_OPTIMIZER: want nesterov, sgd, none");
}

int main(void) {
	size_t live = 1;
	OK(gc_live_handles(&live));
	CHECK(live == 0, "%zu live handles at start", live);
	test_names();
	test_diloco();
	test_streaming();
	test_resume();
	test_refused();
	test_misuse();
	OK(gc_live_handles(&live));
	CHECK(live == 0, "%zu handles still live at the end", live);
	printf("capi_outer_test: %d checks, %d failed (libgradcomp %s, ABI %#x)\n", checks, failures, gc_version(),
	       gc_abi_version());
	return failures != 0;
}

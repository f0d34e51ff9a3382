// The mock NCCL's side of the device hooks, as libnccl.so.2's mock keeps
// them: gcmock_set_device_hooks stores the two functions; the rest calls
// them as the mock does.
#include <stddef.h>
#include <stdint.h>
#include "hooktest.h"

static gcmock_current_device_fn current_device;
static gcmock_launch_fn launch;

void gcmock_set_device_hooks(gcmock_current_device_fn c, gcmock_launch_fn l) {
	current_device = c;
	launch = l;
}

uintptr_t hooktest_set_hooks_addr(void) { return (uintptr_t)gcmock_set_device_hooks; }

int hooktest_current_device(void) { return current_device ? current_device() : -2; }

static void run(void *arg) { hooktestRun((uintptr_t)arg); }

int hooktest_launch(uintptr_t stream, int device, uintptr_t handle, char *err, size_t errcap) {
	if (!launch) {
		return -2;
	}
	return launch((void *)stream, device, run, (void *)handle, err, errcap);
}

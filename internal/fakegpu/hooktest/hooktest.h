#include <stddef.h>
#include <stdint.h>

typedef int (*gcmock_current_device_fn)(void);
typedef int (*gcmock_launch_fn)(void *stream, int device, void (*fn)(void *), void *arg, char *err, size_t errcap);

void gcmock_set_device_hooks(gcmock_current_device_fn c, gcmock_launch_fn l);
uintptr_t hooktest_set_hooks_addr(void);
int hooktest_current_device(void);
int hooktest_launch(uintptr_t stream, int device, uintptr_t handle, char *err, size_t errcap);
extern void hooktestRun(uintptr_t handle);

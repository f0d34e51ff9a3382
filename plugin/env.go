package main

/*
#include <stdlib.h>
*/
import "C"

import "unsafe"

// getenv reads the process's environment as it is now (C's getenv). A Go
// shared library's os.Getenv sees the environment the process started
// with; the host program (Python's os.environ, for one) may have set a
// variable since, before it loaded the library or made the call.
func getenv(name string) string {
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	if v := C.getenv(cname); v != nil {
		return C.GoString(v)
	}
	return ""
}

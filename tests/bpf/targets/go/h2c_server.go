// A net/http server speaking HTTP/2 cleartext with prior knowledge (Go 1.24+:
// http.Protocols.SetUnencryptedHTTP2), each request making real libcudart calls through
// cgo that encode it, in the shape of tests/bpf/targets/h2_apps.py:
//
//	GET /infer?id=N   cudaMemcpy of 100000+N bytes (H2D), 2 x cudaLaunchKernel with grid
//	                  (N, 1, 1), 10 ms asleep, 2 more launches, cudaMemcpy of 200000+N
//	                  bytes (D2H)
//
// Go's HTTP/2 server runs each stream's handler in a goroutine of its own.
// argv: libcudart path, port (0: any free port). Binds first, prints "listening on PORT"
// to stderr, serves once a line comes on stdin (tests/harness.py Target).
package main

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stddef.h>
#include <stdlib.h>

typedef struct { unsigned x, y, z; } dim3;
typedef int (*launch_fn)(const void *, dim3, dim3, void **, size_t, void *);
typedef int (*memcpy_fn)(void *, const void *, size_t, int);
static launch_fn launch;
static memcpy_fn copy;

static int load(const char *path) {
	void *h = dlopen(path, RTLD_NOW);
	if (!h) return -1;
	launch = (launch_fn)dlsym(h, "cudaLaunchKernel");
	copy = (memcpy_fn)dlsym(h, "cudaMemcpy");
	return launch && copy ? 0 : -2;
}

static int launch_grid(unsigned x) {
	dim3 grid = {x, 1, 1}, block = {32, 1, 1};
	return launch((const void *)0x1000, grid, block, NULL, 0, NULL);
}

static int copy_bytes(size_t n, int kind) { return copy(NULL, NULL, n, kind); }
*/
import "C"

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"
	"time"
	"unsafe"
)

func infer(w http.ResponseWriter, r *http.Request) {
	id64, err := strconv.ParseUint(r.URL.Query().Get("id"), 10, 32)
	if err != nil || id64 == 0 {
		http.Error(w, "id wanted", http.StatusBadRequest)
		return
	}
	id := C.uint(id64)
	C.copy_bytes(C.size_t(100000+id64), 1)
	C.launch_grid(id)
	C.launch_grid(id)
	time.Sleep(10 * time.Millisecond)
	C.launch_grid(id)
	C.launch_grid(id)
	C.copy_bytes(C.size_t(200000+id64), 2)
	fmt.Fprintf(w, "%d\n", id64)
}

func main() {
	path := C.CString(os.Args[1])
	defer C.free(unsafe.Pointer(path))
	if rc := C.load(path); rc != 0 {
		fmt.Fprintln(os.Stderr, "cannot load", os.Args[1], rc)
		os.Exit(1)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:"+os.Args[2])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Fprintf(os.Stderr, "listening on %d\n", ln.Addr().(*net.TCPAddr).Port)
	bufio.NewReader(os.Stdin).ReadString('\n')
	mux := http.NewServeMux()
	mux.HandleFunc("/infer", infer)
	var protocols http.Protocols
	protocols.SetHTTP1(true)
	protocols.SetUnencryptedHTTP2(true)
	srv := &http.Server{Handler: mux, Protocols: &protocols,
		HTTP2: &http.HTTP2Config{MaxConcurrentStreams: 256}}
	fmt.Fprintln(os.Stderr, "serving")
	srv.Serve(ln)
}

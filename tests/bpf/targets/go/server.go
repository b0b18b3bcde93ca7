// A net/http server whose handlers make real libcudart calls through cgo, each call
// encoding the request it is made for, so every child span can be checked:
//
//	GET /infer?id=N&launches=K&mode=M   K x cudaLaunchKernel with grid (N, 1, 1), then one
//	                                    cudaMemcpy of N bytes (H2D), a 2 ms sleep between
//	                                    calls (the goroutine parks: it changes threads)
//
// M (where the calls are made):
//
//	handler  the handler's goroutine
//	fanout   K goroutines the handler starts and waits for (sync.WaitGroup), one
//	         launch each; the copy from the handler
//	locked   the handler's goroutine after runtime.LockOSThread
//	batch    a batcher goroutine started at startup: handlers queue their request and
//	         wait; each step launches once per queued request (grid = its id), then
//	         cudaDeviceSynchronize, prints "step S ids I..." to stderr and answers them
//
// argv: libcudart path, port (0: any free port), "background" (optional: a goroutine
// started at startup launches grid (0, 1, 1) every 2 ms: work for no request).
// Binds first, prints "listening on PORT" to stderr, serves once a line comes on stdin
// (tests/harness.py Target).
package main

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stddef.h>
#include <stdlib.h>

typedef struct { unsigned x, y, z; } dim3;
typedef int (*launch_fn)(const void *, dim3, dim3, void **, size_t, void *);
typedef int (*memcpy_fn)(void *, const void *, size_t, int);
typedef int (*sync_fn)(void);
static launch_fn launch;
static memcpy_fn copy;
static sync_fn sync_device;

static int load(const char *path) {
	void *h = dlopen(path, RTLD_NOW);
	if (!h) return -1;
	launch = (launch_fn)dlsym(h, "cudaLaunchKernel");
	copy = (memcpy_fn)dlsym(h, "cudaMemcpy");
	sync_device = (sync_fn)dlsym(h, "cudaDeviceSynchronize");
	return launch && copy && sync_device ? 0 : -2;
}

static int launch_grid(unsigned x) {
	dim3 grid = {x, 1, 1}, block = {32, 1, 1};
	return launch((const void *)0x1000, grid, block, NULL, 0, NULL);
}

static int copy_bytes(size_t n) { return copy(NULL, NULL, n, 1); }
static int synchronize(void) { return sync_device(); }
*/
import "C"

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"
	"unsafe"
)

const pause = 2 * time.Millisecond

type job struct {
	id   uint
	done chan struct{}
}

var queue = make(chan job, 1024)

func infer(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	id64, err := strconv.ParseUint(q.Get("id"), 10, 32)
	launches, err2 := strconv.Atoi(q.Get("launches"))
	if err != nil || err2 != nil || id64 == 0 {
		http.Error(w, "id and launches wanted", http.StatusBadRequest)
		return
	}
	id := uint(id64)
	switch q.Get("mode") {
	case "handler":
		calls(id, launches)
	case "locked":
		runtime.LockOSThread()
		calls(id, launches)
		runtime.UnlockOSThread()
	case "fanout":
		var wg sync.WaitGroup
		for i := 0; i < launches; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				time.Sleep(pause)
				C.launch_grid(C.uint(id))
			}()
		}
		wg.Wait()
		C.copy_bytes(C.size_t(id))
	case "batch":
		j := job{id, make(chan struct{})}
		queue <- j
		<-j.done
	default:
		http.Error(w, "unknown mode", http.StatusBadRequest)
		return
	}
	fmt.Fprintf(w, "%d\n", id)
}

func calls(id uint, launches int) {
	for i := 0; i < launches; i++ {
		C.launch_grid(C.uint(id))
		time.Sleep(pause)
	}
	C.copy_bytes(C.size_t(id))
}

// batcher runs every queued request's calls in steps, as an inference engine's loop does.
func batcher() {
	for step := 1; ; step++ {
		batch := []job{<-queue}
		time.Sleep(pause) // let more requests queue up
	more:
		for {
			select {
			case j := <-queue:
				batch = append(batch, j)
			default:
				break more
			}
		}
		ids := make([]string, len(batch))
		for i, j := range batch {
			C.launch_grid(C.uint(j.id))
			ids[i] = strconv.Itoa(int(j.id))
		}
		C.synchronize()
		fmt.Fprintf(os.Stderr, "step %d ids %s\n", step, strings.Join(ids, " "))
		for _, j := range batch {
			close(j.done)
		}
	}
}

func background() {
	for {
		C.launch_grid(0)
		time.Sleep(pause)
	}
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
	go batcher()
	if len(os.Args) > 3 && os.Args[3] == "background" {
		go background()
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/infer", infer)
	http.Serve(ln, mux)
}

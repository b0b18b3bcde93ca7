// Goroutines that make CUDA calls through cgo, each launch naming its goroutine:
// grid.x = the goroutine's id (runtime.Stack's "goroutine N"). Every goroutine parks
// (time.Sleep) between its launches, so the scheduler moves it between OS threads.
//
// argv: libcudart path, goroutines, launches per goroutine. Prints "ready <pid>",
// waits for a line on stdin, runs, prints "done <launches>" and one "g <goid> <parent
// goid>" line per goroutine (the parent as the runtime's traceback says it).
package main

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stddef.h>
#include <stdlib.h>

typedef struct { unsigned x, y, z; } dim3;
typedef int (*launch_fn)(const void *, dim3, dim3, void **, size_t, void *);
static launch_fn launch;

static int load(const char *path) {
	void *h = dlopen(path, RTLD_NOW);
	if (!h) return -1;
	launch = (launch_fn)dlsym(h, "cudaLaunchKernel");
	return launch ? 0 : -2;
}

static int launch_grid(unsigned x) {
	dim3 grid = {x, 1, 1}, block = {32, 1, 1};
	return launch((const void *)0x1000, grid, block, NULL, 0, NULL);
}
*/
import "C"

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"sync"
	"time"
	"unsafe"
)

// goid is the running goroutine's id, from the first line of its traceback.
func goid() uint64 {
	buf := make([]byte, 64)
	buf = buf[:runtime.Stack(buf, false)]
	fields := bytes.Fields(buf)
	id, _ := strconv.ParseUint(string(fields[1]), 10, 64)
	return id
}

func main() {
	path := C.CString(os.Args[1])
	defer C.free(unsafe.Pointer(path))
	if rc := C.load(path); rc != 0 {
		fmt.Fprintln(os.Stderr, "cannot load", os.Args[1], rc)
		os.Exit(1)
	}
	workers, _ := strconv.Atoi(os.Args[2])
	launches, _ := strconv.Atoi(os.Args[3])
	fmt.Printf("ready %d\n", os.Getpid())
	bufio.NewReader(os.Stdin).ReadString('\n')

	var wg sync.WaitGroup
	var mu sync.Mutex
	ids := map[uint64]bool{}
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := goid()
			mu.Lock()
			ids[id] = true
			mu.Unlock()
			for i := 0; i < launches; i++ {
				C.launch_grid(C.uint(id))
				time.Sleep(time.Millisecond)
			}
		}()
	}
	wg.Wait()
	fmt.Printf("done %d\n", workers*launches)
	for id := range ids {
		fmt.Printf("g %d %d\n", id, goid())
	}
}

// Item 14's target: bench/launch_loop.c's loop made from a Go program (cgo), as a Go
// inference server calls its engine: each rep is one cgo call that launches `iters`
// kernels (the real libcudart), inside one HTTP request that the goroutine which read it
// answers after the loop. Same protocol as launch_loop.c with --http: "port <p>",
// "ready <pid>", a line on stdin, then the request; "rep <i> <wall ns> <thread CPU ns>"
// per rep (per launch), "launched <n>", "done".
//
// With --wakes, each rep is `iters` round trips between two goroutines over unbuffered
// channels instead (GOMAXPROCS 1: every send readies the other goroutine, one
// runtime.runqput each), timed in the process's CPU: "rep <i> <wall ns> <CPU ns>" per
// round trip.
//
// argv: libcudart path [--iters N] [--reps R] [--wakes] [--http] (always a request:
// --http is taken for launch_loop.c's sake)
package main

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stddef.h>
#include <stdlib.h>
#include <time.h>

typedef struct { unsigned x, y, z; } dim3;
typedef int (*launch_fn)(const void *, dim3, dim3, void **, size_t, void *);
static launch_fn launch;

static int load(const char *path) {
	void *h = dlopen(path, RTLD_NOW);
	launch = h ? (launch_fn)dlsym(h, "cudaLaunchKernel") : NULL;
	return launch ? 0 : -1;
}

static double clock_s(clockid_t c) {
	struct timespec ts;
	clock_gettime(c, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

// Launches n kernels; wall and thread CPU seconds through *wall and *cpu.
static void launch_n(long n, double *wall, double *cpu) {
	dim3 grid = {1, 1, 1}, block = {32, 1, 1};
	double t0 = clock_s(CLOCK_MONOTONIC), c0 = clock_s(CLOCK_THREAD_CPUTIME_ID);
	for (long i = 0; i < n; i++)
		launch((const void *)0x1000, grid, block, NULL, 0, NULL);
	*cpu = clock_s(CLOCK_THREAD_CPUTIME_ID) - c0;
	*wall = clock_s(CLOCK_MONOTONIC) - t0;
}

static double process_cpu_s(void) { return clock_s(CLOCK_PROCESS_CPUTIME_ID); }
static double wall_s(void) { return clock_s(CLOCK_MONOTONIC); }
*/
import "C"

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"os"
	"runtime"
	"strconv"
	"unsafe"
)

// pingPong: n round trips between this goroutine and another over unbuffered channels;
// wall and process CPU seconds.
func pingPong(n int64) (float64, float64) {
	ping, pong := make(chan struct{}), make(chan struct{})
	go func() {
		for range ping {
			pong <- struct{}{}
		}
	}()
	t0, c0 := float64(C.wall_s()), float64(C.process_cpu_s())
	for i := int64(0); i < n; i++ {
		ping <- struct{}{}
		<-pong
	}
	wall, cpu := float64(C.wall_s())-t0, float64(C.process_cpu_s())-c0
	close(ping)
	return wall, cpu
}

func main() {
	path := C.CString(os.Args[1])
	defer C.free(unsafe.Pointer(path))
	iters, reps, wakes := int64(1000000), 5, false
	for i := 2; i < len(os.Args); i++ {
		switch os.Args[i] {
		case "--wakes":
			wakes = true
			runtime.GOMAXPROCS(1)
		case "--iters":
			if i+1 < len(os.Args) {
				iters, _ = strconv.ParseInt(os.Args[i+1], 10, 64)
				i++
			}
		case "--reps":
			if i+1 < len(os.Args) {
				reps, _ = strconv.Atoi(os.Args[i+1])
				i++
			}
		}
	}
	if C.load(path) != 0 {
		fmt.Fprintln(os.Stderr, "cannot load cudaLaunchKernel from", os.Args[1])
		os.Exit(1)
	}
	var wall, cpu C.double
	C.launch_n(10000, &wall, &cpu) // warm-up: the first call initialises the runtime
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Printf("port %d\nready %d\n", ln.Addr().(*net.TCPAddr).Port, os.Getpid())
	bufio.NewReader(os.Stdin).ReadString('\n')
	conn, err := ln.Accept()
	if err != nil {
		os.Exit(1)
	}
	head := make([]byte, 0, 512)
	buf := make([]byte, 512)
	for !bytes.Contains(head, []byte("\r\n\r\n")) {
		n, err := conn.Read(buf)
		if err != nil {
			os.Exit(1)
		}
		head = append(head, buf[:n]...)
	}
	for r := 0; r < reps; r++ {
		if wakes {
			w, c := pingPong(iters)
			fmt.Printf("rep %d %.2f %.2f\n", r, w*1e9/float64(iters), c*1e9/float64(iters))
			continue
		}
		C.launch_n(C.long(iters), &wall, &cpu)
		fmt.Printf("rep %d %.2f %.2f\n", r, float64(wall)*1e9/float64(iters), float64(cpu)*1e9/float64(iters))
	}
	if wakes {
		iters = 0 // no launch made
	}
	fmt.Printf("launched %d\n", iters*int64(reps))
	conn.Write([]byte("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"))
	conn.Close()
	fmt.Println("done")
}

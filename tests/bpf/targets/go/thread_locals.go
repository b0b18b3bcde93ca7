// A cgo program whose C code has thread-locals of its own: the system linker lays
// them out in the TLS block with Go's runtime.tlsg, which is then not at -8.
package main

/*
__thread long big[64];
__thread long x;
static long touch(void) { big[1] = 1; x = 2; return big[1] + x; }
*/
import "C"

import "fmt"

func main() { fmt.Println(C.touch()) }

package agent

import (
	"bufio"
	"fmt"
	"io"
)

// PrefixWriter returns a writer that writes each line written to it to w,
// after prefix: the output of a process run beside others (a VM runner, a
// node), told apart in one stream. Close it once the writing is done;
// lines longer than 1 MiB are cut.
func PrefixWriter(prefix string, w io.Writer) io.WriteCloser {
	pr, pw := io.Pipe()
	go func() {
		s := bufio.NewScanner(pr)
		s.Buffer(make([]byte, 64*1024), 1024*1024)
		for s.Scan() {
			fmt.Fprintf(w, "%s%s\n", prefix, s.Text())
		}
		_, _ = io.Copy(io.Discard, pr)
	}()
	return pw
}

// Package scenario runs the compat scenario contract (compat-tests/SCENARIOS in
// the project notes) for one Go client: it owns the output format, the
// per-scenario time bound, topic naming and the record checks, so the franz-go
// and sarama programs differ only in how they talk to the broker.
package scenario

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"
)

// IDs lists every scenario id in the order the contract runs them.
var IDs = []string{
	"admin.topics",
	"codec.none", "codec.gzip", "codec.snappy", "codec.lz4", "codec.zstd",
	"idempotent",
	"group.commit",
	"seek.earliest", "seek.latest", "seek.timestamp",
	"large.near_max", "large.above_max",
	"partitions.many",
	"unknown.autocreate", "unknown.noautocreate",
	// Only the programs that implement it run it (franz-go; sarama does not yet).
	"group.rebalance",
	// Transactions (issue 30): franz-go only so far.
	"txn.commit", "txn.abort", "txn.offsets",
}

// Timeout bounds one scenario; the contract allows 60 s and a hung client
// must not stop the others from reporting.
const Timeout = 55 * time.Second

// GroupTimeout bounds the consumer-group scenarios, which wait for several
// rebalances (the contract's upper bound is 90 s).
const GroupTimeout = 85 * time.Second

func timeoutFor(id string) time.Duration {
	if strings.HasPrefix(id, "group.rebalance") {
		return GroupTimeout
	}
	return Timeout
}

// Env is what a scenario knows about its run.
type Env struct {
	Bootstrap string
	Family    string
	runID     string
}

// Topic names a topic uniquely for this run, so reruns never collide with
// topics a broker kept: compat-<family>-<scenario>-<random>.
func (e *Env) Topic(scenarioID string) string {
	return fmt.Sprintf("compat-%s-%s-%s", e.Family, strings.ReplaceAll(scenarioID, ".", "-"), e.runID)
}

// Logf writes diagnostics to stderr; stdout carries only RESULT lines.
func Logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "[%s %s] %s\n", time.Now().UTC().Format("15:04:05.000"), "go", fmt.Sprintf(format, args...))
}

type naError struct{ why string }

func (e naError) Error() string { return e.why }

// NA marks a scenario the client's API cannot express.
func NA(why string) error { return naError{why} }

// Func runs one scenario and returns a short detail on success.
type Func func(ctx context.Context, env *Env) (string, error)

// Main parses `<bootstrap> [scenario-id ...]`, runs the selected scenarios in
// contract order and exits 0 iff none failed.
func Main(family string, funcs map[string]Func) {
	if len(os.Args) < 2 {
		fmt.Fprintf(os.Stderr, "usage: %s <bootstrap> [scenario-id ...]\n", os.Args[0])
		os.Exit(2)
	}
	env := &Env{Bootstrap: os.Args[1], Family: family, runID: randomID()}
	// Without ids: every contract id this program implements.
	var selected []string
	for _, id := range IDs {
		if _, ok := funcs[id]; ok {
			selected = append(selected, id)
		}
	}
	if len(os.Args) > 2 {
		selected = nil
		wanted := map[string]bool{}
		for _, id := range os.Args[2:] {
			if _, ok := funcs[id]; !ok {
				fmt.Fprintf(os.Stderr, "unknown scenario id %q (known: %s)\n", id, strings.Join(IDs, " "))
				os.Exit(2)
			}
			wanted[id] = true
		}
		for _, id := range IDs {
			if wanted[id] {
				selected = append(selected, id)
			}
		}
	}
	failed := 0
	for _, id := range selected {
		status, detail := runOne(env, id, funcs[id])
		if status == "FAIL" {
			failed++
		}
		fmt.Printf("RESULT %s %s %s\n", id, status, oneLine(detail))
	}
	if failed > 0 {
		os.Exit(1)
	}
}

func runOne(env *Env, id string, f Func) (status, detail string) {
	if f == nil {
		return "FAIL", "scenario not implemented by this program"
	}
	Logf("scenario %s: start", id)
	started := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), timeoutFor(id))
	defer cancel()
	type outcome struct {
		detail string
		err    error
	}
	done := make(chan outcome, 1)
	go func() {
		defer func() {
			if r := recover(); r != nil {
				done <- outcome{err: fmt.Errorf("panic: %v", r)}
			}
		}()
		d, err := f(ctx, env)
		done <- outcome{d, err}
	}()
	var o outcome
	// A client call that ignores its context must not hang the run: after the
	// deadline plus a grace period the scenario is reported as timed out and
	// its goroutine is abandoned.
	select {
	case o = <-done:
	case <-time.After(timeoutFor(id) + 3*time.Second):
		o = outcome{err: errors.New("timeout")}
	}
	Logf("scenario %s: done in %s (err=%v)", id, time.Since(started).Round(time.Millisecond), o.err)
	var na naError
	switch {
	case o.err == nil:
		return "PASS", o.detail
	case errors.As(o.err, &na):
		return "NA", na.why
	case ctx.Err() != nil && !strings.Contains(o.err.Error(), "timeout"):
		return "FAIL", "timeout: " + o.err.Error()
	default:
		return "FAIL", o.err.Error()
	}
}

func oneLine(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > 400 {
		s = s[:400] + "..."
	}
	return s
}

func randomID() string {
	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		return fmt.Sprintf("%d", time.Now().UnixNano())
	}
	return fmt.Sprintf("%d-%s", time.Now().UnixMilli()%100000000, hex.EncodeToString(b[:]))
}

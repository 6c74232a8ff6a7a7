package main

import (
	"encoding/binary"
	"math/rand"
	"net"
	"os"
	"testing"
	"time"
)

func TestSplitStreamTakesOnlyWholeFrames(t *testing.T) {
	a, b := apiVersionsFrame(1), metadataAllTopicsFrame(2)
	stream := []byte{3}
	for _, f := range [][]byte{a, b} {
		stream = binary.BigEndian.AppendUint32(stream, uint32(len(f)))
		stream = append(stream, f...)
	}
	frames, ok := splitStream(stream)
	if !ok || len(frames) != 2 || string(frames[0]) != string(a) || string(frames[1]) != string(b) {
		t.Fatalf("split %v %d", ok, len(frames))
	}
	if _, ok := splitStream(stream[:len(stream)-1]); ok {
		t.Fatal("a torn stream split")
	}
}

func TestMutateNeverPanicsAndKeepsSomeFramesWhole(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	frames := [][]byte{apiVersionsFrame(1), metadataAllTopicsFrame(2), {0, 1}}
	same := 0
	for i := 0; i < 10000; i++ {
		out := mutate(rng, frames)
		if string(out) == string(frames[0]) || string(out) == string(frames[1]) {
			same++
		}
	}
	if same == 0 {
		t.Fatal("no frame was sent unchanged")
	}
}

// fakeBroker answers every frame with its correlation id and error code 0,
// as ApiVersions does, and closes a connection whose frame is over 1 MiB.
func fakeBroker(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func(c net.Conn) {
				defer c.Close()
				for {
					body, err := readFrame(c, 1<<20)
					if err != nil || len(body) < 8 {
						return
					}
					resp := append(append([]byte(nil), body[4:8]...), 0, 0)
					if writeFrame(c, resp) != nil {
						return
					}
				}
			}(c)
		}
	}()
	return l.Addr().String()
}

func TestRunMeasuresALiveBroker(t *testing.T) {
	addr := fakeBroker(t)
	frames := [][]byte{apiVersionsFrame(1), metadataAllTopicsFrame(2)}
	res := run(addr, os.Getpid(), 1500*time.Millisecond, 4, frames, 7, 2*time.Second)
	if res.Requests == 0 || res.Responses == 0 || res.Connections < 4 {
		t.Fatalf("nothing sent: %+v", res)
	}
	if res.LivenessChecks == 0 || res.LivenessFailures != 0 || res.Died {
		t.Fatalf("liveness: %+v", res)
	}
	if res.PeakRSSMiB <= 0 {
		t.Fatalf("no RSS sampled: %+v", res)
	}
}

func TestRunReportsADeadBroker(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // nothing listens: every liveness check fails
	res := run(addr, 0, 1500*time.Millisecond, 1, [][]byte{apiVersionsFrame(1)}, 7, 500*time.Millisecond)
	if res.LivenessFailures == 0 || res.FirstLivenessError == "" {
		t.Fatalf("a dead address passed: %+v", res)
	}
}

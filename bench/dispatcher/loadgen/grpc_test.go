package main

import (
	"fmt"
	"net"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protowire"
)

// frame is a raw gRPC message, for the fake server below.
type frame struct{ b []byte }

type frameCodec struct{}

func (frameCodec) Marshal(v any) ([]byte, error) { return v.(*frame).b, nil }
func (frameCodec) Unmarshal(data []byte, v any) error {
	v.(*frame).b = append([]byte(nil), data...)
	return nil
}
func (frameCodec) Name() string { return "proto" }

// fakeGRPCQueue serves Receive and Ack of dispatcher.proto by hand over a
// fixed set of messages, each leased once, like fakeQueue does over HTTP.
type fakeGRPCQueue struct {
	mu     sync.Mutex
	next   int
	total  int
	leased map[string]bool
	acked  map[string]int
	queues map[string]bool
}

func (q *fakeGRPCQueue) handle(_ any, stream grpc.ServerStream) error {
	method, _ := grpc.MethodFromServerStream(stream)
	in := &frame{}
	if err := stream.RecvMsg(in); err != nil {
		return err
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	var out []byte
	switch method {
	case receiveMethod:
		max := 0
		_ = eachField(in.b, func(num protowire.Number, _ protowire.Type, v []byte, x uint64) error {
			switch num {
			case 1:
				q.queues[string(v)] = true
			case 2:
				max = int(x)
			}
			return nil
		})
		for n := 0; n < max && q.next < q.total; n++ {
			receipt := fmt.Sprintf("r-%d", q.next)
			q.leased[receipt] = true
			var d []byte
			d = protowire.AppendTag(d, 1, protowire.BytesType)
			d = protowire.AppendString(d, fmt.Sprint(q.next))
			d = protowire.AppendTag(d, 2, protowire.BytesType)
			d = protowire.AppendString(d, receipt)
			d = protowire.AppendTag(d, 4, protowire.BytesType)
			d = protowire.AppendBytes(d, make([]byte, 1024))
			d = protowire.AppendTag(d, 6, protowire.VarintType)
			d = protowire.AppendVarint(d, 1)
			d = protowire.AppendTag(d, 9, protowire.VarintType) // offset: a field loadgen skips
			d = protowire.AppendVarint(d, uint64(q.next))
			out = protowire.AppendTag(out, 1, protowire.BytesType)
			out = protowire.AppendBytes(out, d)
			q.next++
		}
	case ackMethod:
		_ = eachField(in.b, func(num protowire.Number, _ protowire.Type, v []byte, _ uint64) error {
			if num != 2 {
				return nil
			}
			receipt := string(v)
			status := uint64(2) // stale
			if q.leased[receipt] && q.acked[receipt] == 0 {
				status = receiptStatusOK
			}
			q.acked[receipt]++
			var r []byte
			r = protowire.AppendTag(r, 1, protowire.BytesType)
			r = protowire.AppendString(r, receipt)
			r = protowire.AppendTag(r, 2, protowire.VarintType)
			r = protowire.AppendVarint(r, status)
			out = protowire.AppendTag(out, 1, protowire.BytesType)
			out = protowire.AppendBytes(out, r)
			return nil
		})
	default:
		return fmt.Errorf("unexpected method %s", method)
	}
	return stream.SendMsg(&frame{b: out})
}

func TestGRPCWorkersAckEveryMessageOnce(t *testing.T) {
	q := &fakeGRPCQueue{total: 1000, leased: map[string]bool{}, acked: map[string]int{}, queues: map[string]bool{}}
	srv := grpc.NewServer(grpc.ForceServerCodec(frameCodec{}), grpc.UnknownServiceHandler(q.handle))
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(lis)
	defer srv.Stop()

	cfg := testConfig("", 1000)
	cfg.API, cfg.GRPCAddr = "grpc", lis.Addr().String()
	res := Run(t.Context(), cfg, func() (api, error) { return newGRPCAPI(cfg) })
	if res.Status != "ok" || res.Acked != 1000 || res.Failed != 0 || res.Errors != 0 {
		t.Fatalf("result status=%s acked=%d failed=%d errors=%d cycles=%d last=%s", res.Status, res.Acked, res.Failed, res.Errors, res.Cycles, res.LastError)
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	for i := 0; i < 1000; i++ {
		if n := q.acked[fmt.Sprintf("r-%d", i)]; n != 1 {
			t.Fatalf("message %d acked %d times", i, n)
		}
	}
	if !q.queues["bench"] || len(q.queues) != 1 {
		t.Fatalf("receives named queues %v", q.queues)
	}
}

func TestGRPCReceiveDecodesWhatAWorkerReads(t *testing.T) {
	var d []byte
	d = protowire.AppendTag(d, 1, protowire.BytesType)
	d = protowire.AppendString(d, "id-1")
	d = protowire.AppendTag(d, 2, protowire.BytesType)
	d = protowire.AppendString(d, "receipt-1")
	d = protowire.AppendTag(d, 4, protowire.BytesType)
	d = protowire.AppendBytes(d, []byte("payload"))
	d = protowire.AppendTag(d, 6, protowire.VarintType)
	d = protowire.AppendVarint(d, 3)
	d = protowire.AppendTag(d, 9, protowire.VarintType)
	d = protowire.AppendVarint(d, 42)
	var b []byte
	b = protowire.AppendTag(b, 1, protowire.BytesType)
	b = protowire.AppendBytes(b, d)
	resp := &receiveResponse{}
	if err := resp.unmarshal(b); err != nil {
		t.Fatal(err)
	}
	b[len(b)-len(d)+4] = 'X' // the decoded message must not alias the buffer
	want := receivedMessage{MessageID: "id-1", Receipt: "receipt-1", Attempt: 3, Payload: []byte("payload")}
	if len(resp.messages) != 1 || fmt.Sprint(resp.messages[0]) != fmt.Sprint(want) {
		t.Fatalf("decoded %+v", resp.messages)
	}
	if err := (&receiveResponse{}).unmarshal([]byte{0x0a, 0x05, 0x01}); err == nil {
		t.Fatal("a truncated response was accepted")
	}
	if err := (&receiveResponse{}).unmarshal(protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), nil)); err == nil {
		t.Fatal("a delivery without a receipt was accepted")
	}
}

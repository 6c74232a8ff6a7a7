package main

// The gRPC side of the load generator: the same receive -> ack loop over the
// dispatcher's gRPC API (dispatcher-sidecar/proto/dispatcher.proto).
//
// The messages are encoded and decoded by hand with protowire rather than
// by protoc-generated code, so that building loadgen needs no protoc. The
// decoder does what generated code does for the fields a worker reads: it
// copies each delivery's message id, receipt and payload out of the
// response (the payload is the work), and skips the rest.

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protowire"
)

const (
	receiveMethod = "/dispatcher.v1.Dispatcher/Receive"
	ackMethod     = "/dispatcher.v1.Dispatcher/Ack"
	// ReceiptStatus RECEIPT_STATUS_OK.
	receiptStatusOK = 1
)

// grpcAPI is one worker's gRPC connection (HTTP/2): each worker has its own,
// as each HTTP worker has its own keep-alive connection.
type grpcAPI struct {
	cfg  Config
	conn *grpc.ClientConn
}

func newGRPCAPI(cfg Config) (*grpcAPI, error) {
	conn, err := grpc.NewClient(cfg.GRPCAddr,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.ForceCodec(wireCodec{}), grpc.MaxCallRecvMsgSize(maxResponseBytes)))
	if err != nil {
		return nil, err
	}
	return &grpcAPI{cfg: cfg, conn: conn}, nil
}

func (g *grpcAPI) Close() error { return g.conn.Close() }

func (g *grpcAPI) receive(ctx context.Context, consumer string) ([]receivedMessage, error) {
	req := &receiveRequest{
		queue:       g.cfg.Queue,
		maxMessages: uint64(g.cfg.Batch),
		wait:        uint64(g.cfg.Wait / time.Second),
		lease:       uint64(g.cfg.Lease / time.Second),
		consumer:    consumer,
	}
	resp := &receiveResponse{}
	reqCtx, cancel := context.WithTimeout(ctx, g.cfg.Wait+30*time.Second)
	defer cancel()
	if err := g.conn.Invoke(reqCtx, receiveMethod, req, resp); err != nil {
		return nil, fmt.Errorf("receive: %w", err)
	}
	return resp.messages, nil
}

func (g *grpcAPI) ack(ctx context.Context, receipts []string) (ok, notOK int64, err error) {
	req := &ackRequest{queue: g.cfg.Queue, receipts: receipts}
	resp := &ackResponse{}
	reqCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := g.conn.Invoke(reqCtx, ackMethod, req, resp); err != nil {
		return 0, 0, fmt.Errorf("ack: %w", err)
	}
	if len(resp.statuses) != len(receipts) {
		return 0, 0, fmt.Errorf("ack: %d results for %d receipts", len(resp.statuses), len(receipts))
	}
	for _, s := range resp.statuses {
		if s == receiptStatusOK {
			ok++
		} else {
			notOK++
		}
	}
	return ok, notOK, nil
}

// wireCodec hands gRPC the bytes of the hand-written messages below.
type wireCodec struct{}

type wireMessage interface {
	marshal() []byte
	unmarshal([]byte) error
}

func (wireCodec) Marshal(v any) ([]byte, error) {
	m, ok := v.(wireMessage)
	if !ok {
		return nil, fmt.Errorf("wireCodec: cannot marshal %T", v)
	}
	return m.marshal(), nil
}

// Unmarshal decodes at once: gRPC reuses data once it returns.
func (wireCodec) Unmarshal(data []byte, v any) error {
	m, ok := v.(wireMessage)
	if !ok {
		return fmt.Errorf("wireCodec: cannot unmarshal into %T", v)
	}
	return m.unmarshal(data)
}

// Name is "proto": what the server expects in the content type.
func (wireCodec) Name() string { return "proto" }

// ReceiveRequest: queue = 1, max_messages = 2, wait_seconds = 3,
// lease_seconds = 4, consumer_id = 5.
type receiveRequest struct {
	queue                    string
	maxMessages, wait, lease uint64
	consumer                 string
}

func (r *receiveRequest) marshal() []byte {
	b := protowire.AppendTag(nil, 1, protowire.BytesType)
	b = protowire.AppendString(b, r.queue)
	b = protowire.AppendTag(b, 2, protowire.VarintType)
	b = protowire.AppendVarint(b, r.maxMessages)
	b = protowire.AppendTag(b, 3, protowire.VarintType)
	b = protowire.AppendVarint(b, r.wait)
	b = protowire.AppendTag(b, 4, protowire.VarintType)
	b = protowire.AppendVarint(b, r.lease)
	b = protowire.AppendTag(b, 5, protowire.BytesType)
	return protowire.AppendString(b, r.consumer)
}

func (*receiveRequest) unmarshal([]byte) error { return fmt.Errorf("receiveRequest is only sent") }

// ReceiveResponse: messages = 1 (Delivery: message_id = 1, receipt = 2,
// payload = 4, attempt = 6).
type receiveResponse struct {
	messages []receivedMessage
}

func (*receiveResponse) marshal() []byte { return nil }

func (r *receiveResponse) unmarshal(b []byte) error {
	return eachField(b, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) error {
		if num != 1 || typ != protowire.BytesType {
			return nil
		}
		var m receivedMessage
		err := eachField(v, func(num protowire.Number, typ protowire.Type, v []byte, x uint64) error {
			switch {
			case num == 1 && typ == protowire.BytesType:
				m.MessageID = string(v)
			case num == 2 && typ == protowire.BytesType:
				m.Receipt = string(v)
			case num == 4 && typ == protowire.BytesType:
				m.Payload = append([]byte(nil), v...)
			case num == 6 && typ == protowire.VarintType:
				m.Attempt = int(x)
			}
			return nil
		})
		if err != nil {
			return err
		}
		if m.Receipt == "" {
			return fmt.Errorf("receive response has a message without a receipt")
		}
		r.messages = append(r.messages, m)
		return nil
	})
}

// AckRequest: queue = 1, receipts = 2.
type ackRequest struct {
	queue    string
	receipts []string
}

func (r *ackRequest) marshal() []byte {
	size := len(r.queue) + 8
	for _, s := range r.receipts {
		size += len(s) + 4
	}
	b := make([]byte, 0, size)
	b = protowire.AppendTag(b, 1, protowire.BytesType)
	b = protowire.AppendString(b, r.queue)
	for _, s := range r.receipts {
		b = protowire.AppendTag(b, 2, protowire.BytesType)
		b = protowire.AppendString(b, s)
	}
	return b
}

func (*ackRequest) unmarshal([]byte) error { return fmt.Errorf("ackRequest is only sent") }

// AckResponse: results = 1 (AckResult: receipt = 1, status = 2).
type ackResponse struct {
	statuses []uint64
}

func (*ackResponse) marshal() []byte { return nil }

func (r *ackResponse) unmarshal(b []byte) error {
	return eachField(b, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) error {
		if num != 1 || typ != protowire.BytesType {
			return nil
		}
		var status uint64 // proto3: absent is 0, RECEIPT_STATUS_UNSPECIFIED
		err := eachField(v, func(num protowire.Number, typ protowire.Type, _ []byte, x uint64) error {
			if num == 2 && typ == protowire.VarintType {
				status = x
			}
			return nil
		})
		r.statuses = append(r.statuses, status)
		return err
	})
}

// eachField calls f with each field of an encoded message: the bytes of a
// length-delimited field, or the value of a varint; other types are skipped.
func eachField(b []byte, f func(protowire.Number, protowire.Type, []byte, uint64) error) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		var (
			v []byte
			x uint64
		)
		switch typ {
		case protowire.BytesType:
			v, n = protowire.ConsumeBytes(b)
		case protowire.VarintType:
			x, n = protowire.ConsumeVarint(b)
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		if err := f(num, typ, v, x); err != nil {
			return err
		}
	}
	return nil
}

package scenario

import (
	"bytes"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Header is one record header, client-neutral.
type Header struct {
	Key   string
	Value []byte
}

// Record is a produced or consumed record, client-neutral. Offset is -1 for a
// record not yet produced.
type Record struct {
	Partition   int32
	Offset      int64
	Key         []byte
	Value       []byte
	Headers     []Header
	TimestampMs int64
}

// CodecCount is the record count of the codec and idempotent scenarios.
const CodecCount = 1000

// BaseTimestampMs is T0 for the scenarios' explicit CreateTime timestamps: an
// hour in the past and whole seconds, so every timestamp lies inside any
// broker's accepted window (Kafka 4 rejects timestamps over an hour ahead).
func BaseTimestampMs() int64 {
	return time.Now().Add(-time.Hour).Truncate(time.Second).UnixMilli()
}

// Numbered builds n records spread over the partitions by index
// (record i goes to partition i % partitions), each with a key, a value that
// compresses (it repeats the tag), two headers and timestamp t0 + i*stepMs.
func Numbered(n, partitions int, tag string, t0, stepMs int64) []Record {
	out := make([]Record, n)
	for i := range out {
		out[i] = Record{
			Partition: int32(i % partitions),
			Offset:    -1,
			Key:       []byte(fmt.Sprintf("key-%06d", i)),
			Value:     []byte(fmt.Sprintf("value-%06d-%s", i, strings.Repeat(tag, 8))),
			Headers: []Header{
				{Key: "index", Value: []byte(strconv.Itoa(i))},
				{Key: "origin", Value: []byte("compat-go-" + tag)},
			},
			TimestampMs: t0 + int64(i)*stepMs,
		}
	}
	return out
}

// VerifyExactly checks that got holds every expected record exactly once,
// identical in key, value, headers (order included) and timestamp, on the
// expected partition, with each partition's records in produce order at
// offsets contiguous from zero (the topic is new and not transactional).
func VerifyExactly(expected, got []Record) error {
	byKey := make(map[string]int, len(expected))
	for i, r := range expected {
		byKey[string(r.Key)] = i
	}
	seen := make([]bool, len(expected))
	perPartition := map[int32][]Record{}
	for _, r := range got {
		i, ok := byKey[string(r.Key)]
		if !ok {
			return fmt.Errorf("unexpected key %q at partition %d offset %d", r.Key, r.Partition, r.Offset)
		}
		if seen[i] {
			return fmt.Errorf("key %q read twice (partition %d offset %d)", r.Key, r.Partition, r.Offset)
		}
		seen[i] = true
		if err := sameRecord(expected[i], r); err != nil {
			return err
		}
		perPartition[r.Partition] = append(perPartition[r.Partition], r)
	}
	for i, s := range seen {
		if !s {
			return fmt.Errorf("read %d of %d records; first missing key %q", len(got), len(expected), expected[i].Key)
		}
	}
	for p, rs := range perPartition {
		sort.SliceStable(rs, func(a, b int) bool { return rs[a].Offset < rs[b].Offset })
		for j, r := range rs {
			if r.Offset != int64(j) {
				return fmt.Errorf("partition %d: offsets not contiguous from 0: position %d has offset %d", p, j, r.Offset)
			}
			if j > 0 && byKey[string(r.Key)] < byKey[string(rs[j-1].Key)] {
				return fmt.Errorf("partition %d: order differs from produce order at offset %d (%q after %q)", p, r.Offset, r.Key, rs[j-1].Key)
			}
		}
	}
	return nil
}

func sameRecord(want, got Record) error {
	where := fmt.Sprintf("key %q (partition %d offset %d)", want.Key, got.Partition, got.Offset)
	if got.Partition != want.Partition {
		return fmt.Errorf("%s: partition %d, produced to %d", where, got.Partition, want.Partition)
	}
	if !bytes.Equal(got.Value, want.Value) {
		return fmt.Errorf("%s: value differs (%d bytes, want %d)", where, len(got.Value), len(want.Value))
	}
	if got.TimestampMs != want.TimestampMs {
		return fmt.Errorf("%s: timestamp %d, want CreateTime %d", where, got.TimestampMs, want.TimestampMs)
	}
	if len(got.Headers) != len(want.Headers) {
		return fmt.Errorf("%s: %d headers, want %d", where, len(got.Headers), len(want.Headers))
	}
	for i := range want.Headers {
		if got.Headers[i].Key != want.Headers[i].Key || !bytes.Equal(got.Headers[i].Value, want.Headers[i].Value) {
			return fmt.Errorf("%s: header %d is %q=%q, want %q=%q", where, i,
				got.Headers[i].Key, got.Headers[i].Value, want.Headers[i].Key, want.Headers[i].Value)
		}
	}
	return nil
}

// Sizes used by the large-record scenarios. The broker's message.max.bytes is
// 1048588: a 1,000,000-byte value fits in one batch, 1,100,000 does not.
const (
	NearMaxValueBytes  = 1_000_000
	AboveMaxValueBytes = 1_100_000
	ClientLimitBytes   = 2 << 20
)

// Payload is a deterministic, poorly compressible value of n bytes, so a
// corrupted or truncated copy is detected byte for byte.
func Payload(n int) []byte {
	b := make([]byte, n)
	x := uint32(2463534242)
	for i := range b {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		b[i] = byte(x)
	}
	return b
}

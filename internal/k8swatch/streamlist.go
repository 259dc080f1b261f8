package k8swatch

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/ebpf-proxy/ebpf-proxy/internal/kubeapi"
)

// A list of 10,000 Services or EndpointSlices, decoded as client-go does,
// is in memory three times at once: the response body, a copy of it in the
// protobuf envelope, and every decoded object, before the informer
// transforms the first of them (strip, sliceTransform) and keeps only what
// the proxy reads. That was most of the agent's peak memory. The informers
// of Services and EndpointSlices list through listStream instead: it reads
// the protobuf response as it arrives and decodes, transforms and keeps one
// item at a time, so that the peak is what the informer keeps plus one
// object. A JSON response (--kube-api-content-type=application/json, or a
// server that answers so) is decoded whole, as client-go does. Watches are
// client-go's own: they decode one event at a time already.

// protoItem is a generated API type: a pointer to T that unmarshals itself
// from protobuf.
type protoItem[T any] interface {
	*T
	runtime.Object
	Unmarshal([]byte) error
}

// protoPrefix starts a protobuf-encoded object of the API machinery: the
// rest is a runtime.Unknown (typeMeta = 1, raw = 2) whose raw is the
// object.
var protoPrefix = []byte{0x6b, 0x38, 0x73, 0x00}

// maxItemBytes bounds one encoded item: the API server's request limit is
// 3 MiB for an object (etcd's 1.5 MiB value plus room), so a larger length
// is a corrupt stream, refused before it allocates.
const maxItemBytes = 64 << 20

// streamedListWatch lists resource with listStream, each item transformed
// as it is decoded, and watches with watchFn; both with the reflector's
// options, tweaked.
func streamedListWatch[T any, PT protoItem[T]](rc rest.Interface, resource string, tweak func(*metav1.ListOptions),
	transform cache.TransformFunc, watchFn func(context.Context, metav1.ListOptions) (watch.Interface, error),
) *cache.ListWatch {
	return tweaked(tweak, func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
		return listStream[T, PT](ctx, rc, resource, opts, transform)
	}, watchFn)
}

// listStream lists resource (cluster-wide) with opts and returns a
// metav1.List of its items, each passed through transform as soon as it is
// decoded, and the list's metadata (resource version, continue token).
func listStream[T any, PT protoItem[T]](ctx context.Context, rc rest.Interface, resource string, opts metav1.ListOptions,
	transform cache.TransformFunc,
) (runtime.Object, error) {
	body, err := rc.Get().Resource(resource).VersionedParams(&opts, kubeapi.ParameterCodec).Stream(ctx)
	if err != nil {
		return nil, err
	}
	defer body.Close()
	r := bufio.NewReaderSize(body, 64<<10)
	if head, err := r.Peek(len(protoPrefix)); err != nil || !bytes.Equal(head, protoPrefix) {
		return decodeWhole(r, resource)
	}
	list, err := decodeListStream[T, PT](r, transform)
	if err != nil {
		return nil, fmt.Errorf("listing %s: %w", resource, err)
	}
	return list, nil
}

// decodeWhole decodes a response that is not protobuf (JSON) the way
// client-go does: whole.
func decodeWhole(r io.Reader, resource string) (runtime.Object, error) {
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, fmt.Errorf("listing %s: %w", resource, err)
	}
	obj, _, err := kubeapi.Codecs.UniversalDeserializer().Decode(data, nil, nil)
	if err != nil {
		return nil, fmt.Errorf("listing %s: decoding the response: %w", resource, err)
	}
	return obj, nil
}

// decodeListStream reads one protobuf-encoded list of Ts (the prefix, then
// the runtime.Unknown whose raw is the list: metadata = 1, items = 2) from
// r.
func decodeListStream[T any, PT protoItem[T]](r *bufio.Reader, transform cache.TransformFunc) (*metav1.List, error) {
	p := &pbReader{r: r}
	if _, err := p.discard(uint64(len(protoPrefix))); err != nil {
		return nil, err
	}
	list := &metav1.List{}
	found := false
	// The envelope.
	for {
		field, wire, err := p.tag()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
		switch {
		case field == 1 && wire == wireBytes:
			var tm runtime.TypeMeta
			if err := p.message(&tm); err != nil {
				return nil, fmt.Errorf("type: %w", err)
			}
			if want := listKind[T, PT](); tm.Kind != want {
				return nil, fmt.Errorf("the response is a %q, not a list (%s)", tm.Kind, want)
			}
		case field == 2 && wire == wireBytes:
			n, err := p.uvarint()
			if err != nil {
				return nil, err
			}
			if err := p.listBody(n, list, func(data []byte) error {
				obj := PT(new(T))
				if err := obj.Unmarshal(data); err != nil {
					return err
				}
				out, err := transform(obj)
				if err != nil {
					return err
				}
				item, ok := out.(runtime.Object)
				if !ok {
					return fmt.Errorf("the transform made a %T, not an API object", out)
				}
				list.Items = append(list.Items, runtime.RawExtension{Object: item})
				return nil
			}); err != nil {
				return nil, err
			}
			found = true
		default:
			if err := p.skip(wire); err != nil {
				return nil, err
			}
		}
	}
	if !found {
		return nil, errors.New("the response holds no list")
	}
	return list, nil
}

// listKind is the kind of a list of Ts ("EndpointSliceList").
func listKind[T any, PT protoItem[T]]() string {
	gvks, _, err := kubeapi.Scheme.ObjectKinds(PT(new(T)))
	if err != nil || len(gvks) == 0 {
		return "List" // not registered: no list kind matches
	}
	return gvks[0].Kind + "List"
}

// Protobuf wire types.
const (
	wireVarint  = 0
	wireFixed64 = 1
	wireBytes   = 2
	wireFixed32 = 5
)

// pbReader reads protobuf fields from a stream, counting the bytes read.
type pbReader struct {
	r   *bufio.Reader
	n   uint64
	buf []byte
}

// ReadByte implements io.ByteReader for binary.ReadUvarint.
func (p *pbReader) ReadByte() (byte, error) {
	b, err := p.r.ReadByte()
	if err == nil {
		p.n++
	}
	return b, err
}

func (p *pbReader) uvarint() (uint64, error) {
	v, err := binary.ReadUvarint(p)
	if errors.Is(err, io.EOF) {
		err = io.ErrUnexpectedEOF
	}
	return v, err
}

// tag reads a field's tag; io.EOF only at the end of the stream.
func (p *pbReader) tag() (field uint64, wire byte, err error) {
	start := p.n
	v, err := binary.ReadUvarint(p)
	if err != nil {
		if errors.Is(err, io.EOF) && p.n != start {
			err = io.ErrUnexpectedEOF
		}
		return 0, 0, err
	}
	return v >> 3, byte(v & 7), nil
}

// bytes reads a length-delimited field's contents into a buffer reused by
// the next call (generated Unmarshal methods copy what they keep).
func (p *pbReader) bytes() ([]byte, error) {
	n, err := p.uvarint()
	if err != nil {
		return nil, err
	}
	if n > maxItemBytes {
		return nil, fmt.Errorf("a field of %d bytes, more than the %d an object may have", n, maxItemBytes)
	}
	if uint64(cap(p.buf)) < n {
		p.buf = make([]byte, n)
	}
	b := p.buf[:n]
	if _, err := io.ReadFull(p.r, b); err != nil {
		return nil, unexpected(err)
	}
	p.n += n
	return b, nil
}

// message reads a length-delimited field into m.
func (p *pbReader) message(m interface{ Unmarshal([]byte) error }) error {
	b, err := p.bytes()
	if err != nil {
		return err
	}
	return m.Unmarshal(b)
}

func (p *pbReader) discard(n uint64) (int, error) {
	d, err := p.r.Discard(int(n))
	p.n += uint64(d)
	return d, unexpected(err)
}

// skip passes over a field of wire type wire whose tag was read.
func (p *pbReader) skip(wire byte) error {
	switch wire {
	case wireVarint:
		_, err := p.uvarint()
		return err
	case wireFixed64:
		_, err := p.discard(8)
		return err
	case wireFixed32:
		_, err := p.discard(4)
		return err
	case wireBytes:
		n, err := p.uvarint()
		if err != nil {
			return err
		}
		_, err = p.discard(n)
		return err
	}
	return fmt.Errorf("unknown protobuf wire type %d", wire)
}

// listBody reads a list message of n bytes: its metadata into list and
// each item's encoding to item.
func (p *pbReader) listBody(n uint64, list *metav1.List, item func([]byte) error) error {
	end := p.n + n
	for p.n < end {
		field, wire, err := p.tag()
		if err != nil {
			return unexpected(err)
		}
		switch {
		case field == 1 && wire == wireBytes:
			if err := p.message(&list.ListMeta); err != nil {
				return fmt.Errorf("list metadata: %w", err)
			}
		case field == 2 && wire == wireBytes:
			b, err := p.bytes()
			if err != nil {
				return err
			}
			if err := item(b); err != nil {
				return fmt.Errorf("item %d: %w", len(list.Items)+1, err)
			}
		default:
			if err := p.skip(wire); err != nil {
				return err
			}
		}
	}
	if p.n != end {
		return fmt.Errorf("the list's last field ends %d bytes past its end", p.n-end)
	}
	return nil
}

func unexpected(err error) error {
	if errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return err
}

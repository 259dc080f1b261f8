package k8swatch

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"reflect"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/json"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/pager"
	"k8s.io/utils/ptr"

	"github.com/ebpf-proxy/ebpf-proxy/internal/kubeapi"
	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
	"github.com/ebpf-proxy/ebpf-proxy/internal/tracker"
)

// testSlices are n EndpointSlices of Service web-<i>, each with two
// endpoints and a port, as the API server lists them.
func testSlices(n int) []discoveryv1.EndpointSlice {
	out := make([]discoveryv1.EndpointSlice, n)
	for i := range out {
		out[i] = discoveryv1.EndpointSlice{
			TypeMeta: metav1.TypeMeta{Kind: "EndpointSlice", APIVersion: "discovery.k8s.io/v1"},
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("web-%d-abc", i), Namespace: "default",
				ResourceVersion: strconv.Itoa(100 + i),
				Labels:          map[string]string{discoveryv1.LabelServiceName: fmt.Sprintf("web-%d", i)},
				ManagedFields:   []metav1.ManagedFieldsEntry{{Manager: "kube-controller-manager", Operation: "Update"}}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080), Protocol: ptr.To(v1.ProtocolTCP)}},
			Endpoints: []discoveryv1.Endpoint{
				{Addresses: []string{fmt.Sprintf("10.244.%d.%d", i/250, i%250+1)}, NodeName: ptr.To("node-a"),
					Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}},
				{Addresses: []string{fmt.Sprintf("10.245.%d.%d", i/250, i%250+1)}, NodeName: ptr.To("node-b"),
					Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(false)}},
			},
		}
	}
	return out
}

func sliceList(items []discoveryv1.EndpointSlice, rv, cont string) *discoveryv1.EndpointSliceList {
	return &discoveryv1.EndpointSliceList{
		TypeMeta: metav1.TypeMeta{Kind: "EndpointSliceList", APIVersion: "discovery.k8s.io/v1"},
		ListMeta: metav1.ListMeta{ResourceVersion: rv, Continue: cont},
		Items:    items,
	}
}

// encodeProto encodes obj as the API server does for a protobuf client.
func encodeProto(t testing.TB, obj runtime.Object) []byte {
	t.Helper()
	var b bytes.Buffer
	if err := protobuf.NewSerializer(kubeapi.Scheme, kubeapi.Scheme).Encode(obj, &b); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// keep is a transform that records what it is given and passes it on.
type keep struct{ n atomic.Int32 }

func (k *keep) transform(obj any) (any, error) {
	k.n.Add(1)
	return obj, nil
}

// items are the items of a list as the reflector extracts them.
func items(t *testing.T, obj runtime.Object) []runtime.Object {
	t.Helper()
	out, err := meta.ExtractListWithAlloc(obj)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestDecodeListStream(t *testing.T) {
	want := testSlices(300)
	data := encodeProto(t, sliceList(want, "4242", "next-page"))
	var k keep
	list, err := decodeListStream[discoveryv1.EndpointSlice](bufio.NewReader(bytes.NewReader(data)), k.transform)
	if err != nil {
		t.Fatal(err)
	}
	if list.ResourceVersion != "4242" || list.Continue != "next-page" {
		t.Errorf("list metadata %+v, want resource version 4242 and the continue token", list.ListMeta)
	}
	if int(k.n.Load()) != len(want) {
		t.Errorf("the transform saw %d items, want %d", k.n.Load(), len(want))
	}
	got := items(t, list)
	if len(got) != len(want) {
		t.Fatalf("%d items, want %d", len(got), len(want))
	}
	for i := range want {
		w := want[i]
		w.TypeMeta = metav1.TypeMeta{} // items of a list carry no type
		if g := got[i].(*discoveryv1.EndpointSlice); !reflect.DeepEqual(*g, w) {
			t.Fatalf("item %d:\n got  %+v\n want %+v", i, *g, w)
		}
	}

	t.Run("the transform's result is what is kept", func(t *testing.T) {
		h := &handlers{lanes: testLanes(t)}
		list, err := decodeListStream[discoveryv1.EndpointSlice](bufio.NewReader(bytes.NewReader(data)), h.sliceTransform)
		if err != nil {
			t.Fatal(err)
		}
		c, ok := items(t, list)[7].(*cachedSlice)
		if !ok {
			t.Fatalf("item 7 is a %T, want a *cachedSlice", items(t, list)[7])
		}
		if c.Name != "web-7-abc" || c.ResourceVersion != "107" || c.slices[0] == nil ||
			c.slices[0].Endpoints[0].Addr != netip.MustParseAddr("10.244.0.8") {
			t.Errorf("item 7 kept as %+v", c)
		}
	})
	t.Run("empty list", func(t *testing.T) {
		list, err := decodeListStream[discoveryv1.EndpointSlice](bufio.NewReader(bytes.NewReader(encodeProto(t, sliceList(nil, "7", "")))), k.transform)
		if err != nil || len(list.Items) != 0 || list.ResourceVersion != "7" {
			t.Errorf("got %+v, %v; want an empty list at resource version 7", list, err)
		}
	})
}

// testLanes is one IPv4 lane, as Watch makes for an IPv4 node.
func testLanes(t *testing.T) []lane {
	t.Helper()
	tr := tracker.New("node-a", model.DefaultOptions, model.NodePortSpec{})
	lanes, err := newLanes([]Target{{Family: v1.IPv4Protocol, Tracker: tr}}, Translator{})
	if err != nil {
		t.Fatal(err)
	}
	return lanes
}

// TestDecodeListStreamBadInput: a truncated or corrupt response is an
// error, whatever byte it ends or goes wrong at, never a panic or a
// shorter list.
func TestDecodeListStreamBadInput(t *testing.T) {
	data := encodeProto(t, sliceList(testSlices(3), "9", ""))
	// The list ends with the envelope's raw field; the empty fields after
	// it (content encoding and type) add nothing.
	p := &pbReader{r: bufio.NewReader(bytes.NewReader(data))}
	if _, err := p.discard(uint64(len(protoPrefix))); err != nil {
		t.Fatal(err)
	}
	var listEnd uint64
	for listEnd == 0 {
		field, wire, err := p.tag()
		if err != nil {
			t.Fatal(err)
		}
		if field != 2 {
			if err := p.skip(wire); err != nil {
				t.Fatal(err)
			}
			continue
		}
		n, err := p.uvarint()
		if err != nil {
			t.Fatal(err)
		}
		listEnd = p.n + n
	}
	var k keep
	for n := len(protoPrefix); n < int(listEnd); n++ {
		if _, err := decodeListStream[discoveryv1.EndpointSlice](bufio.NewReader(bytes.NewReader(data[:n])), k.transform); err == nil {
			t.Fatalf("the first %d of %d bytes decoded without an error", n, len(data))
		}
	}
	t.Run("a length past the limit", func(t *testing.T) {
		// The envelope's raw field (tag 0x12) claims 1 GiB.
		bad := append(append([]byte{}, protoPrefix...), 0x12, 0x80, 0x80, 0x80, 0x80, 0x04)
		_, err := decodeListStream[discoveryv1.EndpointSlice](bufio.NewReader(bytes.NewReader(bad)), k.transform)
		if err == nil {
			t.Fatal("no error")
		}
	})
	t.Run("a list of another type", func(t *testing.T) {
		// A ServiceList where EndpointSlices are asked for.
		svcs := &v1.ServiceList{TypeMeta: metav1.TypeMeta{Kind: "ServiceList", APIVersion: "v1"},
			Items: []v1.Service{{ObjectMeta: metav1.ObjectMeta{Name: "a"}, Spec: v1.ServiceSpec{ClusterIP: "10.96.0.1",
				Ports: []v1.ServicePort{{Port: 80}}}}}}
		_, err := decodeListStream[discoveryv1.EndpointSlice](bufio.NewReader(bytes.NewReader(encodeProto(t, svcs))), k.transform)
		if err == nil {
			t.Fatal("no error")
		}
	})
	t.Run("not a list", func(t *testing.T) {
		one := testSlices(1)[0]
		_, err := decodeListStream[discoveryv1.EndpointSlice](bufio.NewReader(bytes.NewReader(encodeProto(t, &one))), k.transform)
		if err == nil || !strings.Contains(err.Error(), "not a list") {
			t.Fatalf("got %v, want an error naming the kind", err)
		}
	})
}

// fakeAPIServer serves EndpointSlice lists as the API server does: pages
// of limit items with a continue token, in protobuf or JSON as the client
// accepts (or JSON only with jsonOnly), and 403 with a Status when forbid
// is set.
type fakeAPIServer struct {
	t        *testing.T
	slices   []discoveryv1.EndpointSlice
	jsonOnly bool
	forbid   bool
	requests atomic.Int32
}

func (s *fakeAPIServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.requests.Add(1)
	if r.URL.Path != "/apis/discovery.k8s.io/v1/endpointslices" {
		http.NotFound(w, r)
		return
	}
	if s.forbid {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusForbidden)
		fmt.Fprint(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","message":"endpointslices is forbidden: User \"system:anonymous\" cannot list resource","reason":"Forbidden","code":403}`)
		return
	}
	if got := r.URL.Query().Get("labelSelector"); got != "selected" {
		s.t.Errorf("label selector %q, want the tweaked one", got)
	}
	start, _ := strconv.Atoi(r.URL.Query().Get("continue"))
	limit, _ := strconv.Atoi(r.URL.Query().Get("limit"))
	end := len(s.slices)
	cont := ""
	if limit > 0 && start+limit < end {
		end = start + limit
		cont = strconv.Itoa(end)
	}
	list := sliceList(s.slices[start:end], "500", cont)
	if !s.jsonOnly && strings.Contains(r.Header.Get("Accept"), "application/vnd.kubernetes.protobuf") {
		w.Header().Set("Content-Type", "application/vnd.kubernetes.protobuf")
		_, _ = w.Write(encodeProto(s.t, list))
		return
	}
	w.Header().Set("Content-Type", "application/json")
	if err := json.NewSerializerWithOptions(json.DefaultMetaFactory, kubeapi.Scheme, kubeapi.Scheme, json.SerializerOptions{}).Encode(list, w); err != nil {
		s.t.Error(err)
	}
}

// listOf is the list function of the EndpointSlice informer that Watch
// makes (selecting "selected"), against srv, as the reflector calls it.
func listOf(t *testing.T, srv *httptest.Server, contentType string, transform cache.TransformFunc) func(context.Context, metav1.ListOptions) (runtime.Object, error) {
	t.Helper()
	cfg := &rest.Config{Host: srv.URL, ContentConfig: rest.ContentConfig{ContentType: contentType,
		AcceptContentTypes: contentType + ",application/json"}}
	client, err := kubeapi.NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	lw := APISource(client).ListWatch(ResourceEndpointSlices, func(o *metav1.ListOptions) { o.LabelSelector = "selected" }, transform)
	return lw.(cache.ListerWatcherWithContext).ListWithContext
}

// TestListStreamFromAServer lists through a REST client as the informer's
// reflector does (client-go's pager, 500 items a page), from a server
// answering in protobuf, in JSON, and with an error.
func TestListStreamFromAServer(t *testing.T) {
	for _, tc := range []struct {
		name        string
		contentType string
		jsonOnly    bool
		transformed bool
	}{
		{"protobuf, decoded one item at a time", "application/vnd.kubernetes.protobuf", false, true},
		{"a client configured for JSON", "application/json", false, false},
		{"a server that answers JSON to a protobuf client", "application/vnd.kubernetes.protobuf", true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fake := &fakeAPIServer{t: t, slices: testSlices(1234), jsonOnly: tc.jsonOnly}
			srv := httptest.NewServer(fake)
			defer srv.Close()
			var k keep
			list := listOf(t, srv, tc.contentType, k.transform)
			p := pager.New(pager.SimplePageFunc(func(opts metav1.ListOptions) (runtime.Object, error) {
				return list(context.Background(), opts)
			}))
			obj, paginated, err := p.ListWithAlloc(context.Background(), metav1.ListOptions{ResourceVersion: "0"})
			if err != nil {
				t.Fatal(err)
			}
			if !paginated || fake.requests.Load() != 3 {
				t.Errorf("paginated %v in %d requests, want 3 pages of 500", paginated, fake.requests.Load())
			}
			objs, err := meta.ExtractListWithAlloc(obj) // as the reflector does
			if err != nil {
				t.Fatal(err)
			}
			if len(objs) != 1234 {
				t.Fatalf("%d items, want 1234", len(objs))
			}
			if s := objs[1233].(*discoveryv1.EndpointSlice); s.Name != "web-1233-abc" || s.Endpoints[1].Addresses[0] != "10.245.4.234" {
				t.Errorf("the last item is %+v", s)
			}
			if n := int(k.n.Load()); tc.transformed != (n == 1234) || (!tc.transformed && n != 0) {
				t.Errorf("the list transformed %d items; transformed while decoding: %v", n, tc.transformed)
			}
		})
	}
	t.Run("an error status", func(t *testing.T) {
		srv := httptest.NewServer(&fakeAPIServer{t: t, forbid: true})
		defer srv.Close()
		var k keep
		_, err := listOf(t, srv, "application/vnd.kubernetes.protobuf", k.transform)(context.Background(), metav1.ListOptions{})
		if err == nil || !strings.Contains(err.Error(), "forbidden") {
			t.Fatalf("got %v, want the server's reason", err)
		}
	})
}

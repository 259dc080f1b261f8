package k8swatch

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/json"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/ebpf-proxy/ebpf-proxy/internal/kubeapi"
	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
	"github.com/ebpf-proxy/ebpf-proxy/internal/tracker"
)

// DefaultPollInterval is how often Manifests.Run looks at the directory.
const DefaultPollInterval = time.Second

// ManifestOptions configure a Manifests source.
type ManifestOptions struct {
	// LBAlgorithm is the algorithm of Services that do not choose one
	// (--lb-algorithm).
	LBAlgorithm model.LBAlgorithm
	// PollInterval is the time between two reads of the directory; zero
	// means DefaultPollInterval.
	PollInterval time.Duration
	// Invalid receives every file, document, object or part of one that
	// cannot be used.
	Invalid InvalidFunc
	// OptedOut, if set, is told the addresses of the node's pods opted
	// out of the socket hooks (SocketLBAnnotation), read from the Pods
	// and Namespaces of the directory: at the first read, then whenever
	// they change. Without it Pods and Namespaces are not read.
	OptedOut func([]netip.Addr)
}

// Manifests is the source for standalone use and the demo: it reads
// Services, discovery.k8s.io/v1 EndpointSlices and optionally the proxy's
// own Node from the *.yaml, *.yml and *.json files of one directory
// (several documents per file, and v1 Lists, allowed; hidden files and
// subdirectories ignored) and feeds the tracker of each IP family with
// what changed for it since the previous read.
//
// Objects get the treatment the informers give them: the same label
// filtering, the same translation, and a missing namespace is "default".
// A file or document that cannot be read or decoded is reported, and the
// objects that file provided before stay as they were until it reads
// cleanly again: a half-written file never takes Services away. Files are
// best replaced atomically (written elsewhere, then renamed), as
// Kubernetes does for mounted ConfigMaps, which this source can read.
type Manifests struct {
	dir      string
	nodeName string
	lanes    []lane
	invalid  InvalidFunc
	interval time.Duration
	decoder  runtime.Decoder
	optedOut func([]netip.Addr)
	// lastOptedOut is what optedOut was last told; toldOptedOut says it
	// was told.
	lastOptedOut []netip.Addr
	toldOptedOut bool

	mu     sync.Mutex
	files  map[string]*manifestFile
	synced bool
	// What each lane's tracker was last given.
	given []given
	// The file each object was taken from at the last push: an object
	// defined again in another file keeps the definition it had, so that
	// a stray file never moves a running Service.
	svcOwner   map[model.ServiceName]string
	sliceOwner map[objectID]string
	nodeOwner  string
	// Problems already reported, so that a poll every second does not
	// repeat them while nothing changes.
	dirErr     string
	duplicates map[string]bool
}

// given is what one lane's tracker was last given.
type given struct {
	services map[model.ServiceName][]*model.ServicePort
	slices   map[objectID]*model.EndpointSlice
	node     *model.Node
}

// objectID is a namespaced object name.
type objectID struct {
	Namespace, Name string
}

// manifestFile is what one file provided at its last read: each object
// translated for every lane, in lane order. Nil values are objects that
// were read but are not proxied (headless, filtered by label): they still
// override an earlier version; so do nil translations (of the other
// family) in a lane.
type manifestFile struct {
	hash     [sha256.Size]byte
	readErr  string
	services map[model.ServiceName][][]*model.ServicePort
	slices   map[objectID][]*model.EndpointSlice
	node     []model.Node
	// pods are the node's pods that may opt out of the socket hooks,
	// namespaces the settings of the namespaces that carry one.
	pods       map[objectID]optOutPod
	namespaces map[string]string
}

func newManifestFile() *manifestFile {
	return &manifestFile{
		services:   map[model.ServiceName][][]*model.ServicePort{},
		slices:     map[objectID][]*model.EndpointSlice{},
		pods:       map[objectID]optOutPod{},
		namespaces: map[string]string{},
	}
}

// NewManifests returns a source that reads dir for the node named nodeName
// and records what it finds in the tracker of each target, one per IP
// family. Nothing is read before Reload or Run.
func NewManifests(dir, nodeName string, targets []Target, opts ManifestOptions) (*Manifests, error) {
	lanes, err := newLanes(targets, Translator{LBAlgorithm: opts.LBAlgorithm})
	if err != nil {
		return nil, err
	}
	interval := opts.PollInterval
	if interval <= 0 {
		interval = DefaultPollInterval
	}
	g := make([]given, len(lanes))
	for i := range g {
		g[i] = given{services: map[model.ServiceName][]*model.ServicePort{}, slices: map[objectID]*model.EndpointSlice{}}
	}
	return &Manifests{
		dir:      dir,
		nodeName: nodeName,
		lanes:    lanes,
		invalid:  opts.Invalid,
		interval: interval,
		optedOut: opts.OptedOut,
		// Strict, so that a misspelt field (clusterIp) is reported; the
		// object is still used, as kubectl would warn and go on.
		decoder: json.NewSerializerWithOptions(json.DefaultMetaFactory, kubeapi.Scheme, kubeapi.Scheme,
			json.SerializerOptions{Strict: true}),
		files:      map[string]*manifestFile{},
		given:      g,
		duplicates: map[string]bool{},
	}, nil
}

// Run reads the directory, marks Services and EndpointSlices synced in the
// tracker, and then reads it again every poll interval until ctx is done.
// It returns an error only when the first read fails (the directory does
// not exist or cannot be listed); later failures are reported through the
// InvalidFunc and leave the loaded objects in place.
func (m *Manifests) Run(ctx context.Context) error {
	if err := m.Reload(); err != nil {
		return err
	}
	tick := time.NewTicker(m.interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
			_ = m.Reload() // reported already
		}
	}
}

// Reload reads the directory once and records in the tracker every
// Service, EndpointSlice and Node change since the previous read. The first
// successful Reload also marks Services and EndpointSlices synced. It
// returns an error when the directory cannot be listed.
func (m *Manifests) Reload() error {
	m.mu.Lock()
	defer m.mu.Unlock()

	entries, err := os.ReadDir(m.dir)
	if err != nil {
		err = fmt.Errorf("k8swatch: reading manifests directory: %w", err)
		if m.synced && err.Error() != m.dirErr {
			m.dirErr = err.Error()
			m.report(KindManifest, "", m.dir, "unreadable directory: %v; keeping the objects loaded before", err)
		}
		return err
	}
	m.dirErr = ""

	changed := false
	seen := map[string]bool{}
	for _, e := range entries {
		name := e.Name()
		if strings.HasPrefix(name, ".") || !isManifestName(name) {
			continue
		}
		path := filepath.Join(m.dir, name)
		// Stat follows symlinks, as in a mounted ConfigMap. A file that
		// cannot be looked at is kept as unreadable rather than dropped.
		fi, err := os.Stat(path)
		if (err != nil && errors.Is(err, fs.ErrNotExist)) || (err == nil && !fi.Mode().IsRegular()) {
			continue
		}
		seen[path] = true
		if m.readFile(path) {
			changed = true
		}
	}
	for path := range m.files {
		if !seen[path] {
			delete(m.files, path)
			changed = true
		}
	}

	if changed || !m.synced {
		m.push()
	}
	if !m.synced {
		m.synced = true
		for _, l := range m.lanes {
			l.tr.SetServicesSynced()
			l.tr.SetEndpointSlicesSynced()
		}
	}
	return nil
}

func isManifestName(name string) bool {
	switch strings.ToLower(filepath.Ext(name)) {
	case ".yaml", ".yml", ".json":
		return true
	}
	return false
}

// reportReason is report of a reason already written, as an InvalidFunc.
func (m *Manifests) reportReason(kind, namespace, name, reason string) {
	m.report(kind, namespace, name, "%s", reason)
}

func (m *Manifests) report(kind, namespace, name, format string, args ...any) {
	tl := Translator{Invalid: m.invalid}
	tl.report(kind, namespace, name, format, args...)
}

// readFile reads one file if its content changed and reports whether what
// it provides changed.
func (m *Manifests) readFile(path string) bool {
	prev := m.files[path]
	data, err := os.ReadFile(path)
	if err != nil {
		if prev == nil {
			prev = newManifestFile()
			m.files[path] = prev
		}
		if err.Error() != prev.readErr {
			prev.readErr = err.Error()
			m.report(KindManifest, "", path, "unreadable file: %v; keeping the objects it provided before", err)
		}
		return false
	}
	hash := sha256.Sum256(data)
	if prev != nil && prev.readErr == "" && prev.hash == hash {
		return false
	}
	f, broken := m.parse(path, data)
	f.hash = hash
	if broken && prev != nil {
		// What the broken part held is unknown: keep every object the file
		// provided before that this read did not replace.
		for k, v := range prev.services {
			if _, ok := f.services[k]; !ok {
				f.services[k] = v
			}
		}
		for k, v := range prev.slices {
			if _, ok := f.slices[k]; !ok {
				f.slices[k] = v
			}
		}
		if f.node == nil {
			f.node = prev.node
		}
	}
	m.files[path] = f
	return true
}

// parse decodes every document of a file. broken is true when a document
// could not be decoded, or an object in it could not be used at all.
func (m *Manifests) parse(path string, data []byte) (f *manifestFile, broken bool) {
	f = newManifestFile()
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	for doc := 1; ; doc++ {
		raw, err := r.Read()
		if err == io.EOF {
			break
		}
		if err != nil {
			m.report(KindManifest, "", path, "undecodable document: document %d: %v", doc, err)
			broken = true
			var syntax utilyaml.YAMLSyntaxError
			if errors.As(err, &syntax) {
				continue // the reader goes on after a bad separator
			}
			break
		}
		if !m.decode(f, path, fmt.Sprintf("document %d", doc), raw) {
			broken = true
		}
	}
	return f, broken
}

// decode adds the object of one YAML or JSON document to f and reports
// whether it could be used.
func (m *Manifests) decode(f *manifestFile, path, where string, raw []byte) bool {
	js, err := sigsyaml.YAMLToJSON(raw)
	if err != nil {
		m.report(KindManifest, "", path, "undecodable document: %s: %v", where, err)
		return false
	}
	if t := bytes.TrimSpace(js); len(t) == 0 || string(t) == "null" {
		return true // only comments or blank
	}
	obj, gvk, err := m.decoder.Decode(js, nil, nil)
	switch {
	case err == nil:
	case runtime.IsNotRegisteredError(err) && gvk != nil && builtinGroup(gvk.Group) && !kubeapi.Scheme.IsVersionRegistered(gvk.GroupVersion()):
		// A built-in kind of an API group the proxy does not read (a
		// Deployment next to its Service): not ours, see below.
		obj = nil
	case runtime.IsNotRegisteredError(err):
		// A kind of no API the proxy knows (a custom resource, or a
		// misspelt kind) cannot be one of its objects: said, not kept.
		m.report(KindManifest, "", path, "unknown kind: %s: %v; ignored", where, err)
		return true
	case obj != nil && runtime.IsStrictDecodingError(err):
		// Unknown or duplicate fields: usable, but say so.
		m.report(KindManifest, "", path, "unknown field: %s: %v", where, err)
	default:
		m.report(KindManifest, "", path, "undecodable document: %s: %v", where, err)
		return false
	}

	switch o := obj.(type) {
	case *v1.List:
		ok := true
		for i := range o.Items {
			if !m.decode(f, path, fmt.Sprintf("%s item %d", where, i+1), o.Items[i].Raw) {
				ok = false
			}
		}
		return ok
	case *v1.Service:
		return m.addService(f, path, o)
	case *discoveryv1.EndpointSlice:
		return m.addSlice(f, path, o)
	case *v1.Node:
		if o.Name == m.nodeName {
			f.node = translate(m.lanes, nil, func(tl *Translator) model.Node { return tl.Node(o) })
		}
		return true
	case *v1.Pod:
		if m.optedOut == nil {
			return true
		}
		defaultNamespace(&o.Namespace)
		if p, ok := podForOptOut(o, m.nodeName); ok {
			checkSetting(m.reportReason, KindPod, o.Namespace, o.Name, p.setting)
			f.pods[objectID{o.Namespace, o.Name}] = p
		}
		return true
	case *v1.Namespace:
		if m.optedOut == nil {
			return true
		}
		if v := o.Annotations[SocketLBAnnotation]; v != "" {
			checkSetting(m.reportReason, KindNamespace, "", o.Name, v)
			f.namespaces[o.Name] = v
		}
		return true
	}
	// Kinds a user may expect to work but kube-proxy does not read.
	switch {
	case gvk == nil:
	case gvk.Group == "" && gvk.Kind == "Endpoints":
		m.report(KindManifest, "", path, "kind not read: %s: v1 Endpoints are not read; kube-proxy uses %s EndpointSlices",
			where, discoveryv1.SchemeGroupVersion)
	case gvk.Kind == "EndpointSlice":
		m.report(KindManifest, "", path, "kind not read: %s: EndpointSlice of %s is not read; use %s",
			where, gvk.GroupVersion(), discoveryv1.SchemeGroupVersion)
	}
	// Other kinds (a Deployment next to its Service) are not ours.
	return true
}

// owner is the file an object defined in defs (sorted) is taken from: prev,
// the file it came from before, while it still defines the object, else
// the first.
func owner(prev string, defs []string) string {
	if slices.Contains(defs, prev) {
		return prev
	}
	return defs[0]
}

func defaultNamespace(ns *string) {
	if *ns == "" {
		*ns = v1.NamespaceDefault
	}
}

func (m *Manifests) addService(f *manifestFile, path string, svc *v1.Service) bool {
	defaultNamespace(&svc.Namespace)
	if svc.Name == "" {
		m.report(KindManifest, svc.Namespace, path, "missing name: a Service without metadata.name; ignored")
		return false
	}
	name := ServiceName(svc)
	if _, dup := f.services[name]; dup {
		m.report(KindService, svc.Namespace, svc.Name, "duplicate object: defined twice in %s; the last one is used", path)
	}
	if !ServiceProxied(svc.Labels) {
		f.services[name] = nil
		return true
	}
	if svc.Spec.ClusterIP == "" && svc.Spec.Type != v1.ServiceTypeExternalName {
		// In a cluster the API server allocates one; here nothing does.
		m.report(KindService, svc.Namespace, svc.Name, "missing cluster IP: spec.clusterIP is not set in %s and nothing allocates one here; not proxied", path)
	}
	f.services[name] = translate(m.lanes, m.invalid, func(tl *Translator) []*model.ServicePort { return tl.ServicePorts(svc) })
	return true
}

func (m *Manifests) addSlice(f *manifestFile, path string, es *discoveryv1.EndpointSlice) bool {
	defaultNamespace(&es.Namespace)
	if es.Name == "" {
		m.report(KindManifest, es.Namespace, path, "missing name: an EndpointSlice without metadata.name; ignored")
		return false
	}
	id := objectID{es.Namespace, es.Name}
	if _, dup := f.slices[id]; dup {
		m.report(KindEndpointSlice, es.Namespace, es.Name, "duplicate object: defined twice in %s; the last one is used", path)
	}
	if !SliceProxied(es.Labels) {
		f.slices[id] = nil
		return true
	}
	s := translate(m.lanes, m.invalid, func(tl *Translator) *model.EndpointSlice { return tl.EndpointSlice(es) })
	// Another family is fine; a slice that cannot be used at all is a
	// broken object (reported by the translation), which leaves the file's
	// earlier version of it in place.
	_, named := EndpointSliceService(es)
	if es.AddressType == "" {
		return false
	}
	for i, l := range m.lanes {
		if s[i] == nil && es.AddressType == l.tl.addressType() && !named {
			return false
		}
	}
	f.slices[id] = s
	return true
}

// push merges the files and records in the tracker what differs from what
// it was given before. An object defined in more than one file is taken
// from the file it came from at the last push while that file still
// defines it, else from the first such file by name; each other definition
// is reported once, naming both files.
func (m *Manifests) push() {
	paths := make([]string, 0, len(m.files))
	for p := range m.files {
		paths = append(paths, p)
	}
	slices.Sort(paths)

	dups := map[string]bool{}
	duplicate := func(kind, ns, name, used, again string) {
		key := kind + " " + ns + "/" + name + " " + again
		dups[key] = true
		if !m.duplicates[key] {
			m.report(kind, ns, name, "duplicate object: defined in %s and again in %s; the copy in %s is used", used, again, used)
		}
	}
	svcDefs := map[model.ServiceName][]string{}
	sliceDefs := map[objectID][]string{}
	var nodeDefs []string
	for _, p := range paths {
		f := m.files[p]
		for k := range f.services {
			svcDefs[k] = append(svcDefs[k], p)
		}
		for k := range f.slices {
			sliceDefs[k] = append(sliceDefs[k], p)
		}
		if f.node != nil {
			nodeDefs = append(nodeDefs, p)
		}
	}
	services := map[model.ServiceName][][]*model.ServicePort{}
	svcOwner := map[model.ServiceName]string{}
	for k, defs := range svcDefs {
		use := owner(m.svcOwner[k], defs)
		for _, p := range defs {
			if p != use {
				duplicate(KindService, k.Namespace, k.Name, use, p)
			}
		}
		services[k], svcOwner[k] = m.files[use].services[k], use
	}
	sls := map[objectID][]*model.EndpointSlice{}
	sliceOwner := map[objectID]string{}
	for k, defs := range sliceDefs {
		use := owner(m.sliceOwner[k], defs)
		for _, p := range defs {
			if p != use {
				duplicate(KindEndpointSlice, k.Namespace, k.Name, use, p)
			}
		}
		sls[k], sliceOwner[k] = m.files[use].slices[k], use
	}
	var node []model.Node
	nodeOwner := ""
	if len(nodeDefs) > 0 {
		nodeOwner = owner(m.nodeOwner, nodeDefs)
		node = m.files[nodeOwner].node
		for _, p := range nodeDefs {
			if p != nodeOwner {
				duplicate(KindNode, "", m.nodeName, nodeOwner, p)
			}
		}
	}
	m.svcOwner, m.sliceOwner, m.nodeOwner = svcOwner, sliceOwner, nodeOwner
	m.duplicates = dups

	for i, l := range m.lanes {
		m.pushLane(l.tr, &m.given[i], i, services, sls, node)
	}
	m.pushOptedOut(paths)
}

// pushOptedOut tells OptedOut the opted-out pods' addresses of the files
// (paths, sorted), when they changed: a pod or namespace defined in more
// than one file is taken from the last.
func (m *Manifests) pushOptedOut(paths []string) {
	if m.optedOut == nil {
		return
	}
	pods, namespaces := map[objectID]optOutPod{}, map[string]string{}
	for _, p := range paths {
		maps.Copy(pods, m.files[p].pods)
		maps.Copy(namespaces, m.files[p].namespaces)
	}
	addrs := optedOutAddrs(pods, namespaces)
	if m.toldOptedOut && slices.Equal(addrs, m.lastOptedOut) {
		return
	}
	m.lastOptedOut, m.toldOptedOut = addrs, true
	m.optedOut(addrs)
}

// pushLane records in tr what lane i's view of the merged files (services,
// slices, node) changes from what it was given before (g).
func (m *Manifests) pushLane(tr *tracker.Tracker, g *given, i int, services map[model.ServiceName][][]*model.ServicePort,
	sls map[objectID][]*model.EndpointSlice, nodes []model.Node) {
	for name, all := range services {
		if all == nil || all[i] == nil {
			continue
		}
		if ports := all[i]; !reflect.DeepEqual(g.services[name], ports) {
			tr.UpdateService(name, ports)
			g.services[name] = ports
		}
	}
	for name := range g.services {
		if all := services[name]; all == nil || all[i] == nil {
			tr.DeleteService(name)
			delete(g.services, name)
		}
	}
	for id, all := range sls {
		if all == nil || all[i] == nil {
			continue
		}
		applySlice(tr, g.slices[id], all[i])
		g.slices[id] = all[i]
	}
	for id, s := range g.slices {
		if all := sls[id]; all == nil || all[i] == nil {
			applySlice(tr, s, nil)
			delete(g.slices, id)
		}
	}
	var node *model.Node
	if nodes != nil {
		node = &nodes[i]
	}
	switch {
	case node != nil && (g.node == nil || !reflect.DeepEqual(*g.node, *node)):
		tr.UpdateNode(*node)
		g.node = node
	case node == nil && g.node != nil:
		tr.UpdateNode(model.Node{Name: m.nodeName})
		g.node = nil
	}
}

// builtinGroup reports whether group is one of Kubernetes' own API groups:
// the core group, a group without a dot (apps, batch, policy) or one under
// k8s.io. Custom resources' groups are DNS names of their owners.
func builtinGroup(group string) bool {
	return !strings.Contains(group, ".") || strings.HasSuffix(group, ".k8s.io")
}

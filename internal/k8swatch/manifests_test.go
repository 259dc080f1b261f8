package k8swatch

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
	"github.com/ebpf-proxy/ebpf-proxy/internal/tracker"
)

// svcYAML is a Service as a user writes it for the manifests directory:
// no type, no ipFamilies, no protocol; namespace only when ns is set.
func svcYAML(ns, name, clusterIP string) string {
	meta := "  name: " + name + "\n"
	if ns != "" {
		meta += "  namespace: " + ns + "\n"
	}
	return fmt.Sprintf(`apiVersion: v1
kind: Service
metadata:
%sspec:
  clusterIP: %s
  ports:
  - name: http
    port: 80
    targetPort: http
`, meta, clusterIP)
}

// sliceYAML is an EndpointSlice of Service svc with one ready endpoint on
// node, port "http" 8080.
func sliceYAML(ns, name, svc, ip, node string) string {
	meta := "  name: " + name + "\n"
	if ns != "" {
		meta += "  namespace: " + ns + "\n"
	}
	return fmt.Sprintf(`apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
%s  labels:
    kubernetes.io/service-name: %s
addressType: IPv4
ports:
- name: http
  port: 8080
endpoints:
- addresses: [%q]
  nodeName: %s
`, meta, svc, ip, node)
}

const nodeYAML = `apiVersion: v1
kind: Node
metadata:
  name: node-a
  labels:
    topology.kubernetes.io/zone: zone-a
status:
  addresses:
  - type: InternalIP
    address: 192.168.77.10
---
apiVersion: v1
kind: Node
metadata:
  name: node-b
  labels:
    topology.kubernetes.io/zone: zone-b
`

func writeFiles(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		path := filepath.Join(dir, name)
		if content == "" {
			if err := os.Remove(path); err != nil {
				t.Fatal(err)
			}
			continue
		}
		// Written beside and renamed, as the source's doc asks of writers.
		tmp := filepath.Join(dir, ".tmp-"+name)
		if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, path); err != nil {
			t.Fatal(err)
		}
	}
}

func line(spn, ipPort string, eps ...string) string {
	if len(eps) == 0 {
		return fmt.Sprintf("%s %s eps=[] internal=REJECT[]", spn, ipPort)
	}
	return fmt.Sprintf("%s %s eps=%v internal=FORWARD%v", spn, ipPort, eps, eps)
}

// TestManifestDocuments checks what one read of a directory yields.
func TestManifestDocuments(t *testing.T) {
	tests := []struct {
		name    string
		files   map[string]string
		want    []string
		zone    string
		reports []string
	}{
		{
			name: "several documents per file, comments, blank documents, a namespace defaulted",
			files: map[string]string{
				"web.yaml": "# the web tier\n---\n" + svcYAML("", "web", "10.96.0.10") + "---\n# nothing here\n---\n" +
					sliceYAML("", "web-1", "web", "10.244.1.1", "node-a") + "---\n",
			},
			want: []string{line("default/web:http/TCP", "10.96.0.10:80", "10.244.1.1:8080 @node-a")},
		},
		{
			name: "a v1 List in JSON",
			files: map[string]string{
				"api.json": `{"apiVersion": "v1", "kind": "List", "items": [
  {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "api", "namespace": "prod"},
   "spec": {"clusterIP": "10.96.0.20", "ports": [{"name": "http", "port": 80, "protocol": "TCP"}]}},
  {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
   "metadata": {"name": "api-1", "namespace": "prod", "labels": {"kubernetes.io/service-name": "api"}},
   "addressType": "IPv4", "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
   "endpoints": [{"addresses": ["10.244.2.1"], "nodeName": "node-b"}]}
]}`,
			},
			want: []string{line("prod/api:http/TCP", "10.96.0.20:80", "10.244.2.1:8080 @node-b")},
		},
		{
			name: "the own Node gives the zone; other Nodes, kinds and files are ignored",
			files: map[string]string{
				"nodes.yml":    nodeYAML,
				"deploy.yaml":  "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: web\n",
				"README.md":    svcYAML("", "readme", "10.96.0.30"),
				".hidden.yaml": svcYAML("", "hidden", "10.96.0.31"),
			},
			zone: "zone-a",
		},
		{
			name: "label-filtered, headless and ExternalName Services are ignored as by the informers",
			files: map[string]string{
				"skip.yaml": `apiVersion: v1
kind: Service
metadata:
  name: other
  labels:
    service.kubernetes.io/service-proxy-name: other-proxy
spec:
  clusterIP: 10.96.0.11
  ports: [{port: 80}]
---
apiVersion: v1
kind: Service
metadata: {name: headless}
spec:
  clusterIP: None
  ports: [{port: 80}]
---
apiVersion: v1
kind: Service
metadata: {name: ext}
spec:
  type: ExternalName
  externalName: example.com
  clusterIP: 10.96.0.12
  ports: [{port: 80}]
`,
			},
		},
		{
			name: "a Service without cluster IP is reported: nothing allocates one here",
			files: map[string]string{
				"web.yaml": "apiVersion: v1\nkind: Service\nmetadata: {name: web}\nspec:\n  ports: [{port: 80}]\n",
			},
			reports: []string{"Service default/web: missing cluster IP: spec.clusterIP is not set in %DIR%/web.yaml"},
		},
		{
			name: "a misspelt field is reported and the object still used",
			files: map[string]string{
				"web.yaml": "apiVersion: v1\nkind: Service\nmetadata: {name: web, labelz: {a: b}}\nspec:\n  clusterIP: 10.96.0.10\n  ports: [{name: http, port: 80}]\n",
			},
			want:    []string{line("default/web:http/TCP", "10.96.0.10:80")},
			reports: []string{`Manifest /%DIR%/web.yaml: unknown field: document 1: strict decoding error: unknown field "metadata.labelz"`},
		},
		{
			name: "undecodable documents are reported and the others still load",
			files: map[string]string{
				"web.yaml": svcYAML("", "web", "10.96.0.10") +
					"---\nkind: [broken\n" +
					"---\napiVersion: v1\nmetadata: {name: nokind}\n" +
					"---\napiVersion: example.com/v1\nkind: Widget\nmetadata: {name: w}\n" +
					"---\nkind: Lost\n" +
					"--- junk after separator\n" +
					sliceYAML("", "web-1", "web", "10.244.1.1", "node-a") +
					// A misspelt kind of an API the proxy reads.
					"---\napiVersion: v1\nkind: Servce\nmetadata: {name: typo}\n",
			},
			want: []string{line("default/web:http/TCP", "10.96.0.10:80", "10.244.1.1:8080 @node-a")},
			reports: []string{
				"Manifest /%DIR%/web.yaml: undecodable document: document 2: yaml: line 1: did not find expected",
				"Manifest /%DIR%/web.yaml: undecodable document: document 3: Object 'Kind' is missing",
				`Manifest /%DIR%/web.yaml: unknown kind: document 4: no kind "Widget" is registered for version "example.com/v1"`,
				// The reader drops the document before a bad separator.
				"Manifest /%DIR%/web.yaml: undecodable document: document 5: invalid Yaml document separator",
				`Manifest /%DIR%/web.yaml: unknown kind: document 7: no kind "Servce" is registered for version "v1"`,
			},
		},
		{
			name: "v1 Endpoints and old EndpointSlice versions are reported, not read",
			files: map[string]string{
				"old.yaml": "apiVersion: v1\nkind: Endpoints\nmetadata: {name: web}\n---\n" +
					"apiVersion: discovery.k8s.io/v1beta1\nkind: EndpointSlice\nmetadata: {name: web-1}\naddressType: IPv4\n",
			},
			reports: []string{
				"Manifest /%DIR%/old.yaml: kind not read: document 1: v1 Endpoints are not read",
				"Manifest /%DIR%/old.yaml: kind not read: document 2: EndpointSlice of discovery.k8s.io/v1beta1 is not read",
			},
		},
		{
			name: "an EndpointSlice without the service-name label is reported",
			files: map[string]string{
				"web.yaml": "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: web-1}\naddressType: IPv4\n",
			},
			reports: []string{"EndpointSlice default/web-1: missing service name: no kubernetes.io/service-name label"},
		},
		{
			name: "the same Service in two files at the first read: the first file by name is used, reported",
			files: map[string]string{
				"a.yaml": svcYAML("", "web", "10.96.0.10"),
				"b.yaml": svcYAML("", "web", "10.96.0.99"),
			},
			want:    []string{line("default/web:http/TCP", "10.96.0.10:80")},
			reports: []string{"Service default/web: duplicate object: defined in %DIR%/a.yaml and again in %DIR%/b.yaml"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			writeFiles(t, dir, tc.files)
			tr := tracker.New("node-a", model.DefaultOptions, model.NodePortSpec{})
			var r reports
			m := mustManifests(t, dir, tr, ManifestOptions{Invalid: r.fn})
			if err := m.Reload(); err != nil {
				t.Fatal(err)
			}
			if !tr.Synced() {
				t.Error("not synced after the first read")
			}
			st := tr.Apply().State
			checkLines(t, "state", describe(st), tc.want)
			if st.Node.Zone != tc.zone {
				t.Errorf("zone %q, want %q", st.Node.Zone, tc.zone)
			}
			var want []string
			for _, w := range tc.reports {
				want = append(want, replaceDir(w, dir))
			}
			checkReports(t, r.take(), want)
		})
	}
}

func replaceDir(s, dir string) string { return strings.ReplaceAll(s, "%DIR%", dir) }

// TestManifestChanges edits a directory step by step and checks that each
// read passes on exactly what changed, and that breakage never takes away
// what was loaded.
func TestManifestChanges(t *testing.T) {
	dir := t.TempDir()
	tr := tracker.New("node-a", model.DefaultOptions, model.NodePortSpec{})
	var r reports
	m := mustManifests(t, dir, tr, ManifestOptions{Invalid: r.fn})

	web := svcYAML("", "web", "10.96.0.10")
	webSlice := sliceYAML("", "web-1", "web", "10.244.1.1", "node-a")
	webLine := line("default/web:http/TCP", "10.96.0.10:80", "10.244.1.1:8080 @node-a")
	dbLine := line("default/db:http/TCP", "10.96.0.20:80", "10.244.2.1:8080 @node-b")

	steps := []struct {
		name    string
		do      func()
		wantErr bool
		want    []string
		changed []string
		zone    string
		reports []string
	}{
		{
			name: "first read",
			do: func() {
				writeFiles(t, dir, map[string]string{"web.yaml": web + "---\n" + webSlice, "node.yaml": nodeYAML})
			},
			want:    []string{webLine},
			changed: []string{"default/web:http/TCP"},
			zone:    "zone-a",
		},
		{
			name: "a new file adds its objects and nothing else",
			do: func() {
				writeFiles(t, dir, map[string]string{"db.yaml": svcYAML("", "db", "10.96.0.20") + "---\n" +
					sliceYAML("", "db-1", "db", "10.244.2.1", "node-b")})
			},
			want:    []string{dbLine, webLine},
			changed: []string{"default/db:http/TCP"},
			zone:    "zone-a",
		},
		{
			name:    "an unchanged directory passes nothing on",
			do:      func() {},
			want:    []string{dbLine, webLine},
			zone:    "zone-a",
			changed: nil,
		},
		{
			name: "a file rewritten with the same objects in another order passes nothing on",
			do:   func() { writeFiles(t, dir, map[string]string{"web.yaml": webSlice + "---\n" + web}) },
			want: []string{dbLine, webLine},
			zone: "zone-a",
		},
		{
			name: "a changed endpoint passes on that Service only",
			do: func() {
				writeFiles(t, dir, map[string]string{"web.yaml": web + "---\n" + sliceYAML("", "web-1", "web", "10.244.1.2", "node-a")})
			},
			want:    []string{dbLine, line("default/web:http/TCP", "10.96.0.10:80", "10.244.1.2:8080 @node-a")},
			changed: []string{"default/web:http/TCP"},
			zone:    "zone-a",
		},
		{
			name: "a stray file that sorts first defines web again: web keeps its definition, both files are named",
			do:   func() { writeFiles(t, dir, map[string]string{"0-stray.yaml": svcYAML("", "web", "10.96.0.99")}) },
			want: []string{dbLine, line("default/web:http/TCP", "10.96.0.10:80", "10.244.1.2:8080 @node-a")},
			zone: "zone-a",
			reports: []string{"Service default/web: duplicate object: defined in %DIR%/web.yaml and again in %DIR%/0-stray.yaml; " +
				"the copy in %DIR%/web.yaml is used"},
		},
		{
			name: "the stray file removed: nothing changes",
			do:   func() { writeFiles(t, dir, map[string]string{"0-stray.yaml": ""}) },
			want: []string{dbLine, line("default/web:http/TCP", "10.96.0.10:80", "10.244.1.2:8080 @node-a")},
			zone: "zone-a",
		},
		{
			name: "a broken document is reported, the rest of the file loads, nothing it held is removed",
			do: func() {
				writeFiles(t, dir, map[string]string{"web.yaml": web + "---\nkind: [half-written\n---\n" + svcYAML("", "cache", "10.96.0.30")})
			},
			want: []string{
				line("default/cache:http/TCP", "10.96.0.30:80"),
				dbLine,
				line("default/web:http/TCP", "10.96.0.10:80", "10.244.1.2:8080 @node-a"),
			},
			changed: []string{"default/cache:http/TCP"},
			zone:    "zone-a",
			reports: []string{"Manifest /%DIR%/web.yaml: undecodable document: document 2"},
		},
		{
			name: "the file fixed without the slice: now the slice is gone",
			do: func() {
				writeFiles(t, dir, map[string]string{"web.yaml": web + "---\n" + svcYAML("", "cache", "10.96.0.30")})
			},
			want: []string{
				line("default/cache:http/TCP", "10.96.0.30:80"),
				dbLine,
				line("default/web:http/TCP", "10.96.0.10:80"),
			},
			changed: []string{"default/web:http/TCP"},
			zone:    "zone-a",
		},
		{
			name: "an object that became invalid keeps its last good version",
			do: func() {
				writeFiles(t, dir, map[string]string{"db.yaml": svcYAML("", "db", "10.96.0.20") + "---\n" +
					"apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: db-1}\naddressType: IPv4\n"})
			},
			want: []string{
				line("default/cache:http/TCP", "10.96.0.30:80"),
				dbLine,
				line("default/web:http/TCP", "10.96.0.10:80"),
			},
			zone:    "zone-a",
			reports: []string{"EndpointSlice default/db-1: missing service name: no kubernetes.io/service-name label"},
		},
		{
			name:    "a removed file takes its objects away",
			do:      func() { writeFiles(t, dir, map[string]string{"db.yaml": ""}) },
			want:    []string{line("default/cache:http/TCP", "10.96.0.30:80"), line("default/web:http/TCP", "10.96.0.10:80")},
			changed: []string{"default/db:http/TCP"},
			zone:    "zone-a",
		},
		{
			name: "a directory that vanished is reported and nothing is removed",
			do: func() {
				if err := os.Rename(dir, dir+".away"); err != nil {
					t.Fatal(err)
				}
			},
			wantErr: true,
			want:    []string{line("default/cache:http/TCP", "10.96.0.30:80"), line("default/web:http/TCP", "10.96.0.10:80")},
			zone:    "zone-a",
			reports: []string{"Manifest /%DIR%: unreadable directory: k8swatch: reading manifests directory"},
		},
		{
			name:    "still gone: not reported again",
			do:      func() {},
			wantErr: true,
			want:    []string{line("default/cache:http/TCP", "10.96.0.30:80"), line("default/web:http/TCP", "10.96.0.10:80")},
			zone:    "zone-a",
		},
		{
			name: "back again, without the Node: the zone is forgotten",
			do: func() {
				if err := os.Rename(dir+".away", dir); err != nil {
					t.Fatal(err)
				}
				writeFiles(t, dir, map[string]string{"node.yaml": ""})
			},
			want: []string{line("default/cache:http/TCP", "10.96.0.30:80"), line("default/web:http/TCP", "10.96.0.10:80")},
			// The zone change re-selects every Service.
			changed: []string{"default/cache:http/TCP", "default/web:http/TCP"},
		},
	}
	for _, s := range steps {
		s.do()
		if err := m.Reload(); (err != nil) != s.wantErr {
			t.Fatalf("%s: Reload error %v, want error %v", s.name, err, s.wantErr)
		}
		up := tr.Apply()
		checkLines(t, s.name, describe(up.State), s.want)
		var changed []string
		for n := range up.Changed {
			changed = append(changed, n.String())
		}
		slices.Sort(changed)
		checkLines(t, s.name+": changed", changed, s.changed)
		if up.State.Node.Zone != s.zone {
			t.Errorf("%s: zone %q, want %q", s.name, up.State.Node.Zone, s.zone)
		}
		var want []string
		for _, w := range s.reports {
			want = append(want, replaceDir(w, dir))
		}
		checkReports(t, r.take(), want)
	}
}

// TestManifestRun checks the polling loop: a missing directory is an
// error at start; a file dropped in later is picked up.
func TestManifestRun(t *testing.T) {
	t.Run("missing directory", func(t *testing.T) {
		tr := tracker.New("node-a", model.DefaultOptions, model.NodePortSpec{})
		m := mustManifests(t, filepath.Join(t.TempDir(), "nope"), tr, ManifestOptions{})
		if err := m.Run(t.Context()); err == nil {
			t.Fatal("Run on a missing directory succeeded")
		}
		if tr.Synced() {
			t.Error("synced without a read")
		}
	})
	t.Run("a file added while running", func(t *testing.T) {
		dir := t.TempDir()
		tr := tracker.New("node-a", model.DefaultOptions, model.NodePortSpec{})
		var r reports
		m := mustManifests(t, dir, tr, ManifestOptions{PollInterval: 10 * time.Millisecond, Invalid: r.fn})
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- m.Run(ctx) }()
		t.Cleanup(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run: %v", err)
			}
		})
		waitSynced(t, tr)
		writeFiles(t, dir, map[string]string{"web.yaml": svcYAML("", "web", "10.96.0.10")})
		waitFor(t, tr, "the Service", hasService("default/web:http/TCP"))
		checkReports(t, r.take(), nil)
	})
}

// mustManifests is NewManifests for the IPv4 tracker tr.
func mustManifests(t testing.TB, dir string, tr *tracker.Tracker, opts ManifestOptions) *Manifests {
	t.Helper()
	m, err := NewManifests(dir, "node-a", []Target{{Tracker: tr}}, opts)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestManifestDuplicateKeepsFirstDefinition: a Service or EndpointSlice
// defined again in another file keeps the definition it had, whether the
// new file sorts before or after its own; each duplicate is reported once,
// naming both files, under the metric reason "duplicate object"; removing
// the duplicates leaves the original in place.
func TestManifestDuplicateKeepsFirstDefinition(t *testing.T) {
	dir := t.TempDir()
	tr := tracker.New("node-a", model.DefaultOptions, model.NodePortSpec{})
	var r reports
	m := mustManifests(t, dir, tr, ManifestOptions{Invalid: r.fn})
	reload := func() []string {
		t.Helper()
		if err := m.Reload(); err != nil {
			t.Fatal(err)
		}
		return describe(tr.Apply().State)
	}
	orig := []string{line("default/web:http/TCP", "10.96.0.10:80", "10.244.1.1:8080 @node-a")}

	writeFiles(t, dir, map[string]string{"m-web.yaml": svcYAML("", "web", "10.96.0.10") + "---\n" + sliceYAML("", "web-1", "web", "10.244.1.1", "node-a")})
	checkLines(t, "first read", reload(), orig)
	checkReports(t, r.take(), nil)

	writeFiles(t, dir, map[string]string{
		"a-early.yaml": svcYAML("", "web", "10.96.0.98") + "---\n" + sliceYAML("", "web-1", "web", "10.244.9.9", "node-b"),
		"z-late.yaml":  svcYAML("", "web", "10.96.0.99"),
	})
	checkLines(t, "with a copy in a file before and one after", reload(), orig)
	got := r.take()
	slices.Sort(got)
	checkReports(t, got, []string{
		replaceDir("EndpointSlice default/web-1: duplicate object: defined in %DIR%/m-web.yaml and again in %DIR%/a-early.yaml; the copy in %DIR%/m-web.yaml is used", dir),
		replaceDir("Service default/web: duplicate object: defined in %DIR%/m-web.yaml and again in %DIR%/a-early.yaml; the copy in %DIR%/m-web.yaml is used", dir),
		replaceDir("Service default/web: duplicate object: defined in %DIR%/m-web.yaml and again in %DIR%/z-late.yaml; the copy in %DIR%/m-web.yaml is used", dir),
	})
	for _, g := range got {
		if reason := g[strings.Index(g, ": ")+2:]; InvalidReason(reason) != "duplicate object" {
			t.Errorf("metric reason %q for %q, want \"duplicate object\"", InvalidReason(reason), reason)
		}
	}

	checkLines(t, "read again unchanged", reload(), orig)
	checkReports(t, r.take(), nil)

	writeFiles(t, dir, map[string]string{"a-early.yaml": "", "z-late.yaml": ""})
	checkLines(t, "the copies removed", reload(), orig)
	checkReports(t, r.take(), nil)
}

// Package monitoring holds the checks of the Prometheus alerts
// (alerts.yaml) and the Grafana dashboard (dashboard.json) against the
// agent: every metric they name is one the agent registers, every BPF
// event they select is one the programs count, every alert has unit tests
// that fire and do not fire it, and the dashboard's queries parse.
package monitoring

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"sigs.k8s.io/yaml"

	"github.com/ebpf-proxy/ebpf-proxy/internal/dataplane/bpf"
	"github.com/ebpf-proxy/ebpf-proxy/internal/loader"
	"github.com/ebpf-proxy/ebpf-proxy/internal/metrics"
)

// requirePromtoolEnv makes the PromQL check of the dashboard fail rather
// than skip without promtool; `make monitoring-check` sets it.
const requirePromtoolEnv = "EBPF_PROXY_REQUIRE_PROMTOOL"

// agentMetrics are the metric names the agent registers: those of package
// metrics (metrics.New, as cmd/ebpf-proxy creates them) and those the BPF
// dataplane adds to the same registry. histograms are the names of the
// histograms among them, whose series are name_bucket, _sum and _count.
func agentMetrics(t *testing.T) (names, histograms map[string]bool) {
	t.Helper()
	m := metrics.New(metrics.IPv4)
	// Registering both on one registry checks that they do not clash,
	// as the agent's MustRegister would.
	reg := prometheus.NewRegistry()
	if err := reg.Register(describer(m.Describe)); err != nil {
		t.Fatal(err)
	}
	if err := reg.Register(describer(bpf.DescribeMetrics)); err != nil {
		t.Fatalf("the BPF dataplane's metrics clash with package metrics': %v", err)
	}
	descs := make(chan *prometheus.Desc)
	go func() {
		m.Describe(descs)
		bpf.DescribeMetrics(descs)
		close(descs)
	}()
	fqName := regexp.MustCompile(`^Desc\{fqName: "([^"]+)"`)
	names = map[string]bool{}
	for d := range descs {
		match := fqName.FindStringSubmatch(d.String())
		if match == nil {
			t.Fatalf("cannot read the name of %s", d)
		}
		names[match[1]] = true
	}
	// The histograms of package metrics have series for the family New
	// was given, so gathering types them.
	mfs, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	histograms = map[string]bool{}
	for _, mf := range mfs {
		if mf.GetType() == dto.MetricType_HISTOGRAM {
			histograms[mf.GetName()] = true
		}
	}
	for _, want := range []string{"kubeproxy_sync_proxy_rules_last_timestamp_seconds", "ebpfproxy_bpf_map_entries", "process_start_time_seconds"} {
		if !names[want] {
			t.Fatalf("the agent's metrics lack %s: the test does not read them right (%d names)", want, len(names))
		}
	}
	if !histograms["kubeproxy_network_programming_duration_seconds"] {
		t.Fatalf("kubeproxy_network_programming_duration_seconds is not among the histograms %v", histograms)
	}
	return names, histograms
}

// describer is a collector that only describes: registering it checks
// its descriptors against the registry's.
type describer func(chan<- *prometheus.Desc)

func (d describer) Describe(ch chan<- *prometheus.Desc) { d(ch) }
func (d describer) Collect(chan<- prometheus.Metric)    {}

// ruleFile is the part of a Prometheus rule file the checks read.
type ruleFile struct {
	Groups []struct {
		Name  string `json:"name"`
		Rules []struct {
			Alert       string            `json:"alert"`
			Expr        string            `json:"expr"`
			For         string            `json:"for"`
			Labels      map[string]string `json:"labels"`
			Annotations map[string]string `json:"annotations"`
		} `json:"rules"`
	} `json:"groups"`
}

func readRules(t *testing.T) ruleFile {
	t.Helper()
	b, err := os.ReadFile("alerts.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var f ruleFile
	if err := yaml.UnmarshalStrict(b, &f); err != nil {
		t.Fatalf("alerts.yaml: %v", err)
	}
	if len(f.Groups) == 0 {
		t.Fatal("alerts.yaml has no rule group")
	}
	return f
}

// alertExprs are the expressions of alerts.yaml by alert name.
func alertExprs(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, g := range readRules(t).Groups {
		for _, r := range g.Rules {
			out[r.Alert] = r.Expr
		}
	}
	return out
}

func readDashboard(t *testing.T) map[string]any {
	t.Helper()
	b, err := os.ReadFile("dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var d map[string]any
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("dashboard.json: %v", err)
	}
	return d
}

// dashboardExprs are the PromQL expressions of the dashboard's queries
// (panels' targets and query variables), by where they are.
func dashboardExprs(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	var walk func(path string, v any)
	walk = func(path string, v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, x := range v {
				if s, ok := x.(string); ok && (k == "expr" || (k == "query" && strings.Contains(path, "templating"))) {
					if strings.Contains(s, "(") || strings.Contains(s, "_") {
						out[path+"/"+k] = s
					}
					continue
				}
				walk(path+"/"+k, x)
			}
		case []any:
			for i, x := range v {
				walk(path+"/"+strconv.Itoa(i), x)
			}
		}
	}
	walk("", readDashboard(t))
	return out
}

// agentNamePattern matches the names of the agent's own metrics in an
// expression: upstream-compatible kubeproxy_*, ebpfproxy_*, and the
// process and Go runtime collectors' process_* and go_*. Label names and
// values never start so (the checks of label values are separate).
var agentNamePattern = regexp.MustCompile(`\b(?:kubeproxy|ebpfproxy|process|go)_[a-zA-Z0-9_:]*[a-zA-Z0-9]`)

// stringLiteral matches the quoted strings of an expression.
var stringLiteral = regexp.MustCompile(`"[^"]*"`)

// scrapeUp matches Prometheus' own up series, the one series not the
// agent's that the alerts and the dashboard use.
var scrapeUp = regexp.MustCompile(`\bup\{job=`)

// unknownNames returns, for every expression, the metric names the agent
// does not register ("where: name"), and the expressions in which it finds
// no metric at all (neither the agent's nor up).
func unknownNames(exprs map[string]string, names, histograms map[string]bool) (unknown, none []string) {
	for where, expr := range exprs {
		// Label matchers' values are checked elsewhere; drop them so
		// that a value like "go_away" is not taken for a metric.
		found := agentNamePattern.FindAllString(stringLiteral.ReplaceAllString(expr, `""`), -1)
		if len(found) == 0 && !scrapeUp.MatchString(expr) {
			none = append(none, where)
		}
		for _, name := range found {
			if names[name] {
				continue
			}
			base := name
			for _, suffix := range []string{"_bucket", "_sum", "_count"} {
				base = strings.TrimSuffix(base, suffix)
			}
			if base != name && histograms[base] {
				continue
			}
			unknown = append(unknown, where+": "+name)
		}
	}
	sort.Strings(unknown)
	sort.Strings(none)
	return unknown, none
}

// TestAlertsAndDashboardUseRealMetrics builds the agent's metrics as the
// agent does and checks every metric name alerts.yaml and dashboard.json
// use against them: renaming a metric breaks this test.
func TestAlertsAndDashboardUseRealMetrics(t *testing.T) {
	names, histograms := agentMetrics(t)
	for _, f := range []struct {
		file  string
		exprs map[string]string
		least int
	}{
		{"alerts.yaml", alertExprs(t), 10},
		{"dashboard.json", dashboardExprs(t), 20},
	} {
		if len(f.exprs) < f.least {
			t.Fatalf("%s: %d expressions found, want at least %d: the reading misses some", f.file, len(f.exprs), f.least)
		}
		unknown, none := unknownNames(f.exprs, names, histograms)
		for _, u := range unknown {
			t.Errorf("%s %s: the agent registers no such metric", f.file, u)
		}
		for _, where := range none {
			t.Errorf("%s %s: no metric found in %q", f.file, where, f.exprs[where])
		}
	}
	// The check can fail: a made-up name, and a histogram suffix on a
	// metric that is no histogram.
	bad := map[string]string{
		"made-up":  `rate(ebpfproxy_no_such_metric_total[5m])`,
		"suffix":   `ebpfproxy_bpf_map_entries_bucket`,
		"label":    `ebpfproxy_bpf_map_entries{map="go_away"}`,
		"upstream": `rate(node_network_receive_bytes_total[5m])`,
	}
	unknown, none := unknownNames(bad, names, histograms)
	if !slices.Equal(unknown, []string{"made-up: ebpfproxy_no_such_metric_total", "suffix: ebpfproxy_bpf_map_entries_bucket"}) ||
		!slices.Equal(none, []string{"upstream"}) {
		t.Errorf("made-up names: unknownNames says %q, and no metric in %q", unknown, none)
	}
}

// eventMatcher finds the event label matchers of ebpfproxy_bpf_events_total
// selectors.
var eventMatcher = regexp.MustCompile(`\bevent\s*(=~|=)\s*"([^"]*)"`)

// TestBPFEventsAreCounted checks that every event value the alerts and the
// dashboard select is one the BPF programs count (loader.CounterNames):
// each literal alternative exactly, each pattern by matching at least one.
func TestBPFEventsAreCounted(t *testing.T) {
	exprs := alertExprs(t)
	for k, v := range dashboardExprs(t) {
		exprs[k] = v
	}
	checked := 0
	for where, expr := range exprs {
		for _, m := range eventMatcher.FindAllStringSubmatch(expr, -1) {
			for _, alt := range strings.Split(m[2], "|") {
				checked++
				if regexp.QuoteMeta(alt) == alt {
					if !slices.Contains(loader.CounterNames, alt) {
						t.Errorf("%s selects event %q, which the BPF programs do not count", where, alt)
					}
					continue
				}
				re := regexp.MustCompile("^(?:" + alt + ")$")
				if !slices.ContainsFunc(loader.CounterNames, re.MatchString) {
					t.Errorf("%s selects events %q, which match none the BPF programs count", where, alt)
				}
			}
		}
	}
	if checked < 10 {
		t.Errorf("%d event values checked, want at least 10: the pattern misses some", checked)
	}
}

// unitTests is the part of a promtool unit test file the checks read.
type unitTests struct {
	RuleFiles []string `json:"rule_files"`
	Tests     []struct {
		AlertRuleTests []struct {
			Alertname string `json:"alertname"`
			ExpAlerts []any  `json:"exp_alerts"`
		} `json:"alert_rule_test"`
	} `json:"tests"`
}

// TestEveryAlertIsUnitTested checks that alerts_test.yaml, which promtool
// runs, has for every alert a case where it fires and one where it does
// not, and that every alert is documented and labelled.
func TestEveryAlertIsUnitTested(t *testing.T) {
	b, err := os.ReadFile("alerts_test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var u unitTests
	if err := yaml.Unmarshal(b, &u); err != nil {
		t.Fatalf("alerts_test.yaml: %v", err)
	}
	if !slices.Equal(u.RuleFiles, []string{"alerts.yaml"}) {
		t.Errorf("alerts_test.yaml tests %v, want alerts.yaml", u.RuleFiles)
	}
	fires, silent := map[string]bool{}, map[string]bool{}
	for _, tc := range u.Tests {
		for _, a := range tc.AlertRuleTests {
			if len(a.ExpAlerts) > 0 {
				fires[a.Alertname] = true
			} else {
				silent[a.Alertname] = true
			}
		}
	}
	var alerts []string
	for _, g := range readRules(t).Groups {
		for _, r := range g.Rules {
			alerts = append(alerts, r.Alert)
			if !fires[r.Alert] {
				t.Errorf("%s: no unit test where it fires", r.Alert)
			}
			if !silent[r.Alert] {
				t.Errorf("%s: no unit test where it does not fire", r.Alert)
			}
			if r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
				t.Errorf("%s: wants a summary and a description", r.Alert)
			}
			switch r.Labels["severity"] {
			case "critical", "warning", "info":
			default:
				t.Errorf("%s: severity %q, want critical, warning or info", r.Alert, r.Labels["severity"])
			}
		}
	}
	sort.Strings(alerts)
	if len(alerts) < 10 || len(slices.Compact(slices.Clone(alerts))) != len(alerts) {
		t.Errorf("alerts %v: want at least 10, each named once", alerts)
	}
}

// corePanels are the panel types Grafana ships: the dashboard needs no
// plugin.
var corePanels = []string{"row", "timeseries", "stat", "table", "bargauge", "gauge", "text"}

// TestDashboardIsSelfContained checks that the dashboard takes its
// Prometheus from a datasource variable, which every panel and query
// uses, and uses only Grafana's own panel types, each id once.
func TestDashboardIsSelfContained(t *testing.T) {
	d := readDashboard(t)
	tmpl, _ := d["templating"].(map[string]any)
	vars, _ := tmpl["list"].([]any)
	hasDS := false
	for _, v := range vars {
		v, _ := v.(map[string]any)
		if v["type"] == "datasource" && v["name"] == "datasource" && v["query"] == "prometheus" {
			hasDS = true
		}
	}
	if !hasDS {
		t.Fatal(`no datasource variable named "datasource" of type prometheus`)
	}
	panels, _ := d["panels"].([]any)
	if len(panels) < 15 {
		t.Fatalf("%d panels, want at least 15", len(panels))
	}
	ids := map[float64]bool{}
	for _, p := range panels {
		p, _ := p.(map[string]any)
		title, _ := p["title"].(string)
		typ, _ := p["type"].(string)
		if !slices.Contains(corePanels, typ) {
			t.Errorf("panel %q: type %q is not one of Grafana's own %v", title, typ, corePanels)
		}
		id, _ := p["id"].(float64)
		if ids[id] {
			t.Errorf("panel %q: id %v used twice", title, id)
		}
		ids[id] = true
		if typ == "row" {
			continue
		}
		if !usesVariable(p["datasource"]) {
			t.Errorf("panel %q: datasource %v, want the ${datasource} variable", title, p["datasource"])
		}
		targets, _ := p["targets"].([]any)
		if len(targets) == 0 {
			t.Errorf("panel %q has no query", title)
		}
		for _, tg := range targets {
			tg, _ := tg.(map[string]any)
			if !usesVariable(tg["datasource"]) {
				t.Errorf("panel %q: a query's datasource is %v, want the ${datasource} variable", title, tg["datasource"])
			}
		}
	}
}

func usesVariable(ds any) bool {
	m, ok := ds.(map[string]any)
	return ok && m["type"] == "prometheus" && m["uid"] == "${datasource}"
}

// grafanaVariables are replaced by values, so that promtool can parse
// the dashboard's queries.
var grafanaVariables = strings.NewReplacer("$__rate_interval", "5m", "$job", "ebpf-proxy", "$instance", ".*")

// TestDashboardQueriesParse has promtool parse every query of the
// dashboard, as the expression of a recording rule: a typo in PromQL
// fails here rather than as an empty panel.
func TestDashboardQueriesParse(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv(requirePromtoolEnv) != "" {
			t.Fatalf("promtool not found (%v); `make monitoring-check` installs Debian's prometheus package", err)
		}
		t.Skipf("promtool not found: %v", err)
	}
	var rules []map[string]string
	exprs := dashboardExprs(t)
	keys := make([]string, 0, len(exprs))
	for k := range exprs {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		expr := exprs[k]
		if strings.HasPrefix(expr, "label_values(") {
			// A Grafana function: check the selector inside.
			expr = strings.TrimSuffix(strings.TrimPrefix(expr, "label_values("), ", instance)")
		}
		rules = append(rules, map[string]string{"record": "dashboard:query", "expr": grafanaVariables.Replace(expr)})
	}
	b, err := yaml.Marshal(map[string]any{"groups": []any{map[string]any{"name": "dashboard", "rules": rules}}})
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "dashboard-queries.yaml")
	if err := os.WriteFile(file, b, 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(promtool, "check", "rules", file).CombinedOutput()
	if err != nil {
		t.Fatalf("promtool check rules of the dashboard's %d queries: %v\n%s", len(rules), err, out)
	}
}

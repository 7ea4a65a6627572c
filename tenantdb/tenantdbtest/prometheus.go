package tenantdbtest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/testcontainers/testcontainers-go"
	tcexec "github.com/testcontainers/testcontainers-go/exec"
	"github.com/testcontainers/testcontainers-go/wait"
)

const (
	prometheusReadyLog   = "Server is ready to receive web requests."
	prometheusConfigPath = "/etc/prometheus/tenantdbtest.yml"
	prometheusRulesDir   = "/etc/prometheus/rules"
)

// PrometheusConfig configures StartPrometheusWith and RunPrometheus.
type PrometheusConfig struct {
	// Targets are host:port addresses on this machine's loopback (where
	// httptest.NewServer listens) whose /metrics Prometheus scrapes, as job
	// "tenantdbtest".
	Targets []string

	// ScrapeInterval is how often the targets are scraped and the rules
	// evaluated. Default one second, so that a test waits seconds, not minutes.
	ScrapeInterval time.Duration

	// RuleFiles are paths of Prometheus rule files (recording rules and
	// alerts) on this machine, copied into the container and loaded.
	RuleFiles []string

	// Image replaces the one chosen from TENANTDB_PROMETHEUS_IMAGE or the
	// defaults (tenantdb/prometheus:2 when the local store has it, else
	// prom/prometheus:v2.42.0); it must run prometheus given its flags as
	// the command, and have promtool on its PATH for Promtool.
	Image string

	// StartupTimeout bounds the wait for Prometheus to be ready. Default one minute.
	StartupTimeout time.Duration
}

// Prometheus is a Prometheus server for tests, scraping the targets it was
// given. It shares the Docker host's network (host networking), which is how
// it reaches servers on this process's loopback: it therefore needs a Docker
// daemon on this machine, not a remote one.
type Prometheus struct {
	// URL is the HTTP API and UI, http://127.0.0.1:port.
	URL string
	// Image is the image the container runs.
	Image string
	// Container is the running container.
	Container *testcontainers.DockerContainer

	base
}

// StartPrometheus returns a Prometheus server that scrapes the targets'
// /metrics every second, in a container terminated when t ends. It fails t
// when it cannot be started.
func StartPrometheus(t testing.TB, targets ...string) *Prometheus {
	t.Helper()
	return StartPrometheusWith(t, PrometheusConfig{Targets: targets})
}

// StartPrometheusWith is StartPrometheus with a configuration.
func StartPrometheusWith(t testing.TB, cfg PrometheusConfig) *Prometheus {
	t.Helper()
	p := startForTest(t, func(ctx context.Context) (*Prometheus, error) { return runPrometheus(ctx, cfg) })
	t.Logf("tenantdbtest: Prometheus (%s) at %s scraping %v", p.Image, p.URL, cfg.Targets)
	return p
}

// RunPrometheus is StartPrometheusWith for programs outside tests: ctx
// governs starting the container only. The caller must call Terminate when
// done; on error no container is left running.
func RunPrometheus(ctx context.Context, cfg PrometheusConfig) (*Prometheus, error) {
	return runForProgram(ctx, func(ctx context.Context) (*Prometheus, error) { return runPrometheus(ctx, cfg) })
}

// prometheusYAML is the configuration: the targets as one static job, the
// rule files. JSON is YAML, so no YAML library is needed.
func prometheusYAML(cfg PrometheusConfig, ruleFiles []string) ([]byte, error) {
	interval := cfg.ScrapeInterval.String()
	conf := map[string]any{
		"global": map[string]any{"scrape_interval": interval, "evaluation_interval": interval},
		"scrape_configs": []any{map[string]any{
			"job_name":        "tenantdbtest",
			"scrape_interval": interval,
			"static_configs":  []any{map[string]any{"targets": cfg.Targets}},
		}},
	}
	if len(ruleFiles) > 0 {
		conf["rule_files"] = ruleFiles
	}
	return json.MarshalIndent(conf, "", "  ")
}

func runPrometheus(ctx context.Context, cfg PrometheusConfig) (*Prometheus, error) {
	if cfg.ScrapeInterval <= 0 {
		cfg.ScrapeInterval = time.Second
	}
	if cfg.StartupTimeout <= 0 {
		cfg.StartupTimeout = time.Minute
	}
	for _, tg := range cfg.Targets {
		if _, _, err := net.SplitHostPort(tg); err != nil {
			return nil, fmt.Errorf("tenantdbtest: Prometheus target %q: want host:port: %w", tg, err)
		}
	}
	d, image, err := prometheusImages.connect(ctx, "Prometheus", prometheusImages.env, cfg.Image)
	if err != nil {
		return nil, err
	}
	if !d.bindIP.IsValid() {
		return nil, fmt.Errorf("tenantdbtest: Prometheus scrapes this process over the Docker host's network, "+
			"which needs a Docker daemon on this machine; this one is at %s", d.host)
	}

	var files []testcontainers.ContainerFile
	var inContainer []string
	for _, f := range cfg.RuleFiles {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("tenantdbtest: Prometheus rule file: %w", err)
		}
		dst := prometheusRulesDir + "/" + filepath.Base(f)
		files = append(files, testcontainers.ContainerFile{Reader: bytes.NewReader(b), ContainerFilePath: dst, FileMode: 0o644})
		inContainer = append(inContainer, dst)
	}
	conf, err := prometheusYAML(cfg, inContainer)
	if err != nil {
		return nil, fmt.Errorf("tenantdbtest: Prometheus configuration: %w", err)
	}
	files = append(files, testcontainers.ContainerFile{Reader: bytes.NewReader(conf), ContainerFilePath: prometheusConfigPath, FileMode: 0o644})

	// Host networking: the container's loopback is this machine's, where
	// the targets listen; so Prometheus listens on a free loopback port of
	// its own rather than a published one. The port is free when picked,
	// but another process (a test binary running beside this one, Docker
	// publishing a port) may take it before Prometheus binds it: Prometheus
	// then exits, and is started again on another port.
	ctr, port, err := runOnFreeHostPort(d, func(port int) (*testcontainers.DockerContainer, error) {
		listen := net.JoinHostPort(d.bindIP.String(), strconv.Itoa(port))
		ctr, err := testcontainers.Run(ctx, image,
			testcontainers.WithFiles(files...),
			testcontainers.WithCmd(
				"--config.file="+prometheusConfigPath,
				"--storage.tsdb.path=/prometheus",
				"--web.listen-address="+listen,
			),
			testcontainers.WithHostConfigModifier(func(hc *container.HostConfig) { hc.NetworkMode = "host" }),
			testcontainers.WithWaitStrategyAndDeadline(cfg.StartupTimeout, wait.ForLog(prometheusReadyLog)),
		)
		if err != nil && ctr != nil && loggedPortConflict(ctx, ctr) {
			err = fmt.Errorf("Prometheus found %s taken (address already in use): %w", listen, err)
		}
		return ctr, err
	})
	p := &Prometheus{Image: image, Container: ctr, base: newBase("Prometheus", ctr)}
	if err != nil {
		return p, prometheusImages.startError("Prometheus", image, err)
	}
	p.URL = "http://" + net.JoinHostPort(d.bindIP.String(), strconv.Itoa(port))
	return p, nil
}

// loggedPortConflict reports whether the container's log says that its
// listening address was taken, as Prometheus logs before it exits.
func loggedPortConflict(ctx context.Context, c testcontainers.Container) bool {
	r, err := c.Logs(ctx)
	if err != nil {
		return false
	}
	defer r.Close()
	b, _ := io.ReadAll(io.LimitReader(r, 1<<20))
	return bytes.Contains(b, []byte("address already in use"))
}

// Terminate stops and removes the container; ctx governs the Docker
// requests. Only the first call does anything. StartPrometheus arranges it
// through t.Cleanup; after RunPrometheus the caller must call it.
func (p *Prometheus) Terminate(ctx context.Context) error { return terminate(ctx, p) }

// Sample is one series of an instant query's answer.
type Sample struct {
	Labels map[string]string
	Value  float64
}

// Query evaluates expr now (GET /api/v1/query) and returns the series of
// its instant vector, or the one value of a scalar with no labels. A
// PromQL error is returned as such, with Prometheus' message.
func (p *Prometheus) Query(ctx context.Context, expr string) ([]Sample, error) {
	var data struct {
		ResultType string          `json:"resultType"`
		Result     json.RawMessage `json:"result"`
	}
	if err := p.get(ctx, "/api/v1/query", url.Values{"query": {expr}}, &data); err != nil {
		return nil, fmt.Errorf("tenantdbtest: Prometheus query %q: %w", expr, err)
	}
	parse := func(v [2]any) (float64, error) {
		s, _ := v[1].(string)
		return strconv.ParseFloat(s, 64)
	}
	switch data.ResultType {
	case "vector":
		var res []struct {
			Metric map[string]string `json:"metric"`
			Value  [2]any            `json:"value"`
		}
		if err := json.Unmarshal(data.Result, &res); err != nil {
			return nil, fmt.Errorf("tenantdbtest: Prometheus query %q: %w", expr, err)
		}
		out := make([]Sample, 0, len(res))
		for _, r := range res {
			v, err := parse(r.Value)
			if err != nil {
				return nil, fmt.Errorf("tenantdbtest: Prometheus query %q: value %v: %w", expr, r.Value, err)
			}
			out = append(out, Sample{Labels: r.Metric, Value: v})
		}
		return out, nil
	case "scalar":
		var r [2]any
		if err := json.Unmarshal(data.Result, &r); err != nil {
			return nil, fmt.Errorf("tenantdbtest: Prometheus query %q: %w", expr, err)
		}
		v, err := parse(r)
		if err != nil {
			return nil, fmt.Errorf("tenantdbtest: Prometheus query %q: %w", expr, err)
		}
		return []Sample{{Labels: map[string]string{}, Value: v}}, nil
	}
	return nil, fmt.Errorf("tenantdbtest: Prometheus query %q: result type %q, want vector or scalar", expr, data.ResultType)
}

// Alert is one alert of GET /api/v1/alerts.
type Alert struct {
	Labels map[string]string `json:"labels"`
	State  string            `json:"state"` // pending or firing
}

// Alerts returns the alerts that are pending or firing.
func (p *Prometheus) Alerts(ctx context.Context) ([]Alert, error) {
	var data struct {
		Alerts []Alert `json:"alerts"`
	}
	if err := p.get(ctx, "/api/v1/alerts", nil, &data); err != nil {
		return nil, fmt.Errorf("tenantdbtest: Prometheus alerts: %w", err)
	}
	return data.Alerts, nil
}

// RuleHealth is one rule of GET /api/v1/rules: its name, and whether its
// last evaluation worked.
type RuleHealth struct {
	Name      string `json:"name"`
	Query     string `json:"query"`
	Health    string `json:"health"` // ok, err or unknown (not evaluated yet)
	LastError string `json:"lastError"`
}

// Rules returns every loaded rule, recording and alerting.
func (p *Prometheus) Rules(ctx context.Context) ([]RuleHealth, error) {
	var data struct {
		Groups []struct {
			Rules []RuleHealth `json:"rules"`
		} `json:"groups"`
	}
	if err := p.get(ctx, "/api/v1/rules", nil, &data); err != nil {
		return nil, fmt.Errorf("tenantdbtest: Prometheus rules: %w", err)
	}
	var out []RuleHealth
	for _, g := range data.Groups {
		out = append(out, g.Rules...)
	}
	return out, nil
}

// get calls the HTTP API and decodes the "data" of a successful answer.
func (p *Prometheus) get(ctx context.Context, path string, q url.Values, data any) error {
	u := p.URL + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return err
	}
	var env struct {
		Status string          `json:"status"`
		Data   json.RawMessage `json:"data"`
		Error  string          `json:"error"`
	}
	if err := json.Unmarshal(body, &env); err != nil {
		return fmt.Errorf("%s: %s: %.200s", path, resp.Status, body)
	}
	if env.Status != "success" {
		return fmt.Errorf("%s: %s: %s", path, resp.Status, env.Error)
	}
	return json.Unmarshal(env.Data, data)
}

// Promtool runs promtool in the container with args (say "check", "rules",
// path) and returns what it printed; a non-zero exit is an error that
// includes the output. Paths of RuleFiles are under /etc/prometheus/rules/,
// by their base names.
func (p *Prometheus) Promtool(ctx context.Context, args ...string) (string, error) {
	code, r, err := p.Container.Exec(ctx, append([]string{"promtool"}, args...), tcexec.Multiplexed())
	if err != nil {
		return "", fmt.Errorf("tenantdbtest: promtool %s: %w", strings.Join(args, " "), err)
	}
	out, _ := io.ReadAll(r)
	if code != 0 {
		return string(out), fmt.Errorf("tenantdbtest: promtool %s: exit %d: %s", strings.Join(args, " "), code, out)
	}
	return string(out), nil
}

// RuleFilePath is where a file of PrometheusConfig.RuleFiles is in the container.
func RuleFilePath(hostPath string) string { return prometheusRulesDir + "/" + filepath.Base(hostPath) }

package matrix_test

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/moat-net/moat/examples"
	"github.com/moat-net/moat/internal/clustergen"
	"github.com/moat-net/moat/internal/testenv"
	"github.com/moat-net/moat/manifest"
	"github.com/moat-net/moat/matrix"
	"github.com/moat-net/moat/policy"
)

var screenshots = flag.String("screenshots", "", "also write the HTML matrix screenshots to this directory (docs/ keeps them)")

// page renders the matrix of a compiled program as HTML.
func page(t testing.TB, prog *policy.Program, opts matrix.Options) []byte {
	t.Helper()
	m, err := matrix.Build(prog, opts)
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := matrix.WriteHTML(&b, m); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// generated is a synthetic cluster of pods pods in namespaces namespaces,
// each pod declaring two of five ports.
func generated(pods, namespaces int) *policy.Program {
	c := clustergen.Generate(clustergen.Config{Nodes: max(2, pods/25), Namespaces: namespaces, Pods: pods, NetworkPolicies: namespaces, ClusterPolicies: 4, Seed: 3})
	return policy.Compile(c.ToCluster(), policy.Options{IngressNetworksAndNodes: true})
}

func quickstart(t testing.TB) *policy.Program {
	t.Helper()
	res, err := (&manifest.Loader{FS: examples.FS}).Load(examples.Quickstart)
	if err != nil {
		t.Fatal(err)
	}
	return policy.Compile(&res.Cluster, policy.Options{})
}

// The page is one self-contained file of at most 1 MB at 50 pods on 5
// ports.
func TestHTMLSize(t *testing.T) {
	prog := generated(50, 10)
	if n := len(matrix.DefaultPorts(prog)); n != 5 {
		t.Fatalf("fixture declares %d ports, want 5", n)
	}
	html := page(t, prog, matrix.Options{})
	if len(html) > 1<<20 {
		t.Errorf("50 pods x 5 ports: %d bytes, want at most 1 MB", len(html))
	}
	for _, remote := range []string{"http://", "https://", "<script src", "<link", "@import"} {
		if bytes.Contains(html, []byte(remote)) {
			t.Errorf("page references %q", remote)
		}
	}
	t.Logf("50 pods x 5 ports: %d bytes", len(html))
}

// chromium finds Debian's chromium (or another Chrome) and starts it
// headless as this closed network needs, with a fresh profile.
func chromium(t *testing.T) context.Context {
	t.Helper()
	exe := ""
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			exe = p
			break
		}
	}
	if exe == "" {
		testenv.Require(t, "chromium (apt-get install chromium)")
	}
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(exe),
		chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun, chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 900),
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelCtx := chromedp.NewContext(actx)
	ctx, cancelTimeout := context.WithTimeout(ctx, 2*time.Minute)
	t.Cleanup(func() { cancelTimeout(); cancelCtx(); cancelAlloc() })
	return ctx
}

// open loads a page from a file and waits until its script has rendered.
func open(t *testing.T, ctx context.Context, html []byte, name string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, html, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := chromedp.Do(ctx, chromedp.Navigate("file://"+path), chromedp.WaitReady(`body[data-ready]`)); err != nil {
		t.Fatal(err)
	}
	ready, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.body.dataset.ready`))
	if err != nil {
		t.Fatal(err)
	}
	if ready != "true" {
		msg, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`document.getElementById("error").textContent`))
		t.Fatalf("page did not render: %s", msg)
	}
}

// eval runs a script in the page and decodes its (JSON) result.
func eval(t *testing.T, ctx context.Context, js string, out any) {
	t.Helper()
	raw, err := chromedp.Run(ctx, chromedp.Evaluate[[]byte](js))
	if err != nil {
		t.Fatalf("%v\nscript: %s", err, js)
	}
	if err := json.Unmarshal(raw, out); err != nil {
		t.Fatalf("%v: %s", err, raw)
	}
}

// screenshot keeps the whole page as a PNG test artifact (and in
// -screenshots).
func screenshot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	dirs := []string{t.ArtifactDir()}
	if *screenshots != "" {
		dirs = append(dirs, *screenshots)
	}
	for _, dir := range dirs {
		if err := os.WriteFile(filepath.Join(dir, name), png, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("screenshot %s: %d bytes in %v", name, len(png), dirs)
}

// lineCount is a script returning, for every header label of a table, how
// many line boxes its text takes: 1 when it does not wrap.
const wrapped = `(sel) => Array.from(document.querySelectorAll(sel + " th")).filter((th) => {
	const r = document.createRange(); r.selectNodeContents(th);
	const lines = new Set(Array.from(r.getClientRects()).map((x) => Math.round(th.querySelector("span") ? x.left : x.top)));
	return lines.size > 1;
}).map((th) => th.textContent)`

// TestHTMLInChromium drives the page in real headless Chromium: the
// namespace summary and its counts, sticky headers after scrolling, the
// filter, drill-down to pods with explanations, no wrapped labels, and a
// screenshot of each page.
func TestHTMLInChromium(t *testing.T) {
	ctx := chromium(t)

	t.Run("150 pods", func(t *testing.T) {
		prog := generated(150, 40)
		open(t, ctx, page(t, prog, matrix.Options{Peers: []netip.Addr{netip.MustParseAddr("203.0.113.9")}}), "m150.html")

		// 40 namespaces and the peers, in both directions.
		var shape struct{ Rows, Cols int }
		eval(t, ctx, `({rows: document.querySelectorAll("#summary tbody tr").length, cols: document.querySelectorAll("#summary thead th.col").length})`, &shape)
		if shape.Rows != 41 || shape.Cols != 41 {
			t.Errorf("summary %d x %d, want 41 x 41", shape.Rows, shape.Cols)
		}

		// The summary counts agree with the matrix: ns-0000 to ns-0001.
		m, err := matrix.Build(prog, matrix.Options{Peers: []netip.Addr{netip.MustParseAddr("203.0.113.9")}})
		if err != nil {
			t.Fatal(err)
		}
		ok, all := 0, 0
		for _, f := range m.Flows {
			if strings.HasPrefix(f.From, "ns-0000/") && strings.HasPrefix(f.To, "ns-0001/") {
				all++
				if f.Allowed {
					ok++
				}
			}
		}
		var cell string
		eval(t, ctx, `document.querySelector('#summary td[data-s="0"][data-d="1"]').title`, &cell)
		if want := fmt.Sprintf("ns-0000 \u2192 ns-0001: %d of %d flows allowed", ok, all); !strings.HasPrefix(cell, want) {
			t.Errorf("ns-0000 -> ns-0001 cell %q, want %q", cell, want)
		}

		// Sticky headers: after scrolling down and right, the column
		// headers stay at the top of the scrolled box and the row headers
		// at its left.
		var sticky struct {
			Top, Left         float64
			HeadTop, RowLeft  float64
			BoxTop, BoxLeft   float64
			CellTop, CellLeft float64
		}
		eval(t, ctx, `(() => {
			const box = document.getElementById("summary-scroll");
			box.scrollTop = 250; box.scrollLeft = 250;
			const b = box.getBoundingClientRect();
			const th = document.querySelectorAll("#summary thead th.col")[30].getBoundingClientRect();
			const row = document.querySelectorAll("#summary tbody th")[30].getBoundingClientRect();
			const first = document.querySelector("#summary tbody td").getBoundingClientRect();
			return {top: box.scrollTop, left: box.scrollLeft, headTop: th.top, rowLeft: row.left, boxTop: b.top, boxLeft: b.left, cellTop: first.top, cellLeft: first.left};
		})()`, &sticky)
		if sticky.Top < 200 || sticky.Left < 200 {
			t.Fatalf("the summary did not scroll (%v, %v): the test would prove nothing", sticky.Top, sticky.Left)
		}
		if d := sticky.HeadTop - sticky.BoxTop; d < -1 || d > 2 {
			t.Errorf("column header %v px from the top of the scrolled box", d)
		}
		if d := sticky.RowLeft - sticky.BoxLeft; d < -1 || d > 2 {
			t.Errorf("row header %v px from the left of the scrolled box", d)
		}
		if sticky.CellTop > sticky.BoxTop || sticky.CellLeft > sticky.BoxLeft {
			t.Errorf("the first cell did not scroll away: %+v", sticky)
		}

		var wraps []string
		eval(t, ctx, `(`+wrapped+`)("#summary")`, &wraps)
		if len(wraps) > 0 {
			t.Errorf("summary labels wrap: %v", wraps)
		}

		// The filter hides the namespaces (rows and columns) that do not
		// match.
		var visible struct{ Rows, Cols int }
		eval(t, ctx, `(() => {
			const f = document.getElementById("filter");
			f.value = "ns-0003"; f.dispatchEvent(new Event("input"));
			const shown = (els) => Array.from(els).filter((e) => e.offsetParent !== null).length;
			return {rows: shown(document.querySelectorAll("#summary tbody tr")), cols: shown(document.querySelectorAll("#summary thead th.col"))};
		})()`, &visible)
		if visible.Rows != 1 || visible.Cols != 1 {
			t.Errorf("filter ns-0003: %d rows and %d columns visible, want 1 and 1", visible.Rows, visible.Cols)
		}
		eval(t, ctx, `(() => { const f = document.getElementById("filter"); f.value = ""; f.dispatchEvent(new Event("input"));
			return Array.from(document.querySelectorAll("#summary tbody tr")).filter((e) => e.offsetParent !== null).length; })()`, &visible.Rows)
		if visible.Rows != 41 {
			t.Errorf("cleared filter: %d rows visible", visible.Rows)
		}

		// Drill-down: a namespace cell opens its pods, every pod cell
		// explained on hover.
		var detail struct {
			Hidden     bool
			Title      string
			Rows, Cols int
			Explained  string
		}
		eval(t, ctx, `(() => {
			document.querySelector('#summary td[data-s="0"][data-d="1"]').click();
			const td = document.querySelector("#pods tbody td");
			td.dispatchEvent(new MouseEvent("mouseover", {bubbles: true}));
			return {hidden: document.getElementById("detail").hidden, title: document.getElementById("detail-title").textContent,
				rows: document.querySelectorAll("#pods tbody tr").length, cols: document.querySelectorAll("#pods thead th.col").length, explained: td.title};
		})()`, &detail)
		podsIn := func(ns string) int {
			n := 0
			for _, e := range m.Endpoints {
				if strings.HasPrefix(e, ns+"/") {
					n++
				}
			}
			return n
		}
		if detail.Hidden || detail.Title != "ns-0000 \u2192 ns-0001 (all ports)" || detail.Rows != podsIn("ns-0000") || detail.Cols != podsIn("ns-0001") {
			t.Errorf("drill-down: %+v, want %d x %d pods", detail, podsIn("ns-0000"), podsIn("ns-0001"))
		}
		if !strings.Contains(detail.Explained, "egress ") || !strings.Contains(detail.Explained, "ingress ") || !strings.Contains(detail.Explained, "/TCP: ") {
			t.Errorf("pod cell explanation: %q", detail.Explained)
		}
		eval(t, ctx, `(`+wrapped+`)("#pods")`, &wraps)
		if len(wraps) > 0 {
			t.Errorf("pod labels wrap: %v", wraps)
		}
		eval(t, ctx, `(() => { document.getElementById("summary-scroll").scrollTo(0, 0); return true; })()`, new(bool))
		screenshot(t, ctx, "matrix-150-pods.png")
	})

	t.Run("500 pods", func(t *testing.T) {
		html := page(t, generated(500, 50), matrix.Options{})
		start := time.Now()
		open(t, ctx, html, "m500.html")
		t.Logf("500 pods: %d bytes, rendered in %v", len(html), time.Since(start))
		var rows, pods int
		eval(t, ctx, `document.querySelectorAll("#summary tbody tr").length`, &rows)
		eval(t, ctx, `(() => { document.querySelector('#summary td[data-s="7"][data-d="7"]').click(); return document.querySelectorAll("#pods tbody tr").length; })()`, &pods)
		if rows != 50 || pods != 10 {
			t.Errorf("500 pods: %d namespaces, %d pods in ns-0007, want 50 and 10", rows, pods)
		}
	})

	t.Run("quickstart", func(t *testing.T) {
		open(t, ctx, page(t, quickstart(t), matrix.Options{Peers: []netip.Addr{netip.MustParseAddr("203.0.113.10")}}), "quickstart.html")
		var groups []string
		eval(t, ctx, `Array.from(document.querySelectorAll("#summary tbody th")).map((th) => th.textContent)`, &groups)
		if strings.Join(groups, ",") != "backend,frontend,monitoring,(peers)" {
			t.Errorf("groups %v", groups)
		}
		// One port: frontend/web -> backend/db on 5432 is denied, and says
		// which NetworkPolicy isolates the database.
		var got struct{ Cell, Title, Panel string }
		eval(t, ctx, `(() => {
			const sel = document.getElementById("port");
			sel.value = Array.from(sel.options).find((o) => o.textContent === "5432/TCP").value;
			sel.dispatchEvent(new Event("change"));
			document.querySelector('#summary td[data-s="1"][data-d="0"]').click();
			const td = Array.from(document.querySelectorAll("#pods tbody tr")).find((tr) => tr.cells[0].textContent === "web")
				.cells[1 + Array.from(document.querySelectorAll("#pods thead th.col")).findIndex((th) => th.textContent === "db")];
			td.dispatchEvent(new MouseEvent("mouseover", {bubbles: true}));
			td.click();
			return {cell: td.textContent, title: td.title, panel: document.getElementById("explain").textContent};
		})()`, &got)
		if got.Cell != "\u2717" || !strings.Contains(got.Title, "frontend/web \u2192 backend/db\n5432/TCP: denied") || !strings.Contains(got.Title, "NetworkPolicies select the pod for ingress (backend/db-from-api)") {
			t.Errorf("web -> db on 5432: %+v", got)
		}
		if got.Panel != got.Title {
			t.Errorf("clicked cell's explanation %q, want the hover text %q", got.Panel, got.Title)
		}
		screenshot(t, ctx, "matrix-quickstart.png")
	})
}

// BenchmarkHTML reports the page's size (bytes/page) at 50 pods on 5 ports
// and at 500 pods, and the time to render it.
func BenchmarkHTML(b *testing.B) {
	for _, size := range []struct{ pods, namespaces int }{{50, 10}, {500, 50}} {
		prog := generated(size.pods, size.namespaces)
		m, err := matrix.Build(prog, matrix.Options{})
		if err != nil {
			b.Fatal(err)
		}
		b.Run(fmt.Sprintf("pods=%d/ports=%d", size.pods, len(m.Ports)), func(b *testing.B) {
			var buf bytes.Buffer
			for b.Loop() {
				buf.Reset()
				if err := matrix.WriteHTML(&buf, m); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(buf.Len()), "bytes/page")
		})
	}
}

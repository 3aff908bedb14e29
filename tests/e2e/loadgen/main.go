// Command loadgen floods an OTLP/HTTP endpoint with pre-encoded request bodies.
//
// It reads request bodies (files NAME.pb in -dir, or the single file -dir names) and,
// for -duration seconds, posts them from -conns goroutines, each on its own keep-alive
// HTTP/1.1 connection to -url, one request after another, never honouring Retry-After
// (a flood, not an exporter). When NAME.tids exists beside NAME.pb (the 16-byte trace
// ids the body holds, concatenated), every post gets fresh random trace ids in their
// place, so the monitor sees new traces rather than repeats.
//
// At the end it prints one JSON object: requests completed (answered, whatever the
// status), counts per status code, transport errors per kind, 503 answers without a
// Retry-After header, body bytes sent, connections opened, latency (mean and
// percentiles: the share of the run a connection waited for answers), and per
// second of the run the requests completed and the 200 answers, and the CPU seconds the
// generator itself used (to tell a slow sender from a slow server).
//
// The client is a minimal HTTP/1.1 one on package net (no net/http): a cold build
// compiles half as much of the standard library, and a request costs the generator
// little CPU, which matters when it shares two cores with the server it floods. An
// answer the server sends before it read the whole body (and then closes) is read and
// counted like any other; the connection is then dialled again. -sndbuf sets the
// connections' socket send buffer: a smaller one spares the copy of a body the server
// refuses unread (the generator's CPU per refused request is mostly kernel time).
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

type body struct {
	name    string
	data    []byte
	offsets [][]int // per trace id, where it occurs in data
}

type worker struct {
	codes     map[int]int64
	errs      map[string]int64
	noHint    int64
	bytesSent int64
	opened    int64
	latencies []float64
	perSecond [][2]int64 // [completed, status 200] per second since the start
}

type summary struct {
	URL               string             `json:"url"`
	Conns             int                `json:"conns"`
	Bodies            int                `json:"bodies"`
	BodyBytesMean     float64            `json:"body_bytes_mean"`
	DurationS         float64            `json:"duration_s"`
	Requests          int64              `json:"requests"`
	RequestsPerS      float64            `json:"requests_per_s"`
	Codes             map[string]int64   `json:"codes"`
	Errors            map[string]int64   `json:"errors"`
	NoRetryAfter      int64              `json:"no_retry_after"`
	BytesSent         int64              `json:"bytes_sent"`
	ConnectionsOpened int64              `json:"connections_opened"`
	LatencyMs         map[string]float64 `json:"latency_ms"`
	PerSecond         [][2]int64         `json:"per_second"`
	CPUSeconds        float64            `json:"cpu_s"`
}

func main() {
	url := flag.String("url", "", "endpoint, e.g. http://127.0.0.1:4318/v1/traces")
	dir := flag.String("dir", "", "directory of NAME.pb bodies (and NAME.tids), or one file")
	duration := flag.Float64("duration", 10, "seconds of load")
	conns := flag.Int("conns", 8, "goroutines, each on its own keep-alive connection")
	ctype := flag.String("content-type", "application/x-protobuf", "Content-Type header")
	timeout := flag.Float64("timeout", 30, "seconds a request may take")
	seed := flag.Int64("seed", 1, "random seed of the trace ids")
	local := flag.String("local", "", "source IP address of the connections (e.g. 127.0.0.2: "+
		"a sender distinct from others on loopback)")
	sndbuf := flag.Int("sndbuf", 0, "socket send buffer in bytes (0: the kernel's default)")
	flag.Parse()
	if *url == "" || *dir == "" || *conns < 1 || *duration <= 0 {
		fmt.Fprintln(os.Stderr, "usage: loadgen -url URL -dir DIR [-duration S] [-conns N]")
		os.Exit(2)
	}
	hostport, path, err := splitURL(*url)
	if err != nil {
		fmt.Fprintln(os.Stderr, "loadgen:", err)
		os.Exit(2)
	}
	bodies, err := load(*dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, "loadgen:", err)
		os.Exit(1)
	}
	head := "POST " + path + " HTTP/1.1\r\nHost: " + hostport + "\r\nContent-Type: " + *ctype +
		"\r\nUser-Agent: assaywatch-loadgen\r\nContent-Length: "
	limit := time.Duration(*timeout * float64(time.Second))
	dialer := &net.Dialer{Timeout: 5 * time.Second}
	if *local != "" {
		ip := net.ParseIP(*local)
		if ip == nil {
			fmt.Fprintln(os.Stderr, "loadgen: -local must be an IP address, got", *local)
			os.Exit(2)
		}
		dialer.LocalAddr = &net.TCPAddr{IP: ip}
	}
	if *sndbuf > 0 { // set on every socket the dialer makes, before it connects
		dialer.Control = func(_, _ string, rc syscall.RawConn) error {
			var serr error
			if err := rc.Control(func(fd uintptr) {
				serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_SNDBUF, *sndbuf)
			}); err != nil {
				return err
			}
			return serr
		}
	}

	start := time.Now()
	deadline := start.Add(time.Duration(*duration * float64(time.Second)))
	workers := make([]*worker, *conns)
	var wg sync.WaitGroup
	for i := range workers {
		w := &worker{codes: map[int]int64{}, errs: map[string]int64{}}
		workers[i] = w
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			w.run(dialer, hostport, head, bodies, i, *seed, limit, start, deadline)
		}(i)
	}
	wg.Wait()
	elapsed := time.Since(start).Seconds()

	out := summary{URL: *url, Conns: *conns, Bodies: len(bodies), DurationS: elapsed,
		Codes: map[string]int64{}, Errors: map[string]int64{}, LatencyMs: map[string]float64{}}
	var total int64
	for _, b := range bodies {
		total += int64(len(b.data))
	}
	out.BodyBytesMean = float64(total) / float64(len(bodies))
	var lat []float64
	for _, w := range workers {
		for code, n := range w.codes {
			out.Codes[strconv.Itoa(code)] += n
			out.Requests += n
		}
		for kind, n := range w.errs {
			out.Errors[kind] += n
		}
		out.NoRetryAfter += w.noHint
		out.BytesSent += w.bytesSent
		out.ConnectionsOpened += w.opened
		lat = append(lat, w.latencies...)
		for s, c := range w.perSecond {
			for len(out.PerSecond) <= s {
				out.PerSecond = append(out.PerSecond, [2]int64{})
			}
			out.PerSecond[s][0] += c[0]
			out.PerSecond[s][1] += c[1]
		}
	}
	out.RequestsPerS = float64(out.Requests) / elapsed
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		out.CPUSeconds = float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
	}
	sort.Float64s(lat)
	if len(lat) > 0 {
		var sum float64
		for _, v := range lat {
			sum += v
		}
		out.LatencyMs["mean"] = sum / float64(len(lat)) * 1000
	}
	for _, q := range []float64{0.5, 0.9, 0.99, 1} {
		if len(lat) > 0 {
			k := int(q * float64(len(lat)-1))
			out.LatencyMs[strconv.FormatFloat(q*100, 'f', -1, 64)] = lat[k] * 1000
		}
	}
	if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
		fmt.Fprintln(os.Stderr, "loadgen:", err)
		os.Exit(1)
	}
}

func splitURL(url string) (hostport, path string, err error) {
	rest, ok := strings.CutPrefix(url, "http://")
	if !ok {
		return "", "", fmt.Errorf("only http:// URLs, got %q", url)
	}
	hostport, path, _ = strings.Cut(rest, "/")
	return hostport, "/" + path, nil
}

// conn is one keep-alive connection (nil c: dial before the next request).
type conn struct {
	c net.Conn
	r *bufio.Reader
}

func (w *worker) run(dialer *net.Dialer, hostport, head string, bodies []body, i int, seed int64,
	limit time.Duration, start, deadline time.Time) {
	rng := rand.New(rand.NewSource(seed*1000 + int64(i)))
	bufs := make([][]byte, len(bodies))
	heads := make([][]byte, len(bodies))
	for k, b := range bodies {
		bufs[k] = append([]byte(nil), b.data...)
		heads[k] = []byte(head + strconv.Itoa(len(b.data)) + "\r\n\r\n")
	}
	id := make([]byte, 16)
	reader := bufio.NewReaderSize(nil, 16*1024) // reused: one connection per refusal
	var cn conn
	defer func() {
		if cn.c != nil {
			cn.c.Close()
		}
	}()
	for k := i; time.Now().Before(deadline); k++ {
		b := bodies[k%len(bodies)]
		buf := bufs[k%len(bodies)]
		for _, offs := range b.offsets {
			rng.Read(id)
			for _, o := range offs {
				copy(buf[o:o+16], id)
			}
		}
		if cn.c == nil {
			c, err := dialer.Dial("tcp", hostport)
			if err != nil {
				w.errs["dial_"+errKind(err)]++
				time.Sleep(10 * time.Millisecond)
				continue
			}
			w.opened++
			reader.Reset(c)
			cn = conn{c: c, r: reader}
		}
		t0 := time.Now()
		cn.c.SetDeadline(t0.Add(limit))
		bufsOut := net.Buffers{heads[k%len(bodies)], buf}
		_, werr := bufsOut.WriteTo(cn.c)
		// Even when the write failed (the server answered early and closed), its
		// answer may be waiting: read it.
		status, retryAfter, keep, rerr := readResponse(cn.r)
		if rerr != nil {
			kind := errKind(rerr)
			if werr != nil {
				kind = "write_" + errKind(werr)
			}
			w.errs[kind]++
			cn.c.Close()
			cn = conn{}
			continue
		}
		if werr != nil || !keep {
			cn.c.Close()
			cn = conn{}
		}
		w.latencies = append(w.latencies, time.Since(t0).Seconds())
		w.codes[status]++
		w.bytesSent += int64(len(buf))
		if status == 503 && !retryAfter {
			w.noHint++
		}
		s := int(time.Since(start).Seconds())
		for len(w.perSecond) <= s {
			w.perSecond = append(w.perSecond, [2]int64{})
		}
		w.perSecond[s][0]++
		if status == 200 {
			w.perSecond[s][1]++
		}
	}
}

// readResponse reads one answer: its status, whether it has a Retry-After header,
// whether the connection stays open, and its body (discarded).
func readResponse(r *bufio.Reader) (status int, retryAfter, keep bool, err error) {
	line, err := r.ReadSlice('\n')
	if err != nil {
		return 0, false, false, err
	}
	parts := strings.SplitN(strings.TrimSpace(string(line)), " ", 3)
	if len(parts) < 2 || !strings.HasPrefix(parts[0], "HTTP/1.") {
		return 0, false, false, errors.New("malformed status line")
	}
	if status, err = strconv.Atoi(parts[1]); err != nil {
		return 0, false, false, errors.New("malformed status line")
	}
	keep = parts[0] == "HTTP/1.1"
	length := int64(-1)
	for {
		line, err = r.ReadSlice('\n')
		if err != nil {
			return 0, false, false, err
		}
		h := strings.TrimSpace(string(line))
		if h == "" {
			break
		}
		name, value, _ := strings.Cut(h, ":")
		value = strings.TrimSpace(value)
		switch strings.ToLower(name) {
		case "content-length":
			if length, err = strconv.ParseInt(value, 10, 64); err != nil {
				return 0, false, false, errors.New("malformed Content-Length")
			}
		case "connection":
			if strings.EqualFold(value, "close") {
				keep = false
			}
		case "retry-after":
			retryAfter = true
		case "transfer-encoding":
			return 0, false, false, errors.New("chunked answers are not supported")
		}
	}
	if length < 0 { // no length: the body runs to the close
		_, err = io.Copy(io.Discard, r)
		return status, retryAfter, false, err
	}
	if _, err = r.Discard(int(length)); err != nil {
		return 0, false, false, err
	}
	return status, retryAfter, keep, nil
}

func errKind(err error) string {
	var ne net.Error
	switch {
	case errors.Is(err, syscall.ECONNRESET):
		return "reset"
	case errors.Is(err, syscall.EPIPE):
		return "broken_pipe"
	case errors.Is(err, syscall.ECONNREFUSED):
		return "refused"
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "eof"
	case errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	}
	return "other"
}

func load(dir string) ([]body, error) {
	st, err := os.Stat(dir)
	if err != nil {
		return nil, err
	}
	var paths []string
	if st.IsDir() {
		paths, err = filepath.Glob(filepath.Join(dir, "*.pb"))
		if err != nil {
			return nil, err
		}
		sort.Strings(paths)
	} else {
		paths = []string{dir}
	}
	if len(paths) == 0 {
		return nil, fmt.Errorf("no *.pb bodies in %s", dir)
	}
	var out []body
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			return nil, err
		}
		b := body{name: filepath.Base(p), data: data}
		tids, err := os.ReadFile(strings.TrimSuffix(p, ".pb") + ".tids")
		if err == nil {
			if len(tids)%16 != 0 {
				return nil, fmt.Errorf("%s.tids: not a multiple of 16 bytes", p)
			}
			for t := 0; t < len(tids); t += 16 {
				b.offsets = append(b.offsets, occurrences(data, tids[t:t+16]))
			}
		} else if !errors.Is(err, os.ErrNotExist) {
			return nil, err
		}
		out = append(out, b)
	}
	return out, nil
}

func occurrences(data, id []byte) []int {
	var offs []int
	for at := 0; ; {
		k := bytes.Index(data[at:], id)
		if k < 0 {
			return offs
		}
		offs = append(offs, at+k)
		at += k + len(id)
	}
}

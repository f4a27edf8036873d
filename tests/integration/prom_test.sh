#!/usr/bin/env bash
# prom_test.sh - the supervisor's Prometheus endpoint (--metrics-port) and `cohort status`,
# against running 2-rank jobs; one case per meson test (docs/observability.md).
#   prom_test.sh COHORT CASE
#   prom_exposition  GET /metrics: the text format (HELP/TYPE before samples, names, labels,
#                    counters' _total), the series the docs list, promtool check metrics, 404;
#                    a port in use refused; a job that loads the checkpoint exports the load's time
#   prom_single      a single-process job serves it too; its --metrics-file is intact
#   prom_scrape      a real Prometheus (Debian's) scrapes the job every second; a rank killed
#                    with `cohort inject` shows as cohort_restarts_total 1 and a fault of kind
#                    killed in its API, and the iteration advances past the kill
#   prom_rules       deploy/prometheus/alerts.yml: promtool check rules and its unit tests
#   prom_slow_clients 20 clients trickling a request a byte a second: a normal GET /metrics
#                    still answers 200 at once, and each slow one is cut at its deadline
#   prom_http        methods and paths, on a 2-rank job's and a single process's endpoint:
#                    HEAD 200, POST with a body / PUT / DELETE 405 with Allow: GET, HEAD,
#                    /metrics%00, /metrics/, /metricsX 404, /%6detrics and a query 200
#   proc_names       the supervisor and each worker name themselves for ps and top:
#                    /proc/PID/comm (cohort-sv, cohort-rN) and cmdline (cohort: rank N of job ID)
#   status           `cohort status --json` and the human form, --watch on a terminal (script)
#                    and without one, the restart and fault after a kill
#   status_errors    no such job, several jobs, a supervisor that does not answer (stopped),
#                    --watch until the job ends
cohort=$1; case_name=$2
# every `cohort train` here runs with --device cpu, also on a machine with a GPU
. "${COHORT_SOURCE_ROOT:?}/tests/lib.sh"
on_cpu "$cohort"
workdir prom
promd=
cleanup() {
    [ -n "$promd" ] && kill "$promd" 2>/dev/null && wait "$promd" 2>/dev/null
    kill $(jobs -p) 2>/dev/null
    wait 2>/dev/null
    [ -n "${KEEP:-}" ] || rm -rf "$work"
}
trap cleanup EXIT
skip() { echo "SKIP: $*" >&2; exit 77; }
py=/usr/bin/python3

# long enough to be watched: the test stops it (SIGTERM: a clean stop, exit 0)
tiny_model --eval-interval 100000 --nproc-per-node 2 --train-iters 1000000 --inprocess-soft-timeout 5 \
    --inprocess-hard-timeout 10
free_port() { $py -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
# start NAME [flags]: a job in the background; its pid in $job
start() {
    local name=$1; shift
    "$cohort" train "${tiny[@]}" --metrics-file "$work/$name.jsonl" "$@" >"$work/$name.out" 2>"$work/$name.err" &
    job=$!
}
# trained N NAME: wait (up to 60 s) until the job logged N iterations
trained() {
    for _ in $(seq 600); do
        n=$(grep -c grad_norm "$work/$2.jsonl" 2>/dev/null); [ "${n:-0}" -ge "$1" ] && return 0; sleep 0.1
    done
    fail "$2 did not train $1 iterations: $(tail -5 "$work/$2.err")"
}
# stop NAME: SIGTERM to the job, which stops cleanly (exit 0)
stop() {
    kill -TERM "$job" 2>/dev/null
    wait "$job"; local rc=$?
    [ $rc -eq 0 ] || fail "$1 exited $rc after SIGTERM: $(grep -v '^cohort rank' "$work/$1.err" | tail -5)"
}
# the supervisor's pid: cpu_cohort.sh execs cohort, so the job's pid is the supervisor's
scraped() { # PORT N: $work/m1.txt, a scrape of the job's endpoint whose cohort_iteration is N or more (5 s)
    local n
    for _ in $(seq 50); do
        get "http://127.0.0.1:$1/metrics" >"$work/m1.txt"
        n=$(sed -n 's/^cohort_iteration \([0-9]*\)$/\1/p' "$work/m1.txt"); [ "${n:-0}" -ge "$2" ] && return; sleep 0.1
    done
}
get() { $py - "$@" <<'PY'
import sys, urllib.request, urllib.error
try:
    r = urllib.request.urlopen(sys.argv[1], timeout=5)
    sys.stdout.write(r.read().decode()); print("\n#status %d %s" % (r.status, r.headers.get("Content-Type")))
except urllib.error.HTTPError as e:
    print("#status %d" % e.code)
PY
}

case $case_name in
prom_exposition)
    port=$(free_port)
    start e --metrics-port "$port" --save "$work/e.ckpt" --save-interval 50
    trained 60 e
    grep -q "Prometheus metrics at http://127.0.0.1:$port/metrics" "$work/e.err" || fail "no address said: $(cat "$work/e.err")"
    # (a snapshot is at most a heartbeat, 1 s, behind the records)
    scraped "$port" 60
    sleep 1.5
    get "http://127.0.0.1:$port/metrics" >"$work/m2.txt"
    # a second job on the same port: refused at its start, saying why (exit 1)
    "$cohort" train "${tiny[@]}" --metrics-port "$port" >"$work/busy.out" 2>&1; r=$?
    [ $r -eq 1 ] && grep -q "cannot serve HTTP on 127.0.0.1 port $port: .*in use" "$work/busy.out" ||
        fail "port in use: $r $(tail -3 "$work/busy.out")"
    get "http://127.0.0.1:$port/other" >"$work/404.txt"
    grep -q '^#status 404' "$work/404.txt" || fail "/other: $(cat "$work/404.txt")"
    $py - "$work/m1.txt" "$work/m2.txt" <<'PY' || fail "exposition: $(head -c 3000 "$work/m1.txt")"
import re, sys
def parse(path):
    lines = open(path).read().split("\n")
    status = [l for l in lines if l.startswith("#status ")]
    assert status and status[0].startswith("#status 200 text/plain; version=0.0.4"), status
    helps, types, samples = {}, {}, {}
    for l in lines:
        if not l or l.startswith("#status"): continue
        if l.startswith("# HELP "):
            n, h = l[7:].split(" ", 1); assert h.strip(), l; helps[n] = h; continue
        if l.startswith("# TYPE "):
            n, t = l[7:].split(" "); assert t in ("gauge", "counter"), l
            assert n in helps and n not in types, ("TYPE after HELP, once", l); types[n] = t; continue
        m = re.fullmatch(r'([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\]|\\.)*"(?:,[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\]|\\.)*")*)\})? (\S+)', l)
        assert m, ("not a sample line", l)
        name = m.group(1)
        assert name in types, ("a sample before its TYPE", l)
        float(m.group(4))
        samples[(name, m.group(3) or "")] = float(m.group(4))
    for n, t in types.items():
        assert n.startswith("cohort_"), n
        assert (t == "counter") == n.endswith("_total"), (n, t)
    return samples
a, b = parse(sys.argv[1]), parse(sys.argv[2])
names = {n for n, _ in a}
want = ["cohort_iteration", "cohort_consumed_samples", "cohort_lm_loss", "cohort_grad_norm", "cohort_learning_rate",
        "cohort_tokens_per_second", "cohort_iteration_seconds", "cohort_rank_step_seconds", "cohort_straggler_score",
        "cohort_restarts_total", "cohort_replays_total", "cohort_repairs_total", "cohort_steps_lost_total",
        "cohort_checkpoints_total", "cohort_checkpoint_save_seconds", "cohort_world_size", "cohort_rank_up"]
missing = [n for n in want if n not in names]
assert not missing, missing
assert a[("cohort_world_size", "")] == 2
assert a[("cohort_restarts_total", "")] == 0
assert ("cohort_rank_step_seconds", 'rank="0"') in a and ("cohort_rank_step_seconds", 'rank="1"') in a
assert a[("cohort_iteration", "")] >= 60 and b[("cohort_iteration", "")] > a[("cohort_iteration", "")], ("not advancing", a, b)
assert a[("cohort_checkpoints_total", "")] >= 1 and a[("cohort_checkpoint_last_iteration", "")] % 50 == 0
assert 0 < a[("cohort_lm_loss", "")] < 20 and a[("cohort_tokens_per_second", "")] > 0
PY
    if command -v promtool >/dev/null; then
        sed '/^#status/d' "$work/m1.txt" | promtool check metrics >"$work/lint" 2>&1 || fail "promtool check metrics: $(cat "$work/lint")"
    fi
    stop e
    # a job that loads a checkpoint exports the load's time
    port=$(free_port)
    start l --metrics-port "$port" --load "$work/e.ckpt"
    trained 3 l
    for _ in $(seq 50); do
        get "http://127.0.0.1:$port/metrics" >"$work/m3.txt"
        grep -q '^cohort_checkpoint_load_seconds [0-9]' "$work/m3.txt" && break; sleep 0.1
    done
    grep -q '^cohort_checkpoint_loads_total 1$' "$work/m3.txt" && grep -q '^cohort_checkpoint_load_seconds [0-9]' "$work/m3.txt" ||
        fail "no checkpoint load: $(grep checkpoint "$work/m3.txt") $(tail -3 "$work/l.err")"
    stop l
    ;;
prom_single)
    # a single-process job serves it itself; its metrics file is written as without, and the
    # TensorBoard events too (--tensorboard-dir's stream passes the records on to this one)
    port=$(free_port)
    single=(); prev=
    for a in "${tiny[@]}"; do [ "$prev" = --nproc-per-node ] && a=1; single+=("$a"); prev=$a; done
    "$cohort" train "${single[@]}" --metrics-file "$work/p.jsonl" --metrics-port "$port" \
        --tensorboard-dir "$work/tb" >"$work/p.out" 2>"$work/p.err" &
    job=$!
    trained 20 p
    # (a snapshot is at most 0.2 s behind the records)
    scraped "$port" 20
    sleep 1
    get "http://127.0.0.1:$port/metrics" >"$work/m2.txt"
    stop p
    $py - "$work/m1.txt" "$work/m2.txt" "$work/p.jsonl" <<'PY' || fail "single process: $(cat "$work/m1.txt")"
import json, sys
def samples(path):
    out = {}
    for l in open(path):
        if l.startswith("cohort_"):
            k, v = l.rsplit(" ", 1); out[k] = float(v)
    return out
a, b = samples(sys.argv[1]), samples(sys.argv[2])
assert a["cohort_world_size"] == 1 and a['cohort_rank_up{rank="0",node="0"}'] == 1, a
assert a["cohort_iteration"] >= 20 and b["cohort_iteration"] > a["cohort_iteration"], (a, b)
assert 0 < a["cohort_lm_loss"] < 20 and a["cohort_tokens_per_second"] > 0, a
recs = [json.loads(l) for l in open(sys.argv[3])]
its = [r["iteration"] for r in recs if "grad_norm" in r]
assert its == list(range(1, len(its) + 1)) and len(its) >= b["cohort_iteration"], its[-3:]
PY
    if $py -c "import google.protobuf" 2>/dev/null; then
        $py "$COHORT_SOURCE_ROOT/tests/integration/tb_read.py" check "$work/tb" "$work/p.jsonl" ||
            fail "the event file beside --metrics-port differs from the metrics"
    fi
    if command -v promtool >/dev/null; then
        sed '/^#status/d' "$work/m1.txt" | promtool check metrics >"$work/lint" 2>&1 || fail "promtool check metrics: $(cat "$work/lint")"
    fi
    ;;
prom_scrape)
    command -v prometheus >/dev/null || skip "no prometheus binary (Debian package prometheus; deploy/setup.sh installs it)"
    port=$(free_port); pport=$(free_port)
    cat >"$work/prometheus.yml" <<EOF
global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files:
  - $src/deploy/prometheus/alerts.yml
scrape_configs:
  - job_name: cohort
    static_configs:
      - targets: ["127.0.0.1:$port"]
EOF
    prometheus --config.file="$work/prometheus.yml" --storage.tsdb.path="$work/tsdb" \
        --web.listen-address="127.0.0.1:$pport" >"$work/prometheus.log" 2>&1 &
    promd=$!
    q() { $py - "http://127.0.0.1:$pport/api/v1/query" "$1" <<'PY'
import json, sys, urllib.parse, urllib.request
try:
    r = json.load(urllib.request.urlopen(sys.argv[1] + "?" + urllib.parse.urlencode({"query": sys.argv[2]}), timeout=5))
except Exception as e:
    print("error", e); sys.exit(1)
res = r["data"]["result"]
print(" ".join("%s=%s" % (",".join("%s:%s" % kv for kv in sorted(x["metric"].items()) if kv[0] not in ("instance", "job", "__name__")), x["value"][1]) for x in res))
PY
    }
    up=0
    for _ in $(seq 100); do
        q 'vector(1)' >/dev/null 2>&1 && { up=1; break; }
        kill -0 $promd 2>/dev/null || break
        sleep 0.2
    done
    [ $up -eq 1 ] || skip "prometheus did not start: $(tail -3 "$work/prometheus.log")"
    start s --metrics-port "$port"
    trained 20 s
    # scraped: the iteration Prometheus holds advances
    first=
    for _ in $(seq 100); do
        v=$(q 'cohort_iteration') && [ -n "$v" ] && { first=${v#=}; break; }
        sleep 0.2
    done
    [ -n "$first" ] || fail "Prometheus has no cohort_iteration: $(q 'up') $(tail -3 "$work/prometheus.log")"
    at=$(( $(grep -c grad_norm "$work/s.jsonl") + 150 ))
    "$cohort" inject --pid "$job" "kill@rank=1,step=$at" >"$work/inject" 2>&1 ||
        fail "cohort inject: $(cat "$work/inject")"
    restarts=
    for _ in $(seq 300); do
        restarts=$(q 'cohort_restarts_total'); [ "${restarts#=}" = "1" ] && break; sleep 0.2
    done
    [ "${restarts#=}" = "1" ] || fail "Prometheus did not see the restart: cohort_restarts_total '$restarts'; $(grep supervisor "$work/s.err" | tail -4)"
    faults=$(q 'cohort_faults_total')
    echo "$faults" | grep -q 'diagnosis:rank_failure,kind:killed=1' || fail "faults: $faults"
    # the iteration advances past the kill (the job trained on after its restart)
    adv=
    for _ in $(seq 300); do
        adv=$(q 'cohort_iteration'); [ "${adv#=}" -gt $((at + 20)) ] 2>/dev/null && break; sleep 0.2
    done
    [ "${adv#=}" -gt $((at + 20)) ] 2>/dev/null || fail "the iteration did not advance past $at: '$adv'"
    [ "${adv#=}" -gt "$first" ] || fail "not advancing: $first then $adv"
    incr=$(q 'max_over_time(cohort_iteration[5m]) - min_over_time(cohort_iteration[5m])')
    [ "${incr#=}" -gt 0 ] 2>/dev/null || fail "over time: '$incr'"
    gen=$(q 'cohort_generation'); [ "${gen#=}" = "2" ] || fail "generation: $gen"
    # the rules loaded into this Prometheus are healthy
    $py - "http://127.0.0.1:$pport/api/v1/rules" <<'PY' || fail "rules: $(head -c 600 "$work/prometheus.log")"
import json, sys, urllib.request
r = json.load(urllib.request.urlopen(sys.argv[1], timeout=5))
rules = [x for g in r["data"]["groups"] for x in g["rules"]]
assert len(rules) >= 4 and all(x["health"] != "err" for x in rules), rules
PY
    stop s
    grep -q "in-process restart into generation 2" "$work/s.err" || fail "no restart in the log"
    ;;
prom_slow_clients)
    port=$(free_port)
    start c --metrics-port "$port"
    trained 3 c
    # 20 connections each send a request line, then one header byte a second (for at most
    # 12 s); after 1 s a normal GET must answer within 3 s, and the server must cut every
    # slow one at its 5 s deadline (before the trickle's end)
    $py - "$port" >"$work/slow.txt" 2>&1 <<'PY' || fail "slow clients: $(cat "$work/slow.txt") $(tail -3 "$work/c.err")"
import socket, sys, threading, time, urllib.request
port = int(sys.argv[1])
t0 = time.time()
socks = []
for _ in range(20):
    s = socket.create_connection(("127.0.0.1", port), timeout=2)
    s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: ")
    socks.append(s)
got = {}
def normal():
    time.sleep(1)
    t = time.time()
    try:
        r = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=3)
        body = r.read().decode()
        got["status"], got["iteration"] = r.status, "cohort_iteration " in body
    except Exception as e:
        got["error"] = repr(e)
    got["seconds"] = time.time() - t
th = threading.Thread(target=normal); th.start()
cut = {}
while len(cut) < len(socks) and time.time() - t0 < 12:
    for i, s in enumerate(socks):
        if i in cut: continue
        try:
            s.sendall(b"a")
            s.settimeout(0.001)
            try:
                if s.recv(4096) == b"": cut[i] = time.time() - t0
            except socket.timeout:
                pass
            s.settimeout(2)
        except OSError:
            cut[i] = time.time() - t0
    time.sleep(1)
th.join()
print("normal GET:", got, "; slow clients cut:", len(cut), "of", len(socks), "latest at %.1f s" % max(cut.values(), default=-1))
assert got.get("status") == 200 and got.get("iteration") and got["seconds"] < 3, got
assert len(cut) == len(socks) and max(cut.values()) < 9, cut
PY
    cat "$work/slow.txt"
    # and the endpoint serves on afterwards
    get "http://127.0.0.1:$port/metrics" | grep -q '^#status 200' || fail "no answer after the slow clients"
    stop c
    ;;
prom_http)
    port=$(free_port); sport=$(free_port)
    start h --metrics-port "$port"; hjob=$job
    single=(); prev=
    for a in "${tiny[@]}"; do [ "$prev" = --nproc-per-node ] && a=1; single+=("$a"); prev=$a; done
    "$cohort" train "${single[@]}" --metrics-file "$work/p.jsonl" --metrics-port "$sport" >"$work/p.out" 2>"$work/p.err" &
    pjob=$!
    trained 3 h; trained 3 p
    for p in "$port" "$sport"; do
        $py - "$p" >"$work/http-$p.txt" 2>&1 <<'PY' || fail "port $p: $(cat "$work/http-$p.txt")"
import http.client, sys
port = int(sys.argv[1])
def req(method, path, body=None, headers={}):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        c.request(method, path, body=body, headers=headers)
        r = c.getresponse()
        data = r.read()
        # the connection still serves a second request: the first one's body was consumed
        c.request("GET", "/metrics")
        r2 = c.getresponse(); r2.read()
        return r.status, r.getheader("Allow"), data, r2.status
    finally:
        c.close()
bad = []
def want(method, path, status, body=None, allow=None, empty=False, headers={}):
    try:
        got, al, data, again = req(method, path, body, headers)
    except Exception as e:
        bad.append((method, path, "no answer: %r" % e)); return
    ok = got == status and again == 200 and (allow is None or al == allow) and (not empty or data == b"")
    print(method, path, got, "Allow:", al, "then GET", again, "ok" if ok else "WRONG")
    if not ok: bad.append((method, path, got, al, again))
want("GET", "/metrics", 200)
want("HEAD", "/metrics", 200, empty=True)
want("GET", "/%6detrics", 200)
want("GET", "/metrics?x=1", 200)
want("POST", "/metrics", 405, body=b"x" * 5000, allow="GET, HEAD")
want("POST", "/metrics", 405, body=b"x" * 3000, allow="GET, HEAD", headers={"Expect": "100-continue"})
want("PUT", "/metrics", 405, body=b"y", allow="GET, HEAD")
want("DELETE", "/metrics", 405, allow="GET, HEAD")
want("OPTIONS", "/metrics", 405, allow="GET, HEAD")
for path in ["/metrics%00", "/metrics%00x", "/metrics/", "/metricsX", "/metric", "/%2fmetrics", "/metrics%2", "/other", "/"]:
    want("GET", path, 404)
want("POST", "/other", 404, body=b"z" * 100)
assert not bad, bad
PY
    done
    cat "$work/http-$port.txt"
    stop h
    job=$pjob; stop p
    ;;
proc_names)
    # every process of a job names itself for ps and top: the comm and the command line
    start n
    trained 2 n
    id=$("$cohort" status --json "$job" | $py -c 'import json,sys; print(json.load(sys.stdin)["job_id"])') || fail "no job id"
    [ "$(cat /proc/$job/comm)" = cohort-sv ] || fail "supervisor comm: $(cat /proc/$job/comm)"
    [ "$(tr '\0' '\n' </proc/$job/cmdline | head -1)" = "cohort: supervisor of job $id" ] ||
        fail "supervisor cmdline: $(tr '\0' ' ' </proc/$job/cmdline | head -c 300)"
    n=0
    for w in $(pgrep -P "$job"); do
        r=$(tr '\0' '\n' </proc/$w/cmdline | head -1 | sed -n "s/^cohort: rank \([0-9]\) of job $id (node 0)$/\1/p")
        [ -n "$r" ] || fail "worker $w cmdline: $(tr '\0' ' ' </proc/$w/cmdline | head -c 300)"
        [ "$(cat /proc/$w/comm)" = "cohort-r$r" ] || fail "worker $w (rank $r) comm: $(cat /proc/$w/comm)"
        # no thread of it is left as "exe" (the link thread started before the rank was known)
        ! grep -qx exe /proc/$w/task/*/comm || fail "worker $w threads: $(cat /proc/$w/task/*/comm | sort | uniq -c)"
        ps -o args= -p "$w" | grep -q "^cohort: rank $r of job $id (node 0)" || fail "ps: $(ps -o args= -p "$w")"
        n=$((n + 1)); ranks="${ranks:-} $r"
    done
    [ $n -eq 2 ] && [ "$(echo $ranks | tr ' ' '\n' | sort | tr '\n' ' ')" = "0 1 " ] || fail "workers: $n, ranks$ranks"
    echo "supervisor: $(cat /proc/$job/comm); workers: ranks$ranks of job $id"
    stop n
    ;;
prom_rules)
    command -v promtool >/dev/null || skip "no promtool (Debian package prometheus; deploy/setup.sh installs it)"
    promtool check rules "$src/deploy/prometheus/alerts.yml" >"$work/check" 2>&1 || fail "promtool check rules: $(cat "$work/check")"
    (cd "$src/deploy/prometheus" && promtool test rules alerts_test.yml) >"$work/test" 2>&1 ||
        fail "promtool test rules: $(cat "$work/test")"
    ;;
status)
    start s --save "$work/s.ckpt" --save-interval 100
    ok=0
    for _ in $(seq 100); do
        "$cohort" status --json "$job" >"$work/st.json" 2>"$work/st.err" &&
            $py -c 'import json,sys; d=json.load(open(sys.argv[1])); sys.exit(0 if d["iteration"] >= 30 and all(r["step_ms"] for r in d["ranks"]) else 1)' "$work/st.json" 2>/dev/null &&
            { ok=1; break; }
        sleep 0.2
    done
    [ $ok -eq 1 ] || fail "cohort status --json: $(cat "$work/st.err") $(head -c 600 "$work/st.json")"
    $py - "$work/st.json" "$job" "$(hostname)" <<'PY' || fail "status document: $(cat "$work/st.json")"
import json, sys
d = json.load(open(sys.argv[1])); pid = int(sys.argv[2]); host = sys.argv[3]
assert d["supervisor_pid"] == pid and d["state"] == "training" and d["world_size"] == 2 and d["generation"] == 1, d
assert d["iteration"] >= 30 and d["train_iters"] == 1000000 and d["tokens_per_second"] > 0, d
assert 0 < d["lm_loss"] < 20 and d["iteration_ms"] > 0 and d["consumed_samples"] == 8 * d["iteration"], d
ranks = d["ranks"]
assert [r["rank"] for r in ranks] == [0, 1], ranks
for r in ranks:
    assert r["alive"] and r["pid"] > 0 and r["pid"] != pid and r["node"] == 0 and r["host"] == host, r
    s = r["step_ms"]
    assert 0 < s["min"] <= s["median"] <= s["max"] and s["iterations"] >= 1, s
    assert r["straggler_score"] is None or r["straggler_score"] > 0, r
assert d["counters"]["restarts"] == 0 and d["faults"] == [], d
c = d["checkpoint"]
assert c["save_interval"] == 100 and c["next_iteration"] % 100 == 0 and c["next_iteration"] > d["iteration"] - 1, c
assert c["next_in_seconds"] is not None and c["next_in_seconds"] >= 0, c
PY
    # the human form names every rank with its pid
    "$cohort" status "$job" >"$work/st.txt" 2>&1 || fail "cohort status: $(cat "$work/st.txt")"
    for r in 0 1; do
        pid=$($py -c 'import json,sys; print(json.load(open(sys.argv[1]))["ranks"][int(sys.argv[2])]["pid"])' "$work/st.json" $r)
        grep -Eq "^ +$r +0 +.* $pid +[0-9]+ " "$work/st.txt" || fail "rank $r (pid $pid) not shown: $(cat "$work/st.txt")"
    done
    grep -q "^cohort job [0-9a-f]* (supervisor pid $job): training" "$work/st.txt" && grep -q "next at iteration" "$work/st.txt" ||
        fail "human form: $(cat "$work/st.txt")"
    # --watch without a terminal: one report after another, no escape sequences
    timeout 3 "$cohort" status --watch 0.5 "$job" >"$work/watch.txt" 2>&1
    n=$(grep -c '^cohort job ' "$work/watch.txt")
    [ "$n" -ge 2 ] && ! grep -q $'\033' "$work/watch.txt" || fail "--watch: $n reports: $(head -c 400 "$work/watch.txt")"
    # on a terminal (script(1) gives it one): redrawn in place, the screen cleared each time
    if command -v script >/dev/null; then
        timeout 3 script -qec "$cohort status --watch 0.5 $job" /dev/null >"$work/tty.txt" 2>&1
        n=$(grep -o $'\033\[H\033\[2J' "$work/tty.txt" | wc -l)
        [ "$n" -ge 2 ] && grep -q "cohort job .*(supervisor pid $job)" "$work/tty.txt" || fail "--watch on a terminal: $n redraws: $(head -c 300 "$work/tty.txt" | od -c | head -5)"
    fi
    # after a kill the restart and the fault show
    at=$(( $(grep -c grad_norm "$work/s.jsonl") + 500 ))
    "$cohort" inject --pid "$job" "kill@rank=0,step=$at" >"$work/inject" 2>&1 || fail "inject: $(cat "$work/inject")"
    ok=0
    for _ in $(seq 300); do
        "$cohort" status --json "$job" >"$work/st2.json" 2>/dev/null &&
            $py -c 'import json,sys; d=json.load(open(sys.argv[1])); sys.exit(0 if d["counters"]["restarts"] == 1 and d["state"] == "training" and d["iteration"] > int(sys.argv[2]) else 1)' "$work/st2.json" "$at" 2>/dev/null &&
            { ok=1; break; }
        sleep 0.2
    done
    [ $ok -eq 1 ] || fail "no restart in cohort status: $(head -c 1500 "$work/st2.json")"
    $py - "$work/st2.json" <<'PY' || fail "after the kill: $(cat "$work/st2.json")"
import json, sys
d = json.load(open(sys.argv[1]))
assert d["generation"] == 2, d
k = [f for f in d["faults"] if f["kind"] == "killed" and f["rank"] == 0 and f["diagnosis"] == "rank_failure"]
assert k, d["faults"]
PY
    "$cohort" status "$job" >"$work/st2.txt" 2>&1
    grep -q "restarts 1," "$work/st2.txt" && grep -q "killed (rank_failure)" "$work/st2.txt" || fail "human form after the kill: $(cat "$work/st2.txt")"
    stop s
    ;;
status_errors)
    "$cohort" status 4000000 >"$work/e1" 2>&1; r=$?
    [ $r -eq 2 ] && grep -q "no running cohort job with supervisor pid or job id 4000000" "$work/e1" || fail "no such job: $r $(cat "$work/e1")"
    "$cohort" status --bogus >"$work/e0" 2>&1; r=$?
    [ $r -eq 2 ] && grep -q "unknown flag --bogus" "$work/e0" || fail "bad flag: $r $(cat "$work/e0")"
    # the job file a SIGKILLed supervisor left, its pid since taken by another process (this
    # shell, which started later than the start it records): not a running job
    mkdir -p "$work/xdg/cohort-stale"
    printf 'pid=%d\nstart=1\nendpoint=ipc://%s/none\njob=5ca1ab1e5ca1ab1e\n' $$ "$work" >"$work/xdg/cohort-stale/job"
    XDG_RUNTIME_DIR=$work/xdg "$cohort" status 5ca1ab1e >"$work/e4" 2>&1; r=$?
    [ $r -eq 2 ] && grep -q "no running cohort job with supervisor pid or job id 5ca1ab1e" "$work/e4" ||
        fail "a stale job file whose pid was reused: $r $(cat "$work/e4")"
    start a; a=$job
    start b; b=$job
    trained 5 a; trained 5 b
    "$cohort" status >"$work/e2" 2>&1; r=$?
    [ $r -eq 2 ] && grep -q "jobs are running; name one" "$work/e2" && grep -q "pid $a " "$work/e2" && grep -q "pid $b " "$work/e2" ||
        fail "several jobs: $r $(cat "$work/e2")"
    # by job id (a prefix) as well as by pid
    id=$("$cohort" status --json "$b" | $py -c 'import json,sys; print(json.load(sys.stdin)["job_id"])')
    "$cohort" status --json "${id:0:8}" | $py -c 'import json,sys; d=json.load(sys.stdin); assert d["supervisor_pid"] == int(sys.argv[1]), d' "$b" ||
        fail "by job id ${id:0:8}"
    # a supervisor that does not answer (stopped): a timeout, said so
    kill -STOP "$a"
    "$cohort" status --timeout 1 "$a" >"$work/e3" 2>&1; r=$?
    kill -CONT "$a"
    [ $r -eq 1 ] && grep -q "no answer from the supervisor .*(pid $a) within 1 s" "$work/e3" || fail "stopped supervisor: $r $(cat "$work/e3")"
    # --watch follows a job until it ends, then says so (exit 0)
    "$cohort" status --watch 0.3 --timeout 1 "$b" >"$work/w" 2>&1 &
    watcher=$!
    sleep 1
    job=$a; stop a
    job=$b; stop b
    wait_gone $watcher 10
    wait $watcher; r=$?
    [ $r -eq 0 ] && grep -q "the job (supervisor pid $b) ended" "$work/w" && [ "$(grep -c '^cohort job ' "$work/w")" -ge 2 ] ||
        fail "--watch to the end: $r $(tail -5 "$work/w")"
    ;;
*) fail "unknown case $case_name" ;;
esac
echo "ok: $case_name"

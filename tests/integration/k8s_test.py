#!/usr/bin/env python3
"""k8s_test.py - deploy/k8s without a cluster: the manifests parse (python3-yaml) and carry
what the entrypoint needs (an Indexed Job with one pod per node, a headless Service whose
name is the pods' subdomain and MASTER_ADDR's domain, the job secret from a Secret volume,
the checkpoint directory on the PersistentVolumeClaim, a termination grace for the save);
then deploy/k8s/entrypoint.sh runs on this host once per index with the environment that
Job gives its pods (JOB_COMPLETION_INDEX and the manifest's variables; MASTER_ADDR and the
pod IP are 127.0.0.1 here): index 0 starts the supervisor, index 1 a node agent, and they
train as one job; SIGTERM to one pod's PID 1 (as Kubernetes stops a pod; pod 1, then pod 0)
makes the job save and every pod exit 75; the pods started anew resume from the checkpoint
and finish.
    k8s_test.py COHORT"""
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time

cohort = sys.argv[1]
src = os.environ["COHORT_SOURCE_ROOT"]
try:
    import yaml
except ImportError:
    print("SKIP: python3-yaml is not installed")
    sys.exit(77)


def fail(msg):
    print("FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


docs = [d for d in yaml.safe_load_all(open(os.path.join(src, "deploy/k8s/cohort.yaml"))) if d]
kinds = {d["kind"]: d for d in docs}
for k in ("Service", "PersistentVolumeClaim", "Job"):
    if k not in kinds:
        fail("cohort.yaml has no %s" % k)
svc, pvc, job = kinds["Service"], kinds["PersistentVolumeClaim"], kinds["Job"]
js = job["spec"]
pod = js["template"]["spec"]
ctr = pod["containers"][0]
env = {e["name"]: e.get("value") for e in ctr.get("env", [])}
env_from = {e["name"]: e.get("valueFrom") for e in ctr.get("env", [])}

def check(cond, msg):
    if not cond:
        fail("cohort.yaml: " + msg)

check(js.get("completionMode") == "Indexed", "the Job is not Indexed (JOB_COMPLETION_INDEX is the node rank)")
nnodes = int(env.get("NNODES") or 0)
check(nnodes >= 1 and js.get("completions") == nnodes and js.get("parallelism") == nnodes,
      "completions %s, parallelism %s and NNODES %s differ" % (js.get("completions"), js.get("parallelism"), nnodes))
check(svc["spec"].get("clusterIP") == "None", "the Service is not headless")
check(svc["spec"].get("publishNotReadyAddresses") is True, "pod 0's name would not resolve before readiness")
check(svc["spec"].get("selector", {}).get("job-name") == job["metadata"]["name"], "the Service does not select the Job's pods")
check(pod.get("subdomain") == svc["metadata"]["name"], "the pods' subdomain is not the Service's name")
check(env.get("MASTER_ADDR") == "%s-0.%s" % (job["metadata"]["name"], svc["metadata"]["name"]),
      "MASTER_ADDR %s is not pod 0's name" % env.get("MASTER_ADDR"))
port = int(env.get("MASTER_PORT") or 0)
check(port and any(p.get("containerPort") == port for p in ctr.get("ports", [])), "MASTER_PORT is not a container port")
check(any(p.get("port") == port for p in svc["spec"].get("ports", [])), "MASTER_PORT is not a Service port")
check(env_from.get("POD_IP") == {"fieldRef": {"fieldPath": "status.podIP"}}, "POD_IP is not the pod's IP")
check(pod.get("restartPolicy") == "Never", "restartPolicy must be Never (the Job makes new pods; podFailurePolicy)")
check(int(pod.get("terminationGracePeriodSeconds", 30)) >= 120, "the termination grace is too short to save")
mounts = {m["name"]: m["mountPath"] for m in ctr.get("volumeMounts", [])}
vols = {v["name"]: v for v in pod.get("volumes", [])}
sec_vol = [n for n, v in vols.items() if "secret" in v]
check(len(sec_vol) == 1 and sec_vol[0] in mounts, "no Secret volume mounted")
check(env.get("COHORT_JOB_SECRET", "").startswith(mounts[sec_vol[0]] + "/"), "COHORT_JOB_SECRET is not in the Secret's mount")
pvc_vol = [n for n, v in vols.items() if v.get("persistentVolumeClaim", {}).get("claimName") == pvc["metadata"]["name"]]
check(len(pvc_vol) == 1 and pvc_vol[0] in mounts, "the PersistentVolumeClaim is not mounted")
check(env.get("COHORT_CKPT_DIR", "").startswith(mounts[pvc_vol[0]] + "/"), "COHORT_CKPT_DIR is not on the claim")
check("ReadWriteMany" in pvc["spec"].get("accessModes", []), "every node writes checkpoints: ReadWriteMany")
cm_vol = [n for n, v in vols.items() if "configMap" in v]
check(len(cm_vol) == 1 and ctr["command"][-1] == mounts.get(cm_vol[0], "?") + "/entrypoint.sh",
      "the command is not entrypoint.sh from the ConfigMap")
rules = js.get("podFailurePolicy", {}).get("rules", [])
check(any(r.get("action") == "Ignore" and any(c.get("type") == "DisruptionTarget" for c in r.get("onPodConditions", []))
          for r in rules), "a preemption (DisruptionTarget) would count as a failure")
# the container's args are cohort train flags (`cohort topology` parses the same table)
r = subprocess.run([cohort, "topology", "--nnodes", str(nnodes)] + [str(a) for a in ctr.get("args", [])],
                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
check(r.returncode == 0 and "world %d" % nnodes in r.stdout, "the container's args: " + r.stdout[-400:])
print("k8s: manifests carry the Indexed Job's fields (%d nodes, master %s:%d)" % (nnodes, env["MASTER_ADDR"], port))

# --- the entrypoint with an Indexed Job's environment, on this host ---
work = tempfile.mkdtemp(prefix="cohort-k8s.")
cpu_cohort = os.path.join(src, "tests/cpu_cohort.sh")
secret = os.path.join(work, "job.secret")
subprocess.run([cohort, "keygen", "--output", secret], check=True, stdout=subprocess.DEVNULL)
tiny = ["--nproc-per-node", "1", "--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", "500",
        "--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "32",
        "--micro-batch-size", "2", "--global-batch-size", "8", "--lr", "1e-3", "--data-cache-path",
        os.path.join(work, "cache"), "--log-interval", "1", "--eval-interval", "1000", "--eval-iters", "1",
        "--threads", "1", "--rendezvous-timeout", "60"]
base = random.randrange(20000, 40000)
procs = []


def start_pods(iters, extra, tag, master_port):
    """One entrypoint per index, as the Job's pods run it (each its own process group)."""
    out = []
    for i in range(nnodes):
        e = dict(os.environ)
        for k in ("NNODES", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT", "NPROC_PER_NODE"):
            e.pop(k, None)
        e.update({k: v for k, v in env.items() if v is not None})
        e.update({"JOB_COMPLETION_INDEX": str(i), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(master_port),
                  "POD_IP": "127.0.0.1", "COHORT_CKPT_DIR": os.path.join(work, "ckpt"),
                  "COHORT_JOB_SECRET": secret, "COHORT": cpu_cohort, "COHORT_CPU_EXE": os.path.abspath(cohort)})
        log = open(os.path.join(work, "%s-%d.log" % (tag, i)), "w")
        p = subprocess.Popen(["/bin/sh", os.path.join(src, "deploy/k8s/entrypoint.sh")] + tiny +
                             ["--train-iters", str(iters)] + extra, env=e, stdout=log, stderr=subprocess.STDOUT,
                             start_new_session=True)
        procs.append(p)
        out.append((p, log.name))
    return out


def text(path):
    return open(path).read()


def finish(pods, want, what):
    for p, log in pods:
        try:
            rc = p.wait(timeout=120)
        except subprocess.TimeoutExpired:
            fail("%s: %s still running after 120 s" % (what, log))
        if rc != want:
            fail("%s: %s exited %d, want %d: %s" % (what, os.path.basename(log), rc, want, text(log)[-1500:]))


try:
    # a whole run: index 0 the supervisor, index 1 a node agent, one job of 2 ranks
    pods = start_pods(6, [], "run", base)
    finish(pods, 0, "the Job's pods")
    l0, l1 = text(pods[0][1]), text(pods[1][1])
    if "supervisor starting 1 worker processes" not in l0 or "--node-rank 0 (JOB_COMPLETION_INDEX)" not in l0:
        fail("index 0 did not start the supervisor: " + l0[-800:])
    if "node agent 1 starting 1 worker processes" not in l1 or "--node-rank 1 (JOB_COMPLETION_INDEX)" not in l1:
        fail("index 1 did not start a node agent: " + l1[-800:])
    if "2 ranks" not in l0 or not re.search(r"iteration +6/ +6", l0):
        fail("not one job of 2 ranks trained to the end: " + l0[-800:])
    print("k8s: index 0 ran the supervisor, index 1 a node agent: one job of 2 ranks")
    # Kubernetes deletes one pod, pod 1 (a node agent's) and then, in the pods started anew,
    # pod 0 (the supervisor's): each time the whole job stops after the step and saves, and
    # every pod exits 75 (one exiting 0 would count as a completed index, and the Job would
    # not start it again)
    subprocess.run(["rm", "-rf", os.path.join(work, "ckpt")], check=True)
    it = 0
    for round_, victim in enumerate((1, 0)):
        pods = start_pods(100000, ["--inject", "slow@rank=0,step=%d,phase=allreduce,ms=2000" % (it + 8)],
                          "stop%d" % round_, base + 50 * (round_ + 1))
        want = r"iteration +%d/" % (it + 5)
        deadline = time.time() + 60
        while time.time() < deadline and not re.search(want, text(pods[0][1])):
            time.sleep(0.1)
        if not re.search(want, text(pods[0][1])):
            fail("no progress: " + text(pods[0][1])[-800:])
        pods[victim][0].send_signal(signal.SIGTERM)
        finish(pods, 75, "SIGTERM to pod %d" % victim)
        l0 = text(pods[0][1])
        m = re.search(r"stopped by signal after iteration (\d+)", l0)
        if not m or "stopped for preemption (Terminated): exit 75" not in l0:
            fail("no preemption stop: " + l0[-800:])
        if int(m.group(1)) <= it:
            fail("stopped after iteration %s, resumed from %d" % (m.group(1), it))
        if it and "at iteration %d" % it not in l0:
            fail("did not resume from iteration %d: %s" % (it, l0[-800:]))
        it = int(m.group(1))
        for _, log in pods:
            if re.search("was killed by|exited with status|restart into generation", text(log)):
                fail("a process died: " + text(log)[-800:])
        print("k8s: SIGTERM to pod %d: the job saved iteration %d, every pod exited 75" % (victim, it))
    # the Job's new pods: same environment; they resume and finish
    pods = start_pods(it + 3, [], "resumed", base + 200)
    finish(pods, 0, "the new pods")
    l0 = text(pods[0][1])
    if "loaded checkpoint" not in l0 or "at iteration %d" % it not in l0:
        fail("the new pods did not resume from iteration %d: %s" % (it, l0[-800:]))
    print("k8s: new pods resumed from iteration %d and finished" % it)
finally:
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()
    subprocess.run(["rm", "-rf", work])

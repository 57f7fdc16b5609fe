#!/usr/bin/env python3
"""Lints deploy/: yamllint, promtool, and structural checks of the Dockerfile and manifests.

Usage: check_deploy.py SOURCE_DIR   (ctest deploy_lint_test, label unit)

No Docker engine or Kubernetes API server exists in CI, so this checks what can be checked
statically: YAML style (yamllint with the repository's .yamllint), the Prometheus config
and rules (promtool check / test), hadolint-style Dockerfile rules plus our own contract
(multi-stage CUDA devel -> runtime, non-root, HEALTHCHECK on /health, EXPOSE 8000 50051,
ENTRYPOINT specd serve, flags that `specd serve` knows), and for every pod template:
probes, resources with nvidia.com/gpu, non-root security contexts, a drain-aware grace
period, ports and volumes that resolve, ConfigMap configs that parse against
proto/config.proto.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

try:
    import yaml
except ImportError:  # reported by main() through tests/requires.py
    yaml = None

sys.dont_write_bytecode = True  # importing sibling scripts leaves no __pycache__

SOURCE = None
DEPLOY = None
# Tensor-parallel flags the LeaderWorkerSet example uses before `specd serve` has them.
LWS_PLACEHOLDER_FLAGS = set()  # every flag the LWS example uses is real (issue 17)


def yaml_files(*roots):
    out = []
    for root in roots:
        for dirpath, _, names in os.walk(root):
            out += [os.path.join(dirpath, n) for n in names if n.endswith((".yaml", ".yml"))]
    return sorted(out)


def manifests():
    """All Kubernetes objects under deploy/k8s as (path, object)."""
    out = []
    for path in yaml_files(os.path.join(DEPLOY, "k8s")):
        with open(path, encoding="utf-8") as f:
            out += [(path, doc) for doc in yaml.safe_load_all(f) if doc]
    return out


def pod_templates(obj):
    """(name, pod template) of a workload object."""
    kind = obj["kind"]
    spec = obj.get("spec", {})
    if kind in ("Deployment", "StatefulSet", "DaemonSet", "Job"):
        return [(obj["metadata"]["name"], spec["template"])]
    if kind == "LeaderWorkerSet":
        lwt = spec["leaderWorkerTemplate"]
        out = [(obj["metadata"]["name"] + "/worker", lwt["workerTemplate"])]
        if "leaderTemplate" in lwt:
            out.append((obj["metadata"]["name"] + "/leader", lwt["leaderTemplate"]))
        return out
    return []


def serve_flags():
    # serve_options.cc registers its flags; option_flags.cc those of the option structs it shares
    # (device, scheduler, tensor parallelism).
    text = ""
    for name in ("serve_options.cc", "flags.cc", "option_flags.cc"):
        with open(os.path.join(SOURCE, "server", name), encoding="utf-8") as f:
            text += f.read()
    return set(re.findall(r'p\.Add\("([a-z0-9-]+)"', text)) | {"help"}


def drain_timeout(config_text):
    m = re.search(r"^\s*drain_timeout_s:\s*([0-9.]+)", config_text, re.M)
    return float(m.group(1)) if m else 30.0  # the default of server/serve_options.h


def prestop_seconds(container):
    hook = container.get("lifecycle", {}).get("preStop", {})
    if "sleep" in hook:
        return float(hook["sleep"]["seconds"])
    cmd = hook.get("exec", {}).get("command", [])
    if len(cmd) == 2 and cmd[0] == "sleep":
        return float(cmd[1])
    return 0.0


class Dockerfile:
    """Instructions of a Dockerfile, continuation lines joined, grouped by stage."""

    def __init__(self, path):
        with open(path, encoding="utf-8") as f:
            text = f.read()
        text = re.sub(r"\\\n", " ", text)
        self.instructions = []  # (stage index, INSTRUCTION, arguments)
        stage = -1
        for line in text.split("\n"):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            word, _, rest = line.partition(" ")
            word = word.upper()
            if word == "FROM":
                stage += 1
            self.instructions.append((stage, word, re.sub(r"\s+", " ", rest.strip())))
        self.num_stages = stage + 1

    def stage(self, index):
        if index < 0:
            index += self.num_stages
        return [(w, a) for s, w, a in self.instructions if s == index]

    def all(self, word):
        return [a for _, w, a in self.instructions if w == word]

    def global_args(self):
        """{name: default} of the ARGs before the first FROM (the ones FROM may use)."""
        out = {}
        for s, w, a in self.instructions:
            if s < 0 and w == "ARG":
                name, _, default = a.partition("=")
                out[name] = default
        return out

    def base_images(self):
        """Each stage's FROM image with the global ARG defaults substituted."""
        args = self.global_args()
        return [re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args[m.group(1) or m.group(2)],
                       a.split()[0]) for a in self.all("FROM")]


class DockerfileTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.df = Dockerfile(os.path.join(DEPLOY, "Dockerfile"))
        cls.final = cls.df.stage(-1)

    def final_args(self, word):
        return [a for w, a in self.final if w == word]

    def test_multi_stage_cuda_devel_to_runtime_by_default(self):
        froms = self.df.all("FROM")
        self.assertGreaterEqual(len(froms), 2)
        self.assertRegex(froms[0], r" AS builder$")
        images = self.df.base_images()
        self.assertRegex(images[0], r"^nvidia/cuda:\S*devel\S*$")
        self.assertRegex(images[-1], r"^nvidia/cuda:\S*runtime\S*$")
        self.assertTrue(any("--from=builder" in a for a in self.final_args("COPY")))
        # The CUDA backend unless the build says otherwise.
        self.assertIn("SPECD_ENABLE_CUDA=ON", [a for w, a in self.df.stage(0) if w == "ARG"])

    def test_base_images_are_build_arguments(self):
        # A CPU image builds from any Debian 12 base (tests/container_test.py does, with
        # podman): both stages' images and the CUDA switch are build arguments.
        froms = [a.split()[0] for a in self.df.all("FROM")]
        self.assertEqual(froms[0], "${BUILDER_IMAGE}")
        self.assertEqual(froms[-1], "${RUNTIME_IMAGE}")
        self.assertIn("-DSPECD_ENABLE_CUDA=\"${SPECD_ENABLE_CUDA}\"",
                      " ".join(a for w, a in self.df.stage(0) if w == "RUN"))

    def test_base_images_are_pinned(self):
        # hadolint DL3006/DL3007: a tag, never latest. ARGs used in FROM are declared first.
        declared = self.df.global_args()
        for image in self.df.all("FROM"):
            for var in re.findall(r"\$\{(\w+)\}", image.split()[0]):
                self.assertIn(var, declared)
        for ref in self.df.base_images():
            self.assertIn(":", ref)
            self.assertFalse(ref.endswith(":latest"))

    def test_builder_installs_the_deps_script_packages_and_builds_specd(self):
        builder = " ".join(a for w, a in self.df.stage(0) if w == "RUN")
        self.assertIn("tools/install_deps.sh --build", builder)
        self.assertTrue(os.path.exists(os.path.join(SOURCE, "tools", "install_deps.sh")))
        self.assertIn("--target specd", builder)
        with open(os.path.join(SOURCE, "CMakeLists.txt"), encoding="utf-8") as f:
            cmake = f.read()
        for option in re.findall(r"-D(SPECD_\w+)=", builder):
            self.assertRegex(cmake, rf"option\({option}\b")

    def test_runs_as_non_root(self):
        users = self.final_args("USER")
        self.assertTrue(users, "final stage has no USER")
        user = users[-1].split(":")[0]
        self.assertNotIn(user, ("root", "0"))
        self.assertTrue(user.isdigit(), "numeric uid, so Kubernetes runAsNonRoot can verify")
        # The Deployments run as the same uid.
        for _, obj in manifests():
            for name, tpl in pod_templates(obj):
                with self.subTest(template=name):
                    self.assertEqual(str(tpl["spec"]["securityContext"]["runAsUser"]), user)

    def test_exposes_http_and_grpc(self):
        ports = " ".join(self.final_args("EXPOSE")).split()
        self.assertIn("8000", ports)
        self.assertIn("50051", ports)

    def test_healthcheck_hits_health(self):
        checks = self.final_args("HEALTHCHECK")
        self.assertEqual(len(checks), 1)
        self.assertRegex(checks[0], r"CMD .*http://127\.0\.0\.1:8000/health")
        # The tool it uses is installed in the runtime stage.
        tool = re.search(r"CMD (\S+)", checks[0]).group(1)
        installs = " ".join(self.final_args("RUN"))
        self.assertRegex(installs, rf"apt-get install .*\b{tool}\b")

    def test_entrypoint_is_specd_serve_in_exec_form(self):
        # hadolint DL3025: JSON (exec) form, so SIGTERM reaches specd.
        entry = self.final_args("ENTRYPOINT")
        self.assertEqual(len(entry), 1)
        self.assertEqual(json.loads(entry[0]), ["specd", "serve"])
        cmd = json.loads(self.final_args("CMD")[-1])
        flags = serve_flags()
        for arg in cmd:
            if arg.startswith("--"):
                self.assertIn(arg[2:].split("=")[0], flags)

    def test_bundled_model_is_copied(self):
        runs = " ".join(self.df.all("RUN") + self.df.all("COPY"))
        self.assertIn("models/codepair", runs)
        self.assertTrue(os.path.isdir(os.path.join(SOURCE, "models", "codepair", "target")))
        cmd = json.loads(self.final_args("CMD")[-1])
        model = cmd[cmd.index("--model") + 1]
        self.assertTrue(model.startswith("/opt/specd/models/codepair"))

    def test_hadolint_style_rules(self):
        for stage, word, args in self.df.instructions:
            with self.subTest(instruction=f"{word} {args[:60]}"):
                self.assertNotEqual(word, "ADD", "DL3020: use COPY")
                if word == "RUN" and "apt-get install" in args:
                    self.assertIn("--no-install-recommends", args)  # DL3015
                    self.assertIn("-y", args)  # DL3014
                    self.assertIn("rm -rf /var/lib/apt/lists", args + " ".join(
                        a for s, w, a in self.df.instructions if s == stage and w == "RUN"))
                if word == "RUN" and "|" in args.replace("||", ""):
                    # DL4006: a pipe in RUN needs `SHELL [... -o pipefail ...]` first.
                    shells = [a for s, w, a in self.df.instructions if s == stage and w == "SHELL"]
                    self.assertTrue(any("pipefail" in s for s in shells))
                if word == "COPY" and "--from" not in args:
                    for src in args.split()[:-1]:
                        if not src.startswith("--"):
                            self.assertTrue(os.path.exists(os.path.join(SOURCE, src)), src)
                if word == "WORKDIR":
                    self.assertTrue(args.startswith("/"), "DL3000: absolute WORKDIR")

    def test_context_filter_excludes_build_trees(self):
        with open(os.path.join(DEPLOY, "Dockerfile.dockerignore"), encoding="utf-8") as f:
            ignored = f.read().split("\n")
        for entry in (".git", "build"):
            self.assertIn(entry, ignored)


class ManifestTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.objects = manifests()
        cls.configmaps = {o["metadata"]["name"]: o for _, o in cls.objects
                          if o["kind"] == "ConfigMap"}
        cls.workloads = [(p, o) for p, o in cls.objects if pod_templates(o)]

    def templates(self):
        for _, obj in self.workloads:
            yield from pod_templates(obj)

    def test_expected_objects_exist(self):
        kinds = {(o["apiVersion"], o["kind"]) for _, o in self.objects}
        for expected in [("apps/v1", "Deployment"), ("v1", "Service"), ("v1", "ConfigMap"),
                         ("monitoring.coreos.com/v1", "ServiceMonitor"),
                         ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet")]:
            self.assertIn(expected, kinds)

    def test_every_container_has_probes_and_gpu_resources(self):
        for name, tpl in self.templates():
            for c in tpl["spec"]["containers"]:
                with self.subTest(template=name, container=c["name"]):
                    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
                        self.assertIn(probe, c)
                    res = c["resources"]
                    self.assertIn("nvidia.com/gpu", res["limits"])
                    # Extended resources: requests, if given, must equal limits.
                    self.assertEqual(res["requests"].get("nvidia.com/gpu", res["limits"]
                                                         ["nvidia.com/gpu"]),
                                     res["limits"]["nvidia.com/gpu"])
                    self.assertIn("memory", res["limits"])
                    self.assertIn("cpu", res["requests"])

    def test_serving_containers_probe_health_and_ready(self):
        for name, tpl in self.templates():
            for c in tpl["spec"]["containers"]:
                ports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
                if "http" not in ports:
                    continue
                with self.subTest(template=name, container=c["name"]):
                    self.assertEqual(c["livenessProbe"]["httpGet"]["path"], "/health")
                    self.assertEqual(c["readinessProbe"]["httpGet"]["path"], "/ready")
                    self.assertEqual(c["startupProbe"]["httpGet"]["path"], "/health")
                    self.assertEqual(ports["http"], 8000)
                    self.assertEqual(ports.get("grpc"), 50051)

    def test_probe_ports_resolve(self):
        for name, tpl in self.templates():
            for c in tpl["spec"]["containers"]:
                names = {p["name"] for p in c.get("ports", [])}
                numbers = {p["containerPort"] for p in c.get("ports", [])}
                for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
                    port = c[probe]["httpGet"]["port"]
                    with self.subTest(template=name, probe=probe):
                        self.assertIn(port, names | numbers)

    def test_non_root_and_locked_down(self):
        for name, tpl in self.templates():
            pod = tpl["spec"].get("securityContext", {})
            for c in tpl["spec"]["containers"]:
                sc = c.get("securityContext", {})
                with self.subTest(template=name, container=c["name"]):
                    self.assertTrue(sc.get("runAsNonRoot", pod.get("runAsNonRoot")))
                    self.assertNotEqual(sc.get("runAsUser", pod.get("runAsUser")), 0)
                    self.assertIs(sc.get("allowPrivilegeEscalation"), False)
                    self.assertIn("ALL", sc.get("capabilities", {}).get("drop", []))
                    self.assertNotIn("privileged", sc)

    def test_grace_period_covers_prestop_and_drain(self):
        for name, tpl in self.templates():
            spec = tpl["spec"]
            grace = spec.get("terminationGracePeriodSeconds", 30)
            for c in spec["containers"]:
                config = self.mounted_config(spec, c)
                if config is None:
                    continue
                with self.subTest(template=name, container=c["name"]):
                    if any(p["name"] == "http" for p in c.get("ports", [])):
                        self.assertGreater(prestop_seconds(c), 0, "serving pods need preStop")
                    need = prestop_seconds(c) + drain_timeout(config)
                    self.assertGreater(grace, need)

    def mounted_config(self, spec, container):
        """The text of the config file the container's --config names, from its ConfigMap."""
        args = container.get("args", [])
        path = None
        for i, a in enumerate(args):
            if a == "--config":
                path = args[i + 1]
            elif a.startswith("--config="):
                path = a.split("=", 1)[1]
        if path is None:
            return None
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        for m in container.get("volumeMounts", []):
            if path.startswith(m["mountPath"].rstrip("/") + "/"):
                cm = volumes[m["name"]]["configMap"]["name"]
                key = path[len(m["mountPath"].rstrip("/")) + 1:]
                return self.configmaps[cm]["data"][key]
        self.fail(f"--config {path} is not on a mounted volume")

    def test_configmap_configs_parse(self):
        sys.path.insert(0, os.path.join(SOURCE, "config"))
        import check_configs
        with tempfile.TemporaryDirectory() as tmp:
            pb = check_configs.load_config_module(SOURCE, tmp)
            for name, cm in self.configmaps.items():
                for key, text in cm["data"].items():
                    with self.subTest(configmap=name, key=key):
                        config = check_configs.parse_config(pb, key, text)
                        self.assertEqual(config.port, 8000)
                        self.assertEqual(config.grpc_port, 50051)

    def test_volumes_and_configmaps_resolve(self):
        for name, tpl in self.templates():
            spec = tpl["spec"]
            volumes = {v["name"]: v for v in spec.get("volumes", [])}
            for c in spec["containers"]:
                for m in c.get("volumeMounts", []):
                    with self.subTest(template=name, mount=m["name"]):
                        self.assertIn(m["name"], volumes)
            for v in volumes.values():
                if "configMap" in v:
                    self.assertIn(v["configMap"]["name"], self.configmaps)

    def test_prometheus_scraping(self):
        for name, tpl in self.templates():
            containers = tpl["spec"]["containers"]
            http = [p["containerPort"] for c in containers for p in c.get("ports", [])
                    if p["name"] == "http"]
            if not http:
                continue
            ann = tpl["metadata"].get("annotations", {})
            with self.subTest(template=name):
                self.assertEqual(ann.get("prometheus.io/scrape"), "true")
                self.assertEqual(ann.get("prometheus.io/port"), str(http[0]))
                self.assertEqual(ann.get("prometheus.io/path"), "/metrics")

    def test_services_select_pods_and_name_their_ports(self):
        services = [o for _, o in self.objects if o["kind"] == "Service"]
        self.assertTrue(services)
        for svc in services:
            selector = svc["spec"]["selector"]
            matches = []
            for _, obj in self.workloads:
                for name, tpl in pod_templates(obj):
                    labels = dict(tpl["metadata"].get("labels", {}))
                    if obj["kind"] == "LeaderWorkerSet":  # labels the LWS controller adds
                        labels["leaderworkerset.sigs.k8s.io/name"] = obj["metadata"]["name"]
                    if all(labels.get(k) == v for k, v in selector.items()):
                        matches.append(tpl)
            with self.subTest(service=svc["metadata"]["name"]):
                self.assertTrue(matches, "selects no pod template")
                ports = {p["name"]: p["port"] for p in svc["spec"]["ports"]}
                self.assertEqual(ports, {"http": 8000, "grpc": 50051})
                for tpl in matches:
                    names = {p["name"] for c in tpl["spec"]["containers"]
                             for p in c.get("ports", [])}
                    for p in svc["spec"]["ports"]:
                        self.assertIn(p["targetPort"], names)

    def test_servicemonitor_scrapes_a_service_port(self):
        services = [o for _, o in self.objects if o["kind"] == "Service"]
        for _, sm in self.objects:
            if sm["kind"] != "ServiceMonitor":
                continue
            sel = sm["spec"]["selector"]["matchLabels"]
            svc = [s for s in services
                   if all(s["metadata"]["labels"].get(k) == v for k, v in sel.items())]
            self.assertTrue(svc)
            for ep in sm["spec"]["endpoints"]:
                self.assertEqual(ep["path"], "/metrics")
                for s in svc:
                    self.assertIn(ep["port"], [p["name"] for p in s["spec"]["ports"]])

    def test_leaderworkerset_wires_ranks_through_lws_env(self):
        lws = [o for _, o in self.objects if o["kind"] == "LeaderWorkerSet"]
        self.assertEqual(len(lws), 1)
        lwt = lws[0]["spec"]["leaderWorkerTemplate"]
        self.assertGreaterEqual(lwt["size"], 2)
        self.assertEqual(lwt["restartPolicy"], "RecreateGroupOnPodRestart")
        leader = " ".join(lwt["leaderTemplate"]["spec"]["containers"][0]["args"])
        worker = " ".join(lwt["workerTemplate"]["spec"]["containers"][0]["args"])
        for args in (leader, worker):
            self.assertIn("$(LWS_LEADER_ADDRESS)", args)
            self.assertIn("$(LWS_GROUP_SIZE)", args)
        self.assertIn("$(LWS_WORKER_INDEX)", worker)
        # Leader flags are real `specd serve` flags or documented placeholders.
        flags = serve_flags()
        with open(os.path.join(DEPLOY, "README.md"), encoding="utf-8") as f:
            readme = f.read()
        for arg in lwt["leaderTemplate"]["spec"]["containers"][0]["args"]:
            name = arg[2:].split("=")[0]
            with self.subTest(flag=name):
                if name not in flags:
                    self.assertIn(name, LWS_PLACEHOLDER_FLAGS)
                    self.assertIn(f"`--{name}`", readme, "placeholder not documented")

    def test_deployment_args_are_real_serve_flags(self):
        flags = serve_flags()
        for _, obj in self.objects:
            if obj["kind"] != "Deployment":
                continue
            for c in obj["spec"]["template"]["spec"]["containers"]:
                for a in c.get("args", []):
                    if a.startswith("--"):
                        self.assertIn(a[2:].split("=")[0], flags)

    def test_images_are_tagged(self):
        for name, tpl in self.templates():
            for c in tpl["spec"]["containers"]:
                with self.subTest(template=name, container=c["name"]):
                    self.assertRegex(c["image"], r":[\w.-]+$")
                    self.assertFalse(c["image"].endswith(":latest"))


class ToolsTest(unittest.TestCase):
    def run_tool(self, *cmd):
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=SOURCE)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        return p

    def test_yamllint(self):
        targets = ["deploy"] + [os.path.join("config", n) for n in
                                os.listdir(os.path.join(SOURCE, "config"))
                                if n.endswith((".yaml", ".yml"))]
        self.run_tool("yamllint", "--strict", "-c", os.path.join(SOURCE, ".yamllint"), *targets)

    def test_yamllint_catches_a_bad_file(self):
        # The lint above must be able to fail.
        with tempfile.NamedTemporaryFile("w", suffix=".yaml", dir=None) as f:
            f.write("---\nkey: value\nkey: twice\n")
            f.flush()
            p = subprocess.run(["yamllint", "-c", os.path.join(SOURCE, ".yamllint"), f.name],
                               capture_output=True, text=True, timeout=60)
            self.assertNotEqual(p.returncode, 0)

    def test_promtool_rules(self):
        self.run_tool("promtool", "check", "rules", "deploy/prometheus/rules.yaml")
        self.run_tool("promtool", "test", "rules", "deploy/prometheus/rules_test.yaml")

    def test_promtool_config(self):
        path = os.path.join(DEPLOY, "prometheus", "prometheus.yml")
        p = subprocess.run(["promtool", "check", "config", path], capture_output=True,
                           text=True, timeout=60)
        if p.returncode == 0:
            return
        # Debian's promtool is built without Kubernetes service discovery: check a copy with
        # the kubernetes_sd_configs swapped for static targets (relabeling still checked).
        self.assertIn("kubernetes_sd_configs", p.stdout + p.stderr)
        with open(path, encoding="utf-8") as f:
            config = yaml.safe_load(f)
        for job in config["scrape_configs"]:
            if job.pop("kubernetes_sd_configs", None) is not None:
                job["static_configs"] = [{"targets": ["127.0.0.1:8000"]}]
        with tempfile.TemporaryDirectory() as tmp:
            shutil.copy(os.path.join(DEPLOY, "prometheus", "rules.yaml"), tmp)
            with open(os.path.join(tmp, "prometheus.yml"), "w", encoding="utf-8") as f:
                yaml.safe_dump(config, f)
            self.run_tool("promtool", "check", "config", os.path.join(tmp, "prometheus.yml"))

    def test_rules_use_metrics_the_server_exports(self):
        with open(os.path.join(SOURCE, "server", "metrics.cc"), encoding="utf-8") as f:
            exported = set(re.findall(r'"(specd_[a-z_]+)"', f.read()))
        with open(os.path.join(DEPLOY, "prometheus", "rules.yaml"), encoding="utf-8") as f:
            used = set(re.findall(r"\b(specd_[a-z_]+)", f.read()))
        for name in used:
            base = re.sub(r"_(bucket|count|sum)$", "", name)
            self.assertIn(base, exported, name)


def main():
    global SOURCE, DEPLOY
    SOURCE = os.path.abspath(sys.argv[1])
    DEPLOY = os.path.join(SOURCE, "deploy")
    sys.path.insert(0, os.path.join(SOURCE, "tests"))
    import requires  # a missing tool skips (exit 77), under CI=true fails
    requires.programs("deploy_lint_test", "yamllint", "promtool")
    requires.modules("deploy_lint_test", "yaml", "google.protobuf")
    unittest.main(argv=[sys.argv[0]] + sys.argv[2:], verbosity=2)


if __name__ == "__main__":
    main()

"""Offline checks of the Kubernetes manifests in deploy/kubernetes.

Run by scripts/check-kubernetes (which provides the venv and kubectl). No
cluster is needed: every kustomization is rendered with `kubectl kustomize`
and every object it yields is validated against the Kubernetes JSON schemas
that the kubernetes-validate package bundles (strict: unknown fields fail),
for each version in KUBERNETES_VERSIONS. Then what the schemas cannot know:

- every manifest, env and data file under deploy/kubernetes is listed in a
  kustomization, every dashboards/*.json in dashboards/kustomization.yaml;
- no Secret object, no literal secret: variables named like secrets come
  from secretKeyRef, no value holds a URL with credentials or a PEM key;
- every PROXYNET_* variable and --flag a container gives one of the three
  binaries is one that binary reads (docs/config.md is its --help, checked
  against the binaries by the docs test);
- every *_LISTEN port has a containerPort, probes and Services name ports
  that exist, the superproxy's readiness is /readyz;
- every container drops all capabilities, cannot escalate, has a read-only
  root filesystem and resource requests and limits; the binaries run as
  non-root;
- terminationGracePeriodSeconds covers the superproxy's and the agent's
  drain as configured;
- the HorizontalPodAutoscaler's metric is one the superproxy exports and
  the prometheus-adapter rule serves; the scrape config finds every pod.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import yaml

ROOT = Path(__file__).resolve().parents[2]
KDIR = ROOT / "deploy" / "kubernetes"
DASHBOARDS = ROOT / "dashboards"
KUBERNETES_VERSIONS = ["1.30.0", "1.37.0"]
BINARIES = ("control-api", "superproxy", "exit-agent")
WORKLOADS = ("Deployment", "DaemonSet", "StatefulSet", "Job", "CronJob")
MANIFEST_SUFFIXES = (".yaml", ".yml", ".json", ".env")

SECRET_NAME = re.compile(r"PASSWORD|PASSWD|TOKEN|SECRET|CREDENTIAL|DATABASE_URL|REDIS_URL", re.I)
URL_WITH_USERINFO = re.compile(r"\b[a-z][a-z0-9+.-]*://[^/\s@'\"]+@", re.I)
PEM = re.compile(r"-----BEGIN [A-Z ]*-----")
FLAG = re.compile(r"(?<![\w-])--([a-z][a-z0-9-]*)")
ENV_TOKEN = re.compile(r"\bPROXYNET_[A-Z0-9_]+\b")

failures: list[str] = []


def fail(message: str) -> None:
    failures.append(message)


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


# --- docs/config.md: every binary's flags, variables and defaults ---------


def binary_reference() -> dict[str, dict]:
    """{binary: {"flags": set, "env": {NAME: default or None}}} from docs/config.md."""
    text = (ROOT / "docs" / "config.md").read_text()
    out: dict[str, dict] = {}
    section = None
    env_name = None
    for line in text.splitlines():
        heading = re.match(r"^## (\S+)\s*$", line)
        if heading:
            section = heading.group(1) if heading.group(1) in BINARIES else None
            if section:
                out[section] = {"flags": set(), "env": {}}
            continue
        if section is None:
            continue
        option = re.match(r"^\s+(?:-\w, )?--([a-z0-9-]+)", line)
        if option:
            out[section]["flags"].add(option.group(1))
            env_name = None
            continue
        env = re.search(r"\[env: (PROXYNET_[A-Z0-9_]+)", line)
        if env:
            env_name = env.group(1)
            out[section]["env"][env_name] = None
            continue
        default = re.search(r"\[default: ([^\]]*)\]", line)
        if default and env_name:
            out[section]["env"][env_name] = default.group(1)
    for binary in BINARIES:
        if binary not in out or not out[binary]["env"]:
            fail(f"docs/config.md: no reference section for {binary}")
    return out


# --- kustomizations: what they list ---------------------------------------


def kustomization_dirs() -> list[Path]:
    return sorted(p.parent for p in KDIR.rglob("kustomization.yaml"))


def listed_files(kdir: Path) -> set[Path]:
    """Local files (not directories) a kustomization refers to."""
    doc = yaml.safe_load((kdir / "kustomization.yaml").read_text()) or {}
    paths: list[str] = []
    paths += doc.get("resources", []) or []
    paths += doc.get("components", []) or []
    for generator in (doc.get("configMapGenerator") or []) + (doc.get("secretGenerator") or []):
        for entry in generator.get("files", []) or []:
            paths.append(entry.split("=", 1)[-1])
        paths += generator.get("envs", []) or []
        if generator.get("env"):
            paths.append(generator["env"])
    for patch in doc.get("patches", []) or []:
        if isinstance(patch, dict) and patch.get("path"):
            paths.append(patch["path"])
    paths += doc.get("patchesStrategicMerge", []) or []
    if doc.get("secretGenerator"):
        fail(f"{rel(kdir / 'kustomization.yaml')}: has a secretGenerator (Secrets are created outside the manifests)")
    files = set()
    for p in paths:
        if "://" in p:
            fail(f"{rel(kdir / 'kustomization.yaml')}: remote resource {p}")
            continue
        target = (kdir / p).resolve()
        if not target.exists():
            fail(f"{rel(kdir / 'kustomization.yaml')}: lists {p}, which does not exist")
        elif target.is_file():
            files.add(target)
    return files


def check_listing(kdirs: list[Path]) -> None:
    dashboard_listed = listed_files(DASHBOARDS)
    listed: set[Path] = set(dashboard_listed)
    for kdir in kdirs:
        listed |= listed_files(kdir)
    for path in sorted(KDIR.rglob("*")):
        if path.is_file() and path.suffix in MANIFEST_SUFFIXES and path.name != "kustomization.yaml":
            if path.resolve() not in listed:
                fail(f"{rel(path)}: not listed in any kustomization")
    for path in sorted(DASHBOARDS.glob("*.json")):
        if path.resolve() not in dashboard_listed:
            fail(f"{rel(path)}: not in dashboards/kustomization.yaml")


def check_sources_for_secrets() -> None:
    for path in sorted(KDIR.rglob("*")):
        if not path.is_file() or path.suffix not in MANIFEST_SUFFIXES:
            continue
        text = path.read_text()
        if PEM.search(text):
            fail(f"{rel(path)}: holds a PEM block")
        for line in text.splitlines():
            if URL_WITH_USERINFO.search(line):
                fail(f"{rel(path)}: a URL with credentials: {line.strip()}")


# --- rendering and schemas -------------------------------------------------


def render(kubectl: str, kdir: Path) -> list[dict]:
    result = subprocess.run(
        [kubectl, "kustomize", str(kdir)], capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        fail(f"{rel(kdir)}: kubectl kustomize failed:\n{result.stderr.strip()}")
        return []
    return [d for d in yaml.safe_load_all(result.stdout) if d]


def name_of(obj: dict) -> str:
    return f"{obj.get('kind')}/{obj.get('metadata', {}).get('name')}"


def check_schemas(where: str, objects: list[dict]) -> None:
    for obj in objects:
        for version in KUBERNETES_VERSIONS:
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as e:
                path = ".".join(str(p) for p in e.path)
                fail(f"{where}: {name_of(obj)} invalid for Kubernetes {version} at {path}: {e.message}")
            except Exception as e:  # unknown kind, unsupported version
                fail(f"{where}: {name_of(obj)} cannot be validated for Kubernetes {version}: {e}")


# --- what the schemas cannot know -------------------------------------------


def pod_spec(obj: dict) -> dict | None:
    if obj.get("kind") not in WORKLOADS:
        return None
    spec = obj.get("spec", {})
    if obj["kind"] == "CronJob":
        spec = spec.get("jobTemplate", {}).get("spec", {})
    return spec.get("template", {}).get("spec")


def pod_labels(obj: dict) -> dict:
    spec = obj.get("spec", {})
    if obj["kind"] == "CronJob":
        spec = spec.get("jobTemplate", {}).get("spec", {})
    return spec.get("template", {}).get("metadata", {}).get("labels", {}) or {}


def container_binary(container: dict) -> str | None:
    """Which proxynet binary a container runs (its name says; its command must agree)."""
    name = container.get("name")
    if name not in BINARIES:
        return None
    command = " ".join(container.get("command", []) + container.get("args", []))
    if not re.search(rf"(^|[\s/]){re.escape(name)}(\s|$)", command):
        fail(f"container {name}: its command does not run {name}: {command!r}")
    return name


def effective_env(container: dict, configmaps: dict[str, dict]) -> dict[str, str | None]:
    """Variables a container gets: configMapRef'd data, then env (None: from a ref)."""
    env: dict[str, str | None] = {}
    for source in container.get("envFrom", []) or []:
        ref = source.get("configMapRef")
        if ref:
            data = configmaps.get(ref["name"])
            if data is None:
                fail(f"container {container['name']}: envFrom names ConfigMap {ref['name']}, which is not rendered")
            else:
                env.update(data)
        if source.get("secretRef"):
            pass  # names unknown here; values never literal
    for entry in container.get("env", []) or []:
        env[entry["name"]] = entry.get("value")
    return env


def expand(value: str, env: dict[str, str | None]) -> str:
    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m.group(1)) or m.group(0), value)


def check_secret_literals(where: str, obj: dict) -> None:
    if obj.get("kind") == "Secret":
        fail(f"{where}: {name_of(obj)}: a Secret in the manifests (create it outside: deploy/kubernetes/secrets.example.md)")
    if obj.get("kind") == "ConfigMap":
        for key, value in (obj.get("data") or {}).items():
            if SECRET_NAME.search(key) and not key.endswith("_FILE"):
                fail(f"{where}: {name_of(obj)}: {key} in a ConfigMap (secrets come from Secrets)")
            if URL_WITH_USERINFO.search(str(value)) or PEM.search(str(value)):
                fail(f"{where}: {name_of(obj)}: {key} holds a credential")
    spec = pod_spec(obj)
    if spec is None:
        return
    for container in spec.get("initContainers", []) + spec.get("containers", []):
        for entry in container.get("env", []) or []:
            if "value" not in entry:
                continue
            value = str(entry["value"])
            if SECRET_NAME.search(entry["name"]) and not entry["name"].endswith("_FILE"):
                fail(f"{where}: {name_of(obj)}: {container['name']}: {entry['name']} has a literal value (use secretKeyRef)")
            if URL_WITH_USERINFO.search(value) or PEM.search(value):
                fail(f"{where}: {name_of(obj)}: {container['name']}: {entry['name']} holds a credential")


def check_workload(where: str, obj: dict, configmaps: dict[str, dict], reference: dict) -> None:
    spec = pod_spec(obj)
    if spec is None:
        return
    what = f"{where}: {name_of(obj)}"
    pod_security = spec.get("securityContext", {}) or {}
    for container in spec.get("initContainers", []) + spec.get("containers", []):
        cname = container["name"]
        sc = container.get("securityContext", {}) or {}
        if sc.get("allowPrivilegeEscalation") is not False:
            fail(f"{what}: {cname}: allowPrivilegeEscalation is not false")
        if sc.get("readOnlyRootFilesystem") is not True:
            fail(f"{what}: {cname}: readOnlyRootFilesystem is not true")
        if "ALL" not in (sc.get("capabilities", {}) or {}).get("drop", []):
            fail(f"{what}: {cname}: does not drop ALL capabilities")
        resources = container.get("resources", {}) or {}
        for kind in ("requests", "limits"):
            for resource in ("cpu", "memory"):
                if resource not in (resources.get(kind) or {}):
                    fail(f"{what}: {cname}: no {resource} {kind[:-1] if kind == 'limits' else 'request'}")
    for container in spec.get("containers", []):
        cname = container["name"]
        sc = container.get("securityContext", {}) or {}
        non_root = sc.get("runAsNonRoot", pod_security.get("runAsNonRoot"))
        user = sc.get("runAsUser", pod_security.get("runAsUser"))
        if non_root is not True or user in (None, 0):
            fail(f"{what}: {cname}: not run as a non-root numeric user (runAsNonRoot and runAsUser)")
        binary = container_binary(container)
        if binary is None:
            continue
        known = reference.get(binary, {"flags": set(), "env": {}})
        env = effective_env(container, configmaps)
        for name in env:
            if name.startswith("PROXYNET_") and name not in known["env"]:
                fail(f"{what}: {cname}: {binary} reads no {name}")
        script = " ".join(container.get("command", []) + container.get("args", []))
        for name in ENV_TOKEN.findall(script):
            if name not in known["env"]:
                fail(f"{what}: {cname}: {binary} reads no {name}")
        for flag in FLAG.findall(script):
            if flag not in known["flags"]:
                fail(f"{what}: {cname}: {binary} has no --{flag}")
        # Ports: every listener has a containerPort; probes name real ports.
        ports = {p.get("name"): p["containerPort"] for p in container.get("ports", []) or []}
        numbers = set(ports.values())
        for name, value in env.items():
            if name.endswith("_LISTEN") and value:
                port = re.search(r":(\d+)$", expand(value, env))
                if port and int(port.group(1)) not in numbers:
                    fail(f"{what}: {cname}: {name}={value} has no containerPort")
        for probe_kind in ("readinessProbe", "livenessProbe"):
            probe = container.get(probe_kind)
            if not probe:
                fail(f"{what}: {cname}: no {probe_kind}")
                continue
            port = (probe.get("httpGet") or {}).get("port")
            if isinstance(port, str) and port not in ports:
                fail(f"{what}: {cname}: {probe_kind} names port {port}, which the container does not have")
        if binary == "superproxy":
            path = (container.get("readinessProbe", {}).get("httpGet") or {}).get("path")
            if path not in ("/readyz", "/readyz?degraded=serve"):
                fail(f"{what}: superproxy readinessProbe is {path}, not /readyz")
        check_grace(what, binary, spec, env, known)


def drain_ms(env: dict, known: dict, name: str) -> int:
    value = env.get(name) or known["env"].get(name)
    try:
        return int(str(value))
    except ValueError:
        fail(f"{name}={value!r} is not a number of milliseconds")
        return 0


def check_grace(what: str, binary: str, spec: dict, env: dict, known: dict) -> None:
    grace = spec.get("terminationGracePeriodSeconds", 30)
    if binary == "superproxy":
        # drain delay + drain timeout, then the final usage flush.
        need = (drain_ms(env, known, "PROXYNET_DRAIN_DELAY_MS") + drain_ms(env, known, "PROXYNET_DRAIN_TIMEOUT_MS")) / 1000 + 10
    elif binary == "exit-agent":
        need = (drain_ms(env, known, "PROXYNET_DRAIN_ANNOUNCE_MS") + drain_ms(env, known, "PROXYNET_DRAIN_TIMEOUT_MS")) / 1000 + 5
    else:
        return
    if grace < need:
        fail(f"{what}: terminationGracePeriodSeconds {grace} is shorter than the drain ({need:.0f} s with its margin)")


def check_services(where: str, objects: list[dict]) -> None:
    workloads = [o for o in objects if pod_spec(o) is not None]
    for svc in (o for o in objects if o.get("kind") == "Service"):
        selector = svc.get("spec", {}).get("selector") or {}
        pods = [w for w in workloads if selector and selector.items() <= pod_labels(w).items()]
        if not pods:
            fail(f"{where}: {name_of(svc)} selects no pods")
            continue
        names = {p.get("name") for w in pods for c in pod_spec(w)["containers"] for p in c.get("ports", []) or []}
        for port in svc["spec"].get("ports", []):
            target = port.get("targetPort")
            if isinstance(target, str) and target not in names:
                fail(f"{where}: {name_of(svc)}: targetPort {target} is no port of its pods")


def check_autoscaling(where: str, objects: list[dict], configmaps: dict[str, dict]) -> None:
    observability = (ROOT / "docs" / "observability.md").read_text()
    adapter = "\n".join(v for d in configmaps.values() for k, v in d.items() if "adapter" in k)
    for hpa in (o for o in objects if o.get("kind") == "HorizontalPodAutoscaler"):
        for metric in hpa["spec"].get("metrics", []):
            if metric.get("type") != "Pods":
                continue
            name = metric["pods"]["metric"]["name"]
            if f"`{name}`" not in observability:
                fail(f"{where}: {name_of(hpa)}: {name} is not in docs/observability.md's catalogue")
            if name not in adapter:
                fail(f"{where}: {name_of(hpa)}: no prometheus-adapter rule serves {name}")


def check_scrape_config(where: str, objects: list[dict], configmaps: dict[str, dict]) -> None:
    texts = [v for d in configmaps.values() for k, v in d.items() if k == "prometheus.yml"]
    if len(texts) != 1:
        fail(f"{where}: expected one prometheus.yml in a ConfigMap, found {len(texts)}")
        return
    config = yaml.safe_load(texts[0])
    workloads = [o for o in objects if pod_spec(o) is not None]
    for workload in workloads:
        namespace = workload["metadata"].get("namespace")
        labels = pod_labels(workload)
        ports = [p.get("name") for c in pod_spec(workload)["containers"] for p in c.get("ports", []) or []]
        found = False
        for job in config.get("scrape_configs", []):
            for sd in job.get("kubernetes_sd_configs", []):
                if sd.get("role") != "pod":
                    continue
                names = (sd.get("namespaces") or {}).get("names")
                if names and namespace not in names:
                    continue
                wanted = [s["label"] for s in sd.get("selectors", []) if s.get("label")]
                if not all(labels.get(w.split("=", 1)[0]) == w.split("=", 1)[1] for w in wanted):
                    continue
                keeps = [
                    r["regex"]
                    for r in job.get("relabel_configs", [])
                    if r.get("action") == "keep"
                    and r.get("source_labels") == ["__meta_kubernetes_pod_container_port_name"]
                ]
                if all(any(re.fullmatch(k, p or "") for p in ports) for k in keeps):
                    found = True
        if not found:
            fail(f"{where}: prometheus.yml scrapes no port of {name_of(workload)}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kubectl", default="kubectl")
    args = parser.parse_args()

    reference = binary_reference()
    kdirs = kustomization_dirs()
    check_listing(kdirs)
    check_sources_for_secrets()
    for kdir in kdirs:
        where = rel(kdir)
        objects = render(args.kubectl, kdir)
        if not objects:
            continue
        before = len(failures)
        check_schemas(where, objects)
        configmaps = {
            o["metadata"]["name"]: o.get("data") or {} for o in objects if o.get("kind") == "ConfigMap"
        }
        for obj in objects:
            check_secret_literals(where, obj)
            check_workload(where, obj, configmaps, reference)
        check_services(where, objects)
        check_autoscaling(where, objects, configmaps)
        check_scrape_config(where, objects, configmaps)
        kinds = sorted({o["kind"] for o in objects})
        state = "ok" if len(failures) == before else f"{len(failures) - before} problem(s)"
        print(
            f"{where}: {len(objects)} objects ({', '.join(kinds)}), "
            f"schemas {' and '.join(v.rsplit('.', 1)[0] for v in KUBERNETES_VERSIONS)} strict: {state}"
        )
    for message in failures:
        print(f"FAIL {message}", file=sys.stderr)
    if failures:
        print(f"check-kubernetes: {len(failures)} problem(s)", file=sys.stderr)
        return 1
    print("check-kubernetes: every kustomization renders and validates")
    return 0


if __name__ == "__main__":
    sys.exit(main())

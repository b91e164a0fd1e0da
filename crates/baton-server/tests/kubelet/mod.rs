//! The kubelet's part, for the tests of deploy/kubernetes: the manifests
//! read through `scripts/manifests.py` (the same renderer the validation
//! uses), and one pod of a Deployment turned into a podman container the
//! way the kubelet would make it — environment resolved from the ConfigMap,
//! the Secrets and the downward API, `$(VAR)` expanded in the arguments,
//! Secret and emptyDir volumes made as directories, the security context
//! as podman flags — and its probes as the kubelet reads them.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// The repository's root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().expect("the repository's root")
}

/// Runs `scripts/manifests.py ARGS` with the Python of `.baton/venv`
/// (`scripts/setup-clients.sh`); its status, stdout and stderr.
pub fn manifests_py(args: &[&str]) -> (bool, String, String) {
    let python = root().join(".baton/venv/bin/python");
    assert!(python.exists(), "{} is missing; run scripts/setup-clients.sh", python.display());
    let output = Command::new(python)
        .arg(root().join("scripts/manifests.py"))
        .args(args)
        .current_dir(root())
        .output()
        .expect("running scripts/manifests.py");
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (output.status.success(), text(&output.stdout), text(&output.stderr))
}

/// The objects of kustomization directories or YAML files, as rendered.
pub fn objects(paths: &[&str]) -> Vec<Value> {
    let mut args = vec!["objects"];
    args.extend_from_slice(paths);
    let (ok, stdout, stderr) = manifests_py(&args);
    assert!(ok, "scripts/manifests.py objects {paths:?} failed: {stderr}");
    let parsed: Value = serde_json::from_str(&stdout).expect("JSON from scripts/manifests.py");
    parsed.as_array().expect("a list of objects").clone()
}

/// The object of that kind and name.
pub fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind}/{name} among the manifests"))
}

/// The first object of that kind.
pub fn first<'a>(objects: &'a [Value], kind: &str) -> &'a Value {
    objects.iter().find(|o| o["kind"] == kind).unwrap_or_else(|| panic!("no {kind} among the manifests"))
}

/// Bytes of a Kubernetes quantity such as `3Gi` or `512Mi`.
pub fn quantity_bytes(quantity: &str) -> u64 {
    let units = [
        ("Ki", 1u64 << 10),
        ("Mi", 1 << 20),
        ("Gi", 1 << 30),
        ("Ti", 1 << 40),
        ("k", 1000),
        ("M", 1_000_000),
        ("G", 1_000_000_000),
    ];
    for (suffix, factor) in units {
        if let Some(number) = quantity.strip_suffix(suffix) {
            return number.parse::<u64>().unwrap_or_else(|_| panic!("quantity {quantity}")) * factor;
        }
    }
    quantity.parse().unwrap_or_else(|_| panic!("quantity {quantity}"))
}

/// `$(VAR)` references expanded as the kubelet expands them in `args` and
/// `env`: a defined variable is replaced, an undefined one is left as
/// written, and `$$` is a literal `$`.
pub fn expand(text: &str, env: &BTreeMap<String, String>) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let tail = &rest[at..];
        if let Some(after) = tail.strip_prefix("$$") {
            out.push('$');
            rest = after;
        } else if let Some(close) = tail.strip_prefix("$(").and_then(|t| t.find(')')) {
            let name = &tail[2..2 + close];
            match env.get(name) {
                Some(value) => out.push_str(value),
                None => out.push_str(&tail[..3 + close]),
            }
            rest = &tail[3 + close..];
        } else {
            out.push('$');
            rest = &tail[1..];
        }
    }
    out.push_str(rest);
    out
}

/// A probe as the kubelet runs it.
#[derive(Debug, Clone)]
pub struct Probe {
    /// The HTTP path.
    pub path: String,
    /// The container port it targets.
    pub port: u16,
    /// Seconds between tries.
    pub period: u64,
    /// Failures in a row that make it fail.
    pub failure_threshold: u64,
}

/// One pod of a Deployment, resolved against the objects of its namespace.
pub struct Pod {
    /// The pod template's spec.
    pub spec: Value,
    /// Its one container.
    pub container: Value,
    /// The template's labels.
    pub labels: BTreeMap<String, String>,
    /// The resolved environment, in order.
    pub env: Vec<(String, String)>,
}

impl Pod {
    /// The pod `name` of `deployment`, its environment resolved from the
    /// ConfigMaps and Secrets in `objects` as the kubelet does.
    pub fn new(deployment: &Value, name: &str, objects: &[Value]) -> Pod {
        let template = &deployment["spec"]["template"];
        Pod::of_spec(&template["spec"], &template["metadata"]["labels"], name, objects)
    }

    /// A pod of `spec` (a pod spec, or what of one a KServe ServingRuntime
    /// holds: containers and volumes) with these labels.
    pub fn of_spec(spec: &Value, labels: &Value, name: &str, objects: &[Value]) -> Pod {
        let spec = spec.clone();
        let containers = spec["containers"].as_array().expect("containers");
        assert_eq!(containers.len(), 1, "one container per pod");
        let container = containers[0].clone();
        let labels = serde_json::from_value(labels.clone()).unwrap_or_default();
        let mut env = BTreeMap::new();
        let mut ordered = Vec::new();
        for var in container["env"].as_array().into_iter().flatten() {
            let key = var["name"].as_str().expect("an env name").to_owned();
            let value = if let Some(value) = var["value"].as_str() {
                Some(expand(value, &env))
            } else if let Some(field) = var["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
                assert_eq!(field, "metadata.name", "only the pod's name is taken from the downward API here");
                Some(name.to_owned())
            } else if var["valueFrom"]["configMapKeyRef"].is_object() {
                key_of(objects, "ConfigMap", &var["valueFrom"]["configMapKeyRef"])
            } else if var["valueFrom"]["secretKeyRef"].is_object() {
                key_of(objects, "Secret", &var["valueFrom"]["secretKeyRef"])
            } else {
                panic!("an env entry this kubelet does not resolve: {var}")
            };
            if let Some(value) = value {
                env.insert(key.clone(), value.clone());
                ordered.push((key, value));
            }
        }
        Pod { spec, container, labels, env: ordered }
    }

    /// The arguments, `$(VAR)` expanded.
    pub fn args(&self) -> Vec<String> {
        let env: BTreeMap<String, String> = self.env.iter().cloned().collect();
        let args = self.container["args"].as_array().expect("args");
        args.iter().map(|a| expand(a.as_str().expect("a string argument"), &env)).collect()
    }

    /// The container port a probe or a Service names (by name or number).
    pub fn port(&self, port: &Value) -> u16 {
        if let Some(number) = port.as_u64() {
            return u16::try_from(number).expect("a port number");
        }
        let name = port.as_str().expect("a port name or number");
        self.ports().get(name).copied().unwrap_or_else(|| panic!("the container has no port named {name}"))
    }

    /// The container's ports by name (a port without one by its number).
    pub fn ports(&self) -> BTreeMap<String, u16> {
        let ports = self.container["ports"].as_array().expect("ports");
        ports
            .iter()
            .map(|p| {
                let number = p["containerPort"].as_u64().unwrap() as u16;
                (p["name"].as_str().map_or_else(|| number.to_string(), str::to_owned), number)
            })
            .collect()
    }

    /// The probe of that kind (`startupProbe`, `readinessProbe`, `livenessProbe`).
    pub fn probe(&self, kind: &str) -> Probe {
        let probe = &self.container[kind];
        assert!(probe.is_object(), "the container has no {kind}");
        let number = |field: &str, default: u64| probe[field].as_u64().unwrap_or(default);
        Probe {
            path: probe["httpGet"]["path"].as_str().unwrap_or_else(|| panic!("{kind} is not an HTTP GET")).to_owned(),
            port: self.port(&probe["httpGet"]["port"]),
            period: number("periodSeconds", 10),
            failure_threshold: number("failureThreshold", 3),
        }
    }

    /// The pod's grace period in seconds.
    pub fn grace_seconds(&self) -> u64 {
        self.spec["terminationGracePeriodSeconds"].as_u64().unwrap_or(30)
    }

    /// The podman flags for the pod's and the container's security
    /// context and memory limit.
    pub fn security_flags(&self) -> Vec<String> {
        let pod = &self.spec["securityContext"];
        let own = &self.container["securityContext"];
        let pick = |field: &str| own[field].as_u64().or_else(|| pod[field].as_u64());
        let mut flags = Vec::new();
        let user = pick("runAsUser").expect("runAsUser");
        let group = pick("runAsGroup").unwrap_or(user);
        assert!(pod["runAsNonRoot"] == true || own["runAsNonRoot"] == true, "runAsNonRoot");
        flags.push(format!("--user={user}:{group}"));
        if let Some(fs_group) = pod["fsGroup"].as_u64() {
            flags.push(format!("--group-add={fs_group}"));
        }
        if own["readOnlyRootFilesystem"] == true {
            // The pod mounts its own /tmp: no tmpfs of podman's.
            flags.extend(["--read-only".to_owned(), "--read-only-tmpfs=false".to_owned()]);
        }
        if own["allowPrivilegeEscalation"] == false {
            flags.push("--security-opt=no-new-privileges".to_owned());
        }
        for cap in own["capabilities"]["drop"].as_array().into_iter().flatten() {
            flags.push(format!("--cap-drop={}", cap.as_str().unwrap()));
        }
        if let Some(memory) = self.container["resources"]["limits"]["memory"].as_str() {
            flags.push(format!("--memory={}", quantity_bytes(memory)));
        }
        flags
    }

    /// The pod's volumes made as directories under `dir` (Secrets from
    /// `objects`, emptyDirs empty), owned as the kubelet makes them for
    /// the pod's fsGroup; each with its mount path and whether read-only.
    pub fn volumes(&self, dir: &Path, objects: &[Value]) -> Vec<(PathBuf, String, bool)> {
        let fs_group = self.spec["securityContext"]["fsGroup"].as_u64().map(|g| g as u32);
        let mut made = BTreeMap::new();
        for volume in self.spec["volumes"].as_array().into_iter().flatten() {
            let name = volume["name"].as_str().unwrap();
            let path = dir.join(name);
            std::fs::create_dir_all(&path).unwrap();
            if let Some(secret) = volume["secret"].as_object() {
                let mode = secret.get("defaultMode").and_then(Value::as_u64).unwrap_or(0o644) as u32;
                let object = find(objects, "Secret", secret["secretName"].as_str().unwrap());
                for (key, value) in secret_data(object) {
                    let file = path.join(key);
                    std::fs::write(&file, value).unwrap();
                    chown(&file, fs_group);
                    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(mode)).unwrap();
                }
                chown(&path, fs_group);
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
            } else if volume["emptyDir"].is_object() {
                // An emptyDir is world-writable, as the kubelet makes it.
                chown(&path, fs_group);
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o2777)).unwrap();
            } else {
                panic!("a volume this kubelet does not make: {volume}");
            }
            made.insert(name.to_owned(), path);
        }
        let mounts = self.container["volumeMounts"].as_array().expect("volumeMounts");
        mounts
            .iter()
            .map(|m| {
                let name = m["name"].as_str().unwrap();
                let path = made.get(name).unwrap_or_else(|| panic!("no volume {name}")).clone();
                (path, m["mountPath"].as_str().unwrap().to_owned(), m["readOnly"] == true)
            })
            .collect()
    }
}

fn key_of(objects: &[Value], kind: &str, reference: &Value) -> Option<String> {
    let name = reference["name"].as_str().expect("a reference's name");
    let key = reference["key"].as_str().expect("a reference's key");
    let object = find(objects, kind, name);
    let data = if kind == "Secret" { secret_data(object) } else { string_map(&object["data"]) };
    match data.get(key) {
        Some(value) => Some(value.clone()),
        None if reference["optional"] == true => None,
        None => panic!("{kind} {name} has no key {key}: the kubelet would not start the container"),
    }
}

fn string_map(value: &Value) -> BTreeMap<String, String> {
    value
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_else(|| panic!("{k} is not a string")).to_owned()))
        .collect()
}

/// A Secret's keys and values: `stringData` as written (this kit's
/// Secrets are made by the tests, never base64 `data`).
fn secret_data(secret: &Value) -> BTreeMap<String, String> {
    assert!(secret["data"].is_null(), "the test's Secrets carry stringData");
    string_map(&secret["stringData"])
}

fn chown(path: &Path, group: Option<u32>) {
    if let Some(group) = group {
        std::os::unix::fs::chown(path, Some(0), Some(group))
            .unwrap_or_else(|e| panic!("chown {}: {e}", path.display()));
    }
}

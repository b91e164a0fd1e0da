//! The Kubernetes manifests (deploy/kubernetes, its fleet/ overlay) and the
//! KServe runtime (deploy/kserve): validated offline against Kubernetes'
//! and KServe's schemas by `scripts/manifests.py`, which refuses a misspelt
//! field or a broken reference; and the Deployment's pod run under podman
//! from the image, with exactly the arguments, environment, volumes, user
//! and read-only root the manifests give it, probed, used and terminated
//! as the kubelet would.

mod common;
mod kubelet;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use baton_protocol::grpc::pb::ServerReadyRequest;
use baton_protocol::grpc::pb::grpc_inference_service_client::GrpcInferenceServiceClient;
use baton_testkit::certs::Certs;
use baton_testkit::etcd::{Etcd, Security, ServerTls};
use baton_testkit::onnx::Mlp;
use baton_testkit::onnx::sample_input;
use baton_testkit::podman::{Container, Image, Network, Run};
use baton_testkit::repo::{TestRepo, mlp_toml};
use baton_testkit::s3::S3;
use baton_testkit::server::{Client, PATIENCE, eventually, free_port};
use common::{assert_close, bin, output_f32, repo_with, request, version_of};
use kubelet::{Pod, find, first, manifests_py, objects, root};
use serde_json::{Value, json};

/// The served MLP's layer widths: 1100 × 1100 FP32 weights are 4.6 MiB.
const MODEL_SIZES: [usize; 4] = [8, 1100, 1100, 2];

/// Everything the validation covers: both kustomizations, the Secrets'
/// example and the KServe resources.
const MANIFESTS: &[&str] = &[
    "deploy/kubernetes",
    "deploy/kubernetes/fleet",
    "deploy/kubernetes/secrets.example.yaml",
    "deploy/kserve",
    "deploy/kserve/inferenceservice.yaml",
];

#[test]
fn every_manifest_validates_offline() {
    let (ok, stdout, stderr) = manifests_py(&[&["validate"], MANIFESTS].concat());
    assert!(ok, "the manifests do not validate:\n{stderr}");
    assert!(stdout.contains("objects valid"), "{stdout}");
}

#[test]
fn a_misspelt_field_or_a_broken_reference_fails_validation() {
    // (file, text, replaced by, what the refusal names)
    let faults: &[(&str, &str, &str, &str)] = &[
        ("kubernetes/base/deployment.yaml", "readinessProbe:", "readinesProbe:", "'readinesProbe' was unexpected"),
        ("kubernetes/base/deployment.yaml", "path: /v2/health/live", "pth: /v2/health/live", "'pth' was unexpected"),
        ("kubernetes/base/deployment.yaml", "runAsNonRoot: true", "runAsNonRoot: yes-please", "runAsNonRoot"),
        ("kubernetes/base/pdb.yaml", "maxUnavailable", "maxUnavaliable", "'maxUnavaliable' was unexpected"),
        ("kubernetes/base/service.yaml", "targetPort: grpc", "targetPort: grcp", "targetPort 'grcp'"),
        ("kubernetes/base/networkpolicy.yaml", "port: admin-http", "port: admin-htp", "port 'admin-htp'"),
        ("kubernetes/base/networkpolicy.yaml", "app.kubernetes.io/name: baton", "app: baton", "matches no pod"),
        ("kubernetes/base/deployment.yaml", "$(BATON_REPO)", "$(BATON_REP)", "$(BATON_REP)"),
        ("kubernetes/base/deployment.yaml", "key: BATON_LOG", "key: BATON_LOGS", "key BATON_LOGS"),
        ("kubernetes/fleet/cluster-args.yaml", "mountPath: /etc/baton/etcd", "mountpath: /etc/baton/etcd", "mountPath"),
        ("kubernetes/fleet/cluster-args.yaml", "containers/0/env/-", "containers/0/envs/-", "names nothing"),
        ("kserve/servingruntime.yaml", "protocolVersions:", "protocolVersion:", "unknown field 'protocolVersion'"),
        ("kserve/servingruntime.yaml", "readOnlyRootFilesystem", "readOnlyRootFileSystem", "'readOnlyRootFileSystem'"),
        ("kserve/inferenceservice.yaml", "storageUri", "storageURI", "unknown field 'storageURI'"),
        // Keys the renderer does not follow are refused, not ignored.
        (
            "kubernetes/base/kustomization.yaml",
            "  - pairs:",
            "  - includeSelectors: true\n    pairs:",
            "includeSelectors",
        ),
        ("kubernetes/base/kustomization.yaml", "    newTag: 0.1.0", "    newTg: 0.1.0", "newTg"),
        ("kserve/kustomization.yaml", "  - name: baton", "  - nme: baton", "nme"),
    ];
    let copy = tempfile::tempdir().unwrap();
    let paths: Vec<String> =
        MANIFESTS.iter().map(|p| copy.path().join(p.trim_start_matches("deploy/")).display().to_string()).collect();
    let paths: Vec<&str> = paths.iter().map(String::as_str).collect();
    let validate = || manifests_py(&[&["validate"], paths.as_slice()].concat());
    copy_dir(&root().join("deploy"), copy.path());
    let (ok, _, stderr) = validate();
    assert!(ok, "the unchanged copy must validate: {stderr}");
    for (file, from, to, needle) in faults {
        copy_dir(&root().join("deploy"), copy.path());
        let target = copy.path().join(file);
        let text = std::fs::read_to_string(&target).unwrap();
        assert!(text.contains(from), "{file} no longer holds {from:?}: update this test");
        std::fs::write(&target, text.replacen(from, to, 1)).unwrap();
        let (ok, stdout, stderr) = validate();
        assert!(!ok, "{file} with {to:?} for {from:?} passed validation: {stdout}");
        assert!(stderr.contains(needle), "{file} with {to:?}: the refusal does not name {needle:?}: {stderr}");
    }
}

/// A number of seconds from a duration argument such as `10s` or `1m`.
fn seconds(value: &str) -> u64 {
    let (number, unit) = value.split_at(value.find(|c: char| !c.is_ascii_digit()).unwrap_or(value.len()));
    let number: u64 = number.parse().unwrap_or_else(|_| panic!("a duration: {value}"));
    match unit {
        "s" | "" => number,
        "m" => number * 60,
        _ => panic!("a duration in s or m: {value}"),
    }
}

/// Bytes of a quantity such as `3Gi` or `512MiB`.
fn bytes(value: &str) -> u64 {
    let units = [("GiB", 1u64 << 30), ("MiB", 1 << 20), ("Gi", 1 << 30), ("Mi", 1 << 20)];
    let (digits, scale) = units
        .iter()
        .find_map(|(unit, scale)| value.strip_suffix(unit).map(|d| (d, *scale)))
        .unwrap_or_else(|| panic!("a quantity in Gi or Mi: {value}"));
    digits.parse::<u64>().unwrap() * scale
}

/// The value of `--NAME=VALUE` in `args`.
fn flag<'a>(args: &'a [Value], name: &str) -> Option<&'a str> {
    args.iter().filter_map(Value::as_str).find_map(|a| a.strip_prefix(&format!("{name}=")))
}

#[test]
fn the_manifests_fit_their_grace_periods_and_give_what_they_promise() {
    let kube = objects(&["deploy/kubernetes"]);
    let fleet = objects(&["deploy/kubernetes/fleet"]);
    let kserve = objects(&["deploy/kserve"]);
    let runtime = first(&kserve, "ServingRuntime");
    let pods = [
        ("Deployment", &find(&kube, "Deployment", "baton")["spec"]["template"]["spec"]),
        ("fleet Deployment", &find(&fleet, "Deployment", "baton")["spec"]["template"]["spec"]),
        // KServe gives its pods the default grace period; a ServingRuntime cannot set another.
        ("ServingRuntime", &runtime["spec"]),
    ];
    for (what, spec) in pods {
        let container = &spec["containers"][0];
        let args = container["args"].as_array().expect("args");
        // init's flags come before `serve`, the server's after it.
        let serve = args.iter().position(|a| a == "serve").expect("a serve argument");
        let (init, server) = args.split_at(serve);
        let grace = spec["terminationGracePeriodSeconds"].as_u64().unwrap_or(30);
        let pre_stop = container["lifecycle"]["preStop"]["sleep"]["seconds"].as_u64().unwrap_or(0);
        let delay = seconds(flag(server, "--shutdown-delay").unwrap_or("0s"));
        let timeout = seconds(flag(server, "--shutdown-timeout").unwrap_or("30s"));
        let stop = seconds(flag(init, "--stop-timeout").unwrap_or("10s"));
        let total = pre_stop + delay + timeout + stop;
        assert!(
            total < grace,
            "{what}: preStop {pre_stop} + delay {delay} + timeout {timeout} + stop {stop} = {total} s, not under the grace period {grace} s"
        );
        // Every line JSON: init's log as the server's.
        assert_eq!(flag(init, "--log-format"), Some("json"), "{what}: init's log format: {args:?}");
        assert_eq!(flag(server, "--log-format"), Some("json"), "{what}: the server's log format: {args:?}");
        // The models' and the requests' budgets fit under the memory limit.
        let limit = bytes(container["resources"]["limits"]["memory"].as_str().expect("a memory limit"));
        let budgets =
            bytes(flag(server, "--memory-budget").unwrap()) + bytes(flag(server, "--request-memory-budget").unwrap());
        assert!(budgets < limit, "{what}: budgets {budgets} over the limit {limit}");
        // Every listener's port is a container port or loopback-only.
        for listener in ["--http", "--grpc", "--admin-http", "--admin-grpc"] {
            let Some(address) = flag(server, listener) else { continue };
            let port: u64 = address.rsplit(':').next().unwrap().parse().unwrap();
            let declared = container["ports"].as_array().unwrap().iter().any(|p| p["containerPort"] == port);
            assert!(declared || address.starts_with("127.0.0.1:"), "{what}: {listener}={address} is no container port");
        }
        let seccomp = [&spec["securityContext"], &container["securityContext"]]
            .iter()
            .any(|c| c["seccompProfile"]["type"] == "RuntimeDefault");
        assert!(seccomp, "{what}: no seccompProfile RuntimeDefault");
    }

    // The runtime's own CLI finds its admin listener.
    let container = &runtime["spec"]["containers"][0];
    let url = container["env"].as_array().unwrap().iter().find(|e| e["name"] == "BATON_URL").expect("BATON_URL");
    let admin = flag(container["args"].as_array().unwrap(), "--admin-http").unwrap();
    assert_eq!(url["value"], format!("http://{admin}"), "BATON_URL names the runtime's admin listener");

    // The images are set by kustomization.yaml, not hard-coded: the
    // renderer rewrites both, as `kustomize edit set image` would.
    let copy = tempfile::tempdir().unwrap();
    copy_dir(&root().join("deploy"), copy.path());
    for dir in ["kubernetes/base", "kserve"] {
        let path = copy.path().join(dir).join("kustomization.yaml");
        let text = std::fs::read_to_string(&path).unwrap();
        let text = text.replace("newName: localhost/baton", "newName: registry.example.com/ml/baton");
        std::fs::write(&path, text.replace("newTag: 0.1.0", "newTag: 9.9.9")).unwrap();
    }
    for dir in ["kubernetes", "kserve"] {
        let rendered = objects(&[copy.path().join(dir).to_str().unwrap()]);
        let images: Vec<&Value> = rendered
            .iter()
            .flat_map(|o| [&o["spec"]["template"]["spec"]["containers"], &o["spec"]["containers"]])
            .filter_map(Value::as_array)
            .flatten()
            .map(|c| &c["image"])
            .collect();
        assert!(!images.is_empty(), "{dir}: no container");
        for image in images {
            assert_eq!(image, "registry.example.com/ml/baton:9.9.9", "{dir}: the image is not the kustomization's");
        }
    }

    // A digest pins the image; an entry without newTag keeps the tag.
    let path = copy.path().join("kserve/kustomization.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, text.replace("newTag: 9.9.9", "digest: sha256:0123abcd")).unwrap();
    let pinned = objects(&[copy.path().join("kserve").to_str().unwrap()]);
    assert_eq!(
        first(&pinned, "ServingRuntime")["spec"]["containers"][0]["image"],
        "registry.example.com/ml/baton@sha256:0123abcd"
    );
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, text.replace("    digest: sha256:0123abcd\n", "")).unwrap();
    let kept = objects(&[copy.path().join("kserve").to_str().unwrap()]);
    assert_eq!(first(&kept, "ServingRuntime")["spec"]["containers"][0]["image"], "registry.example.com/ml/baton");

    // The fleet shares the outcome ids' key, read from a Secret's volume.
    let deployment = find(&fleet, "Deployment", "baton");
    let spec = &deployment["spec"]["template"]["spec"];
    let key =
        flag(spec["containers"][0]["args"].as_array().unwrap(), "--outcomes-key-file").expect("--outcomes-key-file");
    let mount = spec["containers"][0]["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| key.starts_with(&format!("{}/", m["mountPath"].as_str().unwrap())))
        .unwrap_or_else(|| panic!("{key} is in no volume mount"));
    let volume = spec["volumes"].as_array().unwrap().iter().find(|v| v["name"] == mount["name"]).unwrap();
    let secret = volume["secret"]["secretName"].as_str().unwrap_or_else(|| panic!("{key}: not a Secret's volume"));
    let file = key.rsplit('/').next().unwrap();
    let example = kubelet::objects(&["deploy/kubernetes/secrets.example.yaml"]);
    assert!(
        find(&example, "Secret", secret)["stringData"][file].is_string(),
        "secrets.example.yaml: {secret} lacks {file}"
    );

    // The admin ports are open only to pods labelled baton-admin, in the
    // policy's own namespace.
    let policy = first(&kube, "NetworkPolicy");
    let pod = &find(&kube, "Deployment", "baton")["spec"]["template"]["spec"]["containers"][0];
    let admin_ports: Vec<&Value> =
        pod["ports"].as_array().unwrap().iter().filter(|p| p["name"].as_str().unwrap().starts_with("admin")).collect();
    for rule in policy["spec"]["ingress"].as_array().unwrap() {
        let opens_admin = rule["ports"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| admin_ports.iter().any(|a| p["port"] == a["name"] || p["port"] == a["containerPort"]));
        if !opens_admin {
            continue;
        }
        let from = rule["from"].as_array().filter(|f| !f.is_empty()).unwrap_or_else(|| panic!("open to all: {rule}"));
        for peer in from {
            assert_eq!(peer["podSelector"]["matchLabels"]["baton-admin"], "true", "a peer not labelled: {peer}");
            assert!(
                peer.get("namespaceSelector").is_none() && peer.get("ipBlock").is_none(),
                "a peer too wide: {peer}"
            );
        }
    }

    // A rollout is not declared failed while a new pod may still be within
    // its startup probe's window.
    let deployment = find(&kube, "Deployment", "baton");
    let probe = &deployment["spec"]["template"]["spec"]["containers"][0]["startupProbe"];
    let window = probe["periodSeconds"].as_u64().unwrap() * probe["failureThreshold"].as_u64().unwrap();
    let deadline = deployment["spec"]["progressDeadlineSeconds"].as_u64().unwrap_or(600);
    assert!(deadline > window, "progressDeadlineSeconds {deadline} within the startup window {window} s");
}

fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

/// The Secrets secrets.example.yaml shows, holding the test's S3 keys and
/// tokens (the etcd Secret left as the example has it).
fn objects_of_secrets(s3: &S3, token: &str) -> Vec<Value> {
    let mut secrets = kubelet::objects(&["deploy/kubernetes/secrets.example.yaml"]);
    let (key, secret) = &s3.credentials;
    let values = [
        ("baton-admin", "token", token.to_owned()),
        ("baton-admin", "outcomes-token", format!("outcomes-{token}")),
        (
            "baton-s3",
            "credentials",
            format!("[default]\naws_access_key_id = {key}\naws_secret_access_key = {secret}\n"),
        ),
    ];
    for (name, field, value) in values {
        let object = secrets.iter_mut().find(|o| o["metadata"]["name"] == name).expect("an example Secret");
        assert!(object["stringData"][field].is_string(), "secrets.example.yaml: {name} has no key {field}");
        object["stringData"][field] = json!(value);
    }
    secrets
}

/// The Deployment's pod, its environment taken from the ConfigMap as an
/// operator edits it (the test's store) and from Secrets of the shape
/// secrets.example.yaml shows (the test's credentials and token).
fn pod_for(s3: &S3, token: &str) -> (Vec<Value>, Pod) {
    let mut objects = objects(&["deploy/kubernetes"]);
    let config = objects.iter_mut().find(|o| o["kind"] == "ConfigMap").expect("a ConfigMap");
    config["data"]["AWS_ENDPOINT_URL"] = json!(s3.endpoint());
    config["data"]["AWS_ALLOW_HTTP"] = json!("true");
    let secrets = objects_of_secrets(s3, token);
    objects.extend(secrets);
    let deployment = find(&objects, "Deployment", "baton").clone();
    let pod = Pod::new(&deployment, "baton-5d8f7c9b4-x2k7q", &objects);
    (objects, pod)
}

#[test]
fn the_deployment_runs_under_podman_as_the_kubelet_would_run_it() {
    let s3 = S3::start();
    s3.create_bucket("models");
    // Over 4 MiB of weights: baton stages them into $TMPDIR, which only
    // the pod's emptyDir makes writable under a read-only root.
    let model = Mlp::new(&MODEL_SIZES, 11);
    let repo = TestRepo::new();
    repo.add_model("m", &mlp_toml(&model, ""));
    repo.publish_mlp("m", 1, &model);
    let token = format!("token-{}-{}", std::process::id(), free_port());
    let (objects, pod) = pod_for(&s3, &token);
    let repo_url = pod.env.iter().find(|(k, _)| k == "BATON_REPO").expect("BATON_REPO").1.clone();
    let prefix = repo_url.strip_prefix("s3://models/").expect("the ConfigMap's repository is in bucket models");
    s3.publish_model("models", prefix, &repo.root().join("m"));

    // The image the manifests name is this build's version of baton; the
    // test runs the image built from the binary under test in its place.
    let deployment = find(&objects, "Deployment", "baton");
    let image = deployment["spec"]["template"]["spec"]["containers"][0]["image"].as_str().unwrap();
    assert_eq!(image, format!("localhost/baton:{}", env!("CARGO_PKG_VERSION")));

    let volumes_dir = tempfile::tempdir().unwrap();
    let volumes = pod.volumes(volumes_dir.path(), &objects);
    let ports = pod.ports();
    let (container, moved) = start_pod(&pod, &volumes, "startupProbe");
    let url = |port: u16| format!("http://127.0.0.1:{}", moved[&port]);
    // podman applied the pod's security context.
    assert_eq!(container.inspect("{{.HostConfig.ReadonlyRootfs}}"), "true");
    assert_eq!(container.inspect("{{.Config.User}}"), "10001:10001");
    let dropped = container.inspect("{{.HostConfig.CapDrop}}");
    assert!(dropped.contains("CAP_NET_BIND_SERVICE"), "capabilities dropped: {dropped}");

    for kind in ["readinessProbe", "livenessProbe"] {
        let probe = pod.probe(kind);
        let answer = Client::new(&url(probe.port)).get(&probe.path);
        assert_eq!(answer.status, 200, "{kind} {}: {}", probe.path, String::from_utf8_lossy(&answer.body));
    }

    // The Service, the PodDisruptionBudget and the NetworkPolicy select
    // this pod; the Service reaches REST and gRPC and never the admin
    // listener.
    let service = first(&objects, "Service");
    let pdb = first(&objects, "PodDisruptionBudget");
    let policy = first(&objects, "NetworkPolicy");
    let selectors = [
        ("Service", &service["spec"]["selector"]),
        ("PDB", &pdb["spec"]["selector"]["matchLabels"]),
        ("NetworkPolicy", &policy["spec"]["podSelector"]["matchLabels"]),
    ];
    for (what, selector) in selectors {
        for (key, value) in selector.as_object().expect("a selector") {
            assert_eq!(pod.labels.get(key).map(String::as_str), value.as_str(), "the {what}'s selector {key}");
        }
    }
    let targets: Vec<u16> =
        service["spec"]["ports"].as_array().unwrap().iter().map(|p| pod.port(&p["targetPort"])).collect();
    assert_eq!(targets, vec![ports["http"], ports["grpc"]], "the Service targets REST and gRPC");
    for admin in ["--admin-http=", "--admin-grpc="] {
        let arg = pod.args().into_iter().find(|a| a.starts_with(admin)).unwrap_or_else(|| panic!("no {admin}"));
        let port: u16 = arg.rsplit(':').next().unwrap().parse().unwrap();
        assert!(!targets.contains(&port), "the Service exposes the admin listener {arg}");
        // The policy opens the admin ports only to some pods.
        for rule in policy["spec"]["ingress"].as_array().unwrap() {
            let opens = rule["ports"].as_array().unwrap().iter().any(|p| pod.port(&p["port"]) == port);
            assert!(!opens || rule["from"].is_array(), "the NetworkPolicy opens {arg} to every pod: {rule}");
        }
    }

    // An inference through the Service's REST port, readiness through its
    // gRPC port.
    let rest = Client::new(&url(ports["http"]));
    let (batch, input) = (2, sample_input(MODEL_SIZES[0], 2, 7));
    let answer = rest.post_json("/v2/models/m/infer", &request(&input, batch));
    assert_eq!(answer.status, 200, "inference: {}", String::from_utf8_lossy(&answer.body));
    assert_eq!(version_of(&answer.json()), 1);
    assert_close(&output_f32(&answer.json(), "output"), &model.forward(&input, batch), "the pod's answer");
    let runtime = common::grpc::runtime();
    runtime.block_on(async {
        let channel = common::grpc::channel_to(&format!("127.0.0.1:{}", moved[&ports["grpc"]])).await;
        let mut grpc = GrpcInferenceServiceClient::new(channel);
        let ready = common::grpc::within("ServerReady", grpc.server_ready(ServerReadyRequest {})).await;
        assert!(ready.expect("ServerReady").into_inner().ready);
    });

    // The pod's volumes give baton every place it writes (staged weights in
    // $TMPDIR, the cache, the state): it warned of nothing so far.
    let log = container.logs();
    let warnings: Vec<&str> = log.lines().filter(|l| l.contains(r#""level":"WARN""#)).collect();
    assert!(warnings.is_empty(), "baton warned while it started and served:\n{}", warnings.join("\n"));

    // Management lives on the admin listener only, behind the Secret's token.
    let load = "/v2/repository/models/m/load";
    let refused = rest.post_json(load, &json!({}));
    assert_eq!(refused.status, 403, "management on the inference port: {}", String::from_utf8_lossy(&refused.body));
    let admin = Client::new(&url(ports["admin-http"]));
    assert_eq!(admin.post_json(load, &json!({})).status, 401, "management without the token");
    let bearer = format!("Bearer {token}");
    let headers = [("content-type", "application/json"), ("authorization", bearer.as_str())];
    let loaded = admin.post_raw(load, b"{}", &headers);
    assert_eq!(loaded.status, 200, "management with the Secret's token: {}", String::from_utf8_lossy(&loaded.body));

    // Termination as the kubelet does it: the preStop hook, then SIGTERM,
    // SIGKILL at terminationGracePeriodSeconds. Requests keep coming all
    // along, as from a proxy that has not yet heard the pod is going.
    let (stop, failed, answered) =
        (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let traffic = {
        let (rest, body) = (rest.clone(), request(&input, batch));
        let (stop, failed, answered) = (Arc::clone(&stop), Arc::clone(&failed), Arc::clone(&answered));
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                match rest.try_post_raw("/v2/models/m/infer", body.to_string().as_bytes(), &[]) {
                    Ok(a) if a.status == 200 => answered.fetch_add(1, Ordering::Relaxed),
                    _ => failed.fetch_add(1, Ordering::Relaxed),
                };
            }
        })
    };
    let terminating = Instant::now();
    let grace = Duration::from_secs(pod.grace_seconds());
    let pre_stop = &pod.container["lifecycle"]["preStop"];
    let hook = Duration::from_secs(pre_stop["sleep"]["seconds"].as_u64().expect("preStop is the kubelet's sleep"));
    // The hook is the kubelet sleeping: the server hears nothing yet.
    std::thread::sleep(hook);
    assert_eq!(rest.get("/v2/health/ready").status, 200, "ready until SIGTERM");
    container.kill("TERM");
    let draining = eventually("readiness to fail after SIGTERM", || {
        let answer = rest.try_get("/v2/health/ready").ok()?;
        (answer.status == 503).then(|| answer.json())
    });
    assert_eq!(draining["draining"], true, "{draining}");
    let before = answered.load(Ordering::Relaxed);
    eventually("requests answered while readiness fails (the shutdown delay)", || {
        (answered.load(Ordering::Relaxed) > before + 3).then_some(())
    });
    assert_eq!(failed.load(Ordering::Relaxed), 0, "no request failed through the hook and the delay");
    let status = container.wait_exit();
    let ended = terminating.elapsed();
    stop.store(true, Ordering::Relaxed);
    traffic.join().unwrap();
    assert_eq!(status, 0, "the container's exit status:\n{}", container.logs());
    assert_json_log(&container.logs());
    assert!(ended < grace, "the pod ended {ended:?} after termination began, past its grace period {grace:?}");
    eprintln!(
        "terminated in {ended:?} (hook {hook:?}, grace {grace:?}); {} requests answered, {} refused after close",
        answered.load(Ordering::Relaxed),
        failed.load(Ordering::Relaxed)
    );
}

#[test]
fn the_fleet_overlay_runs_under_podman_and_rolls_out_through_etcd() {
    let s3 = S3::start();
    s3.create_bucket("models");
    let certs = Certs::new();
    let password = "fleet-password";
    let tls = ServerTls { server: certs.server(), client_ca: None };
    let etcd =
        Etcd::start_secured(&Security { tls: Some(tls), users: vec![("baton".into(), password.into())], jwt: false });

    let mut objects = objects(&["deploy/kubernetes/fleet"]);
    for object in objects.iter_mut().filter(|o| o["kind"] == "ConfigMap") {
        let base = object["metadata"]["name"] == "baton";
        let data = &mut object["data"];
        if base {
            data["AWS_ENDPOINT_URL"] = json!(s3.endpoint());
            data["AWS_ALLOW_HTTP"] = json!("true");
        } else {
            assert_eq!(data["BATON_ETCD_USER"], "baton", "the test's etcd user is the ConfigMap's");
            data["BATON_CLUSTER"] = json!(format!("etcd://127.0.0.1:{}", etcd.port()));
        }
    }
    let mut secrets = objects_of_secrets(&s3, "token-of-the-fleet-test");
    let etcd_secret = secrets.iter_mut().find(|o| o["metadata"]["name"] == "baton-etcd").expect("baton-etcd");
    etcd_secret["stringData"]["ca.crt"] = json!(std::fs::read_to_string(certs.ca()).unwrap());
    etcd_secret["stringData"]["password"] = json!(password);
    objects.extend(secrets);

    let config = find(&objects, "ConfigMap", "baton");
    let prefix = config["data"]["BATON_REPO"].as_str().unwrap().strip_prefix("s3://models/").unwrap().to_owned();
    let fleet_name =
        find(&objects, "ConfigMap", "baton-fleet")["data"]["BATON_CLUSTER_NAME"].as_str().unwrap().to_owned();
    let repo = TestRepo::new();
    let (v1, v2) = (Mlp::new(&MODEL_SIZES, 21), Mlp::new(&MODEL_SIZES, 22));
    repo.add_model("m", &mlp_toml(&v1, ""));
    repo.publish_mlp("m", 1, &v1);
    s3.publish_model("models", &prefix, &repo.root().join("m"));

    let pod_name = "baton-7c9d6f5b8-fl33t";
    let pod = Pod::new(find(&objects, "Deployment", "baton"), pod_name, &objects);
    let dir = tempfile::tempdir().unwrap();
    let volumes = pod.volumes(dir.path(), &objects);
    let (container, moved) = start_pod(&pod, &volumes, "startupProbe");
    let rest = Client::new(&format!("http://127.0.0.1:{}", moved[&pod.ports()["http"]]));
    let (batch, input) = (2, sample_input(MODEL_SIZES[0], 2, 3));
    let infer = || {
        let answer = rest.post_json("/v2/models/m/infer", &request(&input, batch));
        assert_eq!(answer.status, 200, "inference: {}", String::from_utf8_lossy(&answer.body));
        answer.json()
    };
    assert_eq!(version_of(&infer()), 1);

    // The fleet command, as an operator runs it from outside the pod.
    let password_file = dir.path().join("operator-password");
    std::fs::write(&password_file, password).unwrap();
    let access = [
        "--cluster".to_owned(),
        format!("etcd://127.0.0.1:{}", etcd.port()),
        "--cluster-name".to_owned(),
        fleet_name,
        "--etcd-ca".to_owned(),
        certs.ca().display().to_string(),
        "--etcd-user".to_owned(),
        "baton".to_owned(),
        "--etcd-password-file".to_owned(),
        password_file.display().to_string(),
    ];
    let fleet = |args: &[&str]| {
        let output =
            std::process::Command::new(bin()).arg("fleet").args(&access).args(args).env("BATON_LOG", "warn").output();
        let output = output.expect("running baton fleet");
        let text = format!("{}{}", common::text(&output.stdout), common::text(&output.stderr));
        (output.status.success(), text)
    };
    let (ok, status) = fleet(&["status"]);
    assert!(ok && status.contains(pod_name), "the pod is a replica named by POD_NAME:\n{status}");

    // A model rollout: publish, then the fleet decides.
    s3.publish_version("models", &prefix, "m", 2, &repo.publish_mlp("m", 2, &v2));
    // The replica lists the store every second; a rollout started before
    // its listing shows the version is refused at fetch (not found).
    eventually("the pod's listing of the store to show version 2", || {
        let index = rest.post_json("/v2/repository/index", &json!({})).json();
        let versions =
            index.as_array()?.iter().filter(|e| e["name"] == "m").map(|e| e["version"].clone()).collect::<Vec<_>>();
        versions.contains(&json!("2")).then_some(())
    });
    let (ok, out) = fleet(&["rollout", "m", "--version", "2"]);
    assert!(ok, "{out}");
    let answer = infer();
    assert_eq!(version_of(&answer), 2);
    assert_close(&output_f32(&answer, "output"), &v2.forward(&input, batch), "version 2 after the fleet's rollout");

    // A terminating pod leaves the fleet on its way out.
    container.kill("TERM");
    assert_eq!(container.wait_exit(), 0, "the pod's exit status:\n{}", container.logs());
    let (ok, status) = fleet(&["status"]);
    assert!(ok && !status.contains(pod_name), "the pod's lease outlived it:\n{status}");
}

#[test]
fn the_kserve_runtime_serves_a_repository_where_the_storage_initializer_puts_it() {
    let runtime = &objects(&["deploy/kserve"])[0];
    let service = &objects(&["deploy/kserve/inferenceservice.yaml"])[0];
    let predictor = &service["spec"]["predictor"]["model"];
    assert_eq!(predictor["runtime"], runtime["metadata"]["name"], "the InferenceService chooses the runtime");
    let formats = runtime["spec"]["supportedModelFormats"].as_array().unwrap();
    assert!(
        formats.iter().any(|f| f["name"] == predictor["modelFormat"]["name"]),
        "the runtime takes the model's format"
    );
    let protocols = runtime["spec"]["protocolVersions"].as_array().unwrap();
    assert!(protocols.contains(&predictor["protocolVersion"]), "the runtime speaks the model's protocol");

    // What the storage initializer leaves at /mnt/models: the storageUri's
    // objects, a baton repository with a model named as the service.
    let name = service["metadata"]["name"].as_str().unwrap();
    let model = Mlp::new(&MODEL_SIZES, 12);
    let repo = TestRepo::new();
    repo.add_model(name, &mlp_toml(&model, ""));
    repo.publish_mlp(name, 1, &model);
    baton_testkit::podman::share_read_only(repo.root());
    let pod = Pod::of_spec(&runtime["spec"], &Value::Null, "ranker-predictor-00001-deployment-x2k7q", &[]);
    assert!(pod.args().contains(&"--repo=/mnt/models".to_owned()), "baton serves /mnt/models: {:?}", pod.args());
    let dir = tempfile::tempdir().unwrap();
    let mut volumes = pod.volumes(dir.path(), &[]);
    volumes.push((repo.root().to_owned(), "/mnt/models".to_owned(), true));
    let (container, moved) = start_pod(&pod, &volumes, "readinessProbe");

    // KServe sends v2 requests to the container's one port.
    let port = pod.port(&runtime["spec"]["containers"][0]["ports"][0]["containerPort"]);
    let rest = Client::new(&format!("http://127.0.0.1:{}", moved[&port]));
    let live = pod.probe("livenessProbe");
    assert_eq!(Client::new(&format!("http://127.0.0.1:{}", moved[&live.port])).get(&live.path).status, 200);
    let (batch, input) = (3, sample_input(MODEL_SIZES[0], 3, 9));
    let answer = rest.post_json(&format!("/v2/models/{name}/infer"), &request(&input, batch));
    assert_eq!(answer.status, 200, "inference: {}", String::from_utf8_lossy(&answer.body));
    assert_close(&output_f32(&answer.json(), "output"), &model.forward(&input, batch), "the runtime's answer");
    let log = container.logs();
    let warnings: Vec<&str> = log.lines().filter(|l| l.contains(r#""level":"WARN""#)).collect();
    assert!(warnings.is_empty(), "baton warned while it started and served:\n{}", warnings.join("\n"));
    container.kill("TERM");
    assert_eq!(container.wait_exit(), 0, "the runtime's exit status:\n{}", container.logs());
}

#[test]
fn a_model_directory_given_as_the_repository_is_refused_at_start() {
    // A storageUri that names the model rather than the repository above
    // it puts the model's own directory at /mnt/models: it would serve
    // nothing, and be ready.
    let repo = repo_with("ranker", &[1], "");
    let model_dir = TestRepo::at(&repo.root().join("ranker"));
    let (status, stderr) = common::refused_start(&model_dir, &["--model-control", "none"]);
    assert!(!status.success(), "{stderr}");
    assert!(stderr.contains("one model's directory") && stderr.contains("the directory above it"), "{stderr}");
    // The repository above it starts.
    let server = common::start(&repo, &["--model-control", "none"]);
    server.wait_serving("ranker", 1);
}

#[test]
fn a_server_whose_repository_lists_no_model_is_not_ready_and_says_why() {
    // A typo in BATON_REPO, or a storageUri holding a bare model.onnx: the
    // repository lists no model. Such a pod must not pass its probes, or a
    // rolling update would retire every working pod for it.
    let repo = TestRepo::new();
    std::fs::write(repo.root().join("model.onnx"), b"not a repository").unwrap();
    let server = common::start(&repo, &[]);
    let answer = eventually("readiness to decide", || {
        let answer = server.get("/v2/health/ready");
        (answer.status == 200 || answer.json().get("reason").is_some()).then_some(answer)
    });
    assert_eq!(
        answer.status,
        503,
        "ready over a repository that lists no model: {}",
        String::from_utf8_lossy(&answer.body)
    );
    let reason = answer.json()["reason"].as_str().unwrap_or_default().to_owned();
    assert!(reason.contains("lists no model") && reason.contains("model.toml"), "{reason}");
    // It claims no cause it does not know (a store that did not answer
    // lists nothing too), and leaves the location to the log: the endpoint
    // is open to anyone.
    assert!(reason.contains("endpoint and credentials") && !reason.contains("bare model.onnx"), "{reason}");
    let root = repo.root().display().to_string();
    assert!(!reason.contains(&root), "the open readiness endpoint names the repository: {reason}");
    // More scans before the warning is counted: the repository is made
    // unreadable and readable again twice, each step logged by a scan, so
    // the scan after a recovery, which listed nothing again, has finished.
    let away = repo.root().with_extension("away");
    for round in 1..=2 {
        std::fs::rename(repo.root(), &away).unwrap();
        eventually("a scan to find the repository gone", || {
            (server.log().matches("The repository cannot be read").count() == round).then_some(())
        });
        std::fs::rename(&away, repo.root()).unwrap();
        eventually("a scan to read it again", || {
            (server.log().matches("The repository can be read again").count() == round).then_some(())
        });
    }
    let log = server.log();
    assert_eq!(log.matches("lists no model").count(), 1, "one warning naming the repository:\n{log}");
    assert!(log.contains(&repo.root().display().to_string()), "the warning names the repository:\n{log}");
}

#[test]
fn the_kserve_runtime_over_a_bare_model_onnx_never_becomes_ready() {
    let runtime = &objects(&["deploy/kserve"])[0];
    let repo = TestRepo::new();
    let model = Mlp::new(&[4, 4, 2], 5);
    repo.add_model("ranker", &mlp_toml(&model, ""));
    repo.publish_mlp("ranker", 1, &model);
    // What a storageUri naming the .onnx file leaves at /mnt/models.
    let bare = tempfile::tempdir().unwrap();
    std::fs::copy(repo.root().join("ranker/1/model.onnx"), bare.path().join("model.onnx")).unwrap();
    baton_testkit::podman::share_read_only(bare.path());
    let pod = Pod::of_spec(&runtime["spec"], &Value::Null, "ranker-predictor-00001-deployment-b4r3x", &[]);
    let dir = tempfile::tempdir().unwrap();
    let mut volumes = pod.volumes(dir.path(), &[]);
    volumes.push((bare.path().to_owned(), "/mnt/models".to_owned(), true));
    let (container, moved) = start_pod(&pod, &volumes, "livenessProbe");
    let probe = pod.probe("readinessProbe");
    let client = Client::new(&format!("http://127.0.0.1:{}", moved[&probe.port]));
    let answer = eventually("readiness to decide", || {
        let answer = client.try_get(&probe.path).ok()?;
        (answer.status == 200 || answer.json().get("reason").is_some()).then_some(answer)
    });
    assert_eq!(answer.status, 503, "the runtime is ready serving nothing: {}", String::from_utf8_lossy(&answer.body));
    assert!(answer.json()["reason"].as_str().unwrap().contains("lists no model"), "{}", answer.json());
    assert!(!answer.json()["reason"].as_str().unwrap().contains("/mnt/models"), "{}", answer.json());
    assert!(container.logs().contains("/mnt/models"), "the log names the repository:\n{}", container.logs());
    assert_json_log(&container.logs());
    container.kill("TERM");
    assert_eq!(container.wait_exit(), 0, "the runtime's exit status:\n{}", container.logs());
}

/// Every line of a container's log is JSON (init's as the server's), as
/// `--log-format=json` in the manifests promises a log collector; only the
/// "Listening on" lines, baton's announcement of its bound addresses on
/// stdout, are not log lines.
fn assert_json_log(log: &str) {
    let lines: Vec<&str> = log.lines().filter(|l| !l.trim().is_empty() && !l.starts_with("Listening on ")).collect();
    assert!(!lines.is_empty(), "the container logged nothing");
    for line in lines {
        assert!(serde_json::from_str::<Value>(line).is_ok(), "a log line that is not JSON: {line}\n{log}");
    }
}

/// The pod's container, started from the image under test with the pod's
/// arguments, environment, volumes and security context, once its startup
/// probe (`gate`) passes; with the loopback port each listener's port
/// was moved to.
///
/// A pod has a network namespace of its own; this container shares the
/// host's, so each port a listener binds is moved to a free loopback port,
/// in the arguments and for the probes alike. Nothing else is changed. A port
/// taken between its choice and baton's bind starts it again on others.
fn start_pod(pod: &Pod, volumes: &[(PathBuf, String, bool)], gate: &str) -> (Container, BTreeMap<u16, u16>) {
    let gate = pod.probe(gate);
    let budget = Duration::from_secs(gate.period * gate.failure_threshold).min(PATIENCE * 2);
    // Every listener the arguments bind, `--NAME=HOST:PORT`.
    let listener = |arg: &str| -> Option<u16> {
        let (flag, address) = arg.split_once('=')?;
        let (host, port) = address.rsplit_once(':')?;
        (flag.starts_with("--") && ["0.0.0.0", "127.0.0.1"].contains(&host)).then(|| port.parse().ok())?
    };
    let listened: Vec<u16> = pod.args().iter().filter_map(|a| listener(a)).collect();
    for port in pod.ports().values() {
        assert!(listened.contains(port), "container port {port} is bound by no argument: {:?}", pod.args());
    }
    for _attempt in 0..5 {
        let moved: BTreeMap<u16, u16> = listened.iter().map(|&p| (p, free_port())).collect();
        let args: Vec<String> = pod
            .args()
            .into_iter()
            .map(|arg| match listener(&arg) {
                Some(port) => format!("{}=127.0.0.1:{}", arg.split_once('=').unwrap().0, moved[&port]),
                None => arg,
            })
            .collect();
        let mut run = Run::new(Image::of(bin()), "kube").network(Network::Host).flags(&pod.security_flags());
        for (name, value) in &pod.env {
            run = run.env(name, value);
        }
        for (host, target, read_only) in volumes {
            run = if *read_only { run.mount_read_only(host, target) } else { run.mount(host, target) };
        }
        let started = Instant::now();
        let container = run.args(&args).start();
        // The kubelet tries every periodSeconds; trying more often only
        // sees the pass sooner.
        let probe = Client::new(&format!("http://127.0.0.1:{}", moved[&gate.port]));
        loop {
            if probe.try_get(&gate.path).is_ok_and(|a| a.status == 200) {
                return (container, moved);
            }
            if !container.running() {
                let log = container.logs();
                assert!(
                    log.contains("Address already in use"),
                    "the container stopped before its {} passed:\n{log}",
                    gate.path
                );
                break;
            }
            assert!(started.elapsed() < budget, "{} did not pass in {budget:?}:\n{}", gate.path, container.logs());
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    panic!("the pod's ports were taken five times in a row");
}

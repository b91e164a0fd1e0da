#!/usr/bin/env python3
"""Renders and validates baton's Kubernetes and KServe manifests offline.

    manifests.py render DIR        the objects DIR's kustomization.yaml makes, as JSON
    manifests.py objects PATH...   the objects of each kustomization DIR or YAML file, as JSON
    manifests.py validate PATH...  every object of each kustomization DIR or YAML file

No cluster and no kubectl: `render` applies the subset of kustomize that
deploy/ uses and refuses any other key at every level it reads, so a
kustomization it cannot follow fails instead of being half-read:
resources (files and directories), patches (path + target kind/name, JSON
6902 add/replace/remove), images (name, newName, newTag, digest) and
labels (pairs only, on metadata.labels). `validate` checks

- every Kubernetes object against the OpenAPI schemas of Kubernetes 1.37
  bundled by the PyPI package kubernetes-validate, in strict mode (an
  unknown or misspelt field is an error);
- KServe's ServingRuntime and InferenceService field by field against the
  models generated from KServe's API in the PyPI package kserve (read from
  its wheel, never imported), their Kubernetes parts (containers, volumes,
  probes) against the same Kubernetes schemas;
- what a schema cannot see: `$(VAR)` in args names a variable of the
  container, configMapKeyRef names a ConfigMap and key of the set, probes
  and Service targetPorts (and NetworkPolicy ports) name ports of the
  container, volume mounts name volumes, Service, PodDisruptionBudget and
  NetworkPolicy selectors match the pod's labels.

Not checked: admission (webhooks, policies, quotas), the CRD schema of the
KServe version installed in a cluster, defaulting, scheduling, image pulls.
Needs PyYAML, jsonschema, kubernetes-validate and the kserve wheel under
.baton/kserve (scripts/setup-clients.sh).
"""

import ast
import copy
import glob
import json
import os
import re
import sys
import zipfile

import jsonschema
import kubernetes_validate
import yaml
from referencing import Registry, Resource

KUBERNETES_VERSION = "1.37.0"
KUSTOMIZATION_KEYS = {"apiVersion", "kind", "resources", "patches", "images", "labels"}
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Invalid(Exception):
    """A manifest that is wrong, with where and why."""


# --- render ---------------------------------------------------------------


def load_yaml(path):
    with open(path) as f:
        return [doc for doc in yaml.safe_load_all(f) if doc is not None]


def render(directory):
    """The objects a kustomization directory makes, each tagged with its file."""
    path = os.path.join(directory, "kustomization.yaml")
    (kustomization,) = load_yaml(path)
    unknown = set(kustomization) - KUSTOMIZATION_KEYS
    if unknown:
        raise Invalid(f"{path}: keys this renderer does not follow: {sorted(unknown)}")
    objects = []
    for resource in kustomization.get("resources", []):
        target = os.path.normpath(os.path.join(directory, resource))
        if os.path.isdir(target):
            objects.extend(render(target))
        else:
            for doc in load_yaml(target):
                objects.append((target, doc))
    for patch in kustomization.get("patches", []):
        if set(patch) - {"path", "target"} or set(patch.get("target", {})) - {"kind", "name"}:
            raise Invalid(f"{path}: a patch this renderer does not follow: {patch}")
        patch_path = os.path.join(directory, patch["path"])
        (ops,) = load_yaml(patch_path)
        target = patch["target"]
        matched = [doc for _, doc in objects if doc.get("kind") == target["kind"] and doc["metadata"]["name"] == target["name"]]
        if not matched:
            raise Invalid(f"{path}: patch {patch_path} matches no object")
        for doc in matched:
            for op in ops:
                apply_op(doc, op, patch_path)
    for image in kustomization.get("images", []):
        unknown = set(image) - {"name", "newName", "newTag", "digest"}
        if unknown or "name" not in image:
            raise Invalid(f"{path}: an images entry this renderer does not follow (keys {sorted(unknown)}): {image}")
        for _, doc in objects:
            for container in pod_containers(doc):
                name, tag = split_image(container.get("image", ""))
                if name == image["name"]:
                    new_name = image.get("newName", name)
                    if "digest" in image:
                        container["image"] = f"{new_name}@{image['digest']}"
                    elif "newTag" in image:
                        container["image"] = f"{new_name}:{image['newTag']}"
                    else:
                        container["image"] = new_name + tag
    for label in kustomization.get("labels", []):
        # Only `pairs`, put on each object's metadata.labels: kustomize's
        # includeSelectors, includeTemplates and fields change selectors and
        # pod templates, which this renderer does not follow.
        if set(label) != {"pairs"}:
            raise Invalid(f"{path}: a labels entry this renderer does not follow (only pairs): {label}")
        for _, doc in objects:
            doc["metadata"].setdefault("labels", {}).update(label["pairs"])
    return objects


def split_image(image):
    """("registry:5000/baton", ":0.1.0") from an image reference: the name,
    and the tag or digest with its separator ("" when it has neither)."""
    if "@" in image:
        name, digest = image.split("@", 1)
        return name, "@" + digest
    slash = image.rfind("/")
    colon = image.rfind(":")
    if colon > slash:
        return image[:colon], image[colon:]
    return image, ""


def apply_op(doc, op, where):
    """One JSON 6902 operation (add, replace, remove) on doc."""
    if op.get("op") not in ("add", "replace", "remove") or not op.get("path", "").startswith("/"):
        raise Invalid(f"{where}: an operation this renderer does not follow: {op}")
    *parents, last = [part.replace("~1", "/").replace("~0", "~") for part in op["path"][1:].split("/")]
    node = doc
    for part in parents:
        try:
            node = node[int(part)] if isinstance(node, list) else node[part]
        except (KeyError, IndexError, ValueError):
            raise Invalid(f"{where}: {op['path']} names nothing in {doc['kind']}/{doc['metadata']['name']}")
    if isinstance(node, list):
        index = len(node) if last == "-" else int(last)
        if op["op"] == "add":
            node.insert(index, copy.deepcopy(op["value"]))
        elif op["op"] == "replace":
            node[index] = copy.deepcopy(op["value"])
        else:
            del node[index]
    else:
        if op["op"] != "add" and last not in node:
            raise Invalid(f"{where}: {op['path']} names nothing")
        if op["op"] == "remove":
            del node[last]
        else:
            node[last] = copy.deepcopy(op["value"])


def pod_spec(doc):
    kind = doc.get("kind")
    if kind in ("Deployment", "StatefulSet", "DaemonSet", "Job"):
        return doc["spec"]["template"]["spec"]
    if kind == "ServingRuntime":
        return doc["spec"]
    return None


def pod_containers(doc):
    spec = pod_spec(doc)
    return (spec or {}).get("containers", []) + (spec or {}).get("initContainers", [])


# --- schemas ---------------------------------------------------------------


def kubernetes_schemas():
    base = os.path.join(os.path.dirname(kubernetes_validate.__file__), "kubernetes-json-schema")
    directory = os.path.join(base, f"v{KUBERNETES_VERSION}-local-strict")
    with open(os.path.join(directory, "_definitions.json")) as f:
        definitions = json.load(f)
    return directory, definitions


def check_kubernetes(where, doc):
    try:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as e:
        path = ".".join(str(p) for p in e.absolute_path)
        raise Invalid(f"{where}: {doc['kind']}/{doc['metadata']['name']}: {path}: {e.message}")
    except kubernetes_validate.SchemaNotFoundError:
        raise Invalid(f"{where}: no schema for {doc.get('apiVersion')} {doc.get('kind')}")


class Kserve:
    """KServe's API, as the models generated into the kserve wheel describe it."""

    def __init__(self):
        wheels = sorted(glob.glob(os.path.join(ROOT, ".baton/kserve/kserve-*.whl")))
        if not wheels:
            raise SystemExit("manifests.py: no kserve wheel in .baton/kserve: run `bash scripts/setup-clients.sh`")
        self.wheel = os.path.basename(wheels[-1])
        self.models = {}
        with zipfile.ZipFile(wheels[-1]) as wheel:
            for name in wheel.namelist():
                if name.startswith("kserve/models/v1") and name.endswith(".py"):
                    self.read_model(wheel.read(name).decode())
        _, self.definitions = kubernetes_schemas()
        registry = Resource.from_contents(self.definitions) @ Registry()
        self.registry = registry.with_resource("/api/_definitions.json", Resource.from_contents(self.definitions))

    def read_model(self, source):
        for node in ast.parse(source).body:
            if not isinstance(node, ast.ClassDef):
                continue
            fields = {}
            for statement in node.body:
                if isinstance(statement, ast.Assign) and isinstance(statement.targets[0], ast.Name):
                    fields[statement.targets[0].id] = statement.value
            if "openapi_types" in fields and "attribute_map" in fields:
                types = ast.literal_eval(fields["openapi_types"])
                names = ast.literal_eval(fields["attribute_map"])
                self.models[node.name] = {names[attr]: kind for attr, kind in types.items()}

    def kubernetes_definition(self, kind):
        """V1Container -> io.k8s.api.core.v1.Container, and so on."""
        match = re.fullmatch(r"V(\d+(?:alpha\d+|beta\d+)?)(\w+)", kind)
        if not match:
            return None
        version, name = match.groups()
        for prefix in ("io.k8s.api.core.", "io.k8s.apimachinery.pkg.apis.meta.", "io.k8s.api.apps."):
            key = f"{prefix}v{version}.{name}"
            if key in self.definitions["$defs"]:
                return key
        return None

    def check(self, value, kind, path):
        if kind in ("object", "ResourceQuantity"):
            return
        if kind.startswith("list["):
            if not isinstance(value, list):
                raise Invalid(f"{path}: expected a list")
            for i, item in enumerate(value):
                self.check(item, kind[5:-1], f"{path}[{i}]")
        elif kind.startswith("dict("):
            if not isinstance(value, dict):
                raise Invalid(f"{path}: expected a map")
            inner = kind[5:-1].split(", ", 1)[1]
            for key, item in value.items():
                self.check(item, inner, f"{path}.{key}")
        elif kind in ("str", "int", "bool", "float"):
            python = {"str": str, "int": int, "bool": bool, "float": (int, float)}[kind]
            if not isinstance(value, python) or (kind == "int" and isinstance(value, bool)):
                raise Invalid(f"{path}: expected {kind}, found {value!r}")
        elif kind in self.models:
            if not isinstance(value, dict):
                raise Invalid(f"{path}: expected an object ({kind})")
            fields = self.models[kind]
            for key, item in value.items():
                if key not in fields:
                    raise Invalid(f"{path}: unknown field {key!r} ({kind} has {sorted(fields)})")
                self.check(item, fields[key], f"{path}.{key}")
        else:
            definition = self.kubernetes_definition(kind)
            if definition is None:
                raise Invalid(f"{path}: no schema for {kind}")
            schema = {"$ref": f"/api/_definitions.json#/$defs/{definition}"}
            validator = jsonschema.Draft202012Validator(schema, registry=self.registry)
            for error in validator.iter_errors(value):
                where = ".".join(str(p) for p in error.absolute_path)
                raise Invalid(f"{path}.{where}: {error.message}")

    def validate(self, where, doc):
        kinds = {
            ("serving.kserve.io/v1alpha1", "ServingRuntime"): "V1alpha1ServingRuntime",
            ("serving.kserve.io/v1alpha1", "ClusterServingRuntime"): "V1alpha1ClusterServingRuntime",
            ("serving.kserve.io/v1beta1", "InferenceService"): "V1beta1InferenceService",
        }
        kind = kinds.get((doc.get("apiVersion"), doc.get("kind")))
        if kind is None:
            raise Invalid(f"{where}: no KServe model for {doc.get('apiVersion')} {doc.get('kind')}")
        self.check(doc, kind, f"{where}: {doc['kind']}/{doc['metadata']['name']}")


# --- what schemas cannot see -------------------------------------------------


def cross_check(objects):
    """References between objects and inside a pod, as the kubelet resolves them."""
    config_maps = {doc["metadata"]["name"]: doc.get("data", {}) for _, doc in objects if doc.get("kind") == "ConfigMap"}
    pods = [(where, doc) for where, doc in objects if pod_spec(doc) is not None]
    for where, doc in pods:
        spec = pod_spec(doc)
        name = f"{where}: {doc['kind']}/{doc['metadata']['name']}"
        volumes = {v["name"] for v in spec.get("volumes", [])}
        for container in pod_containers(doc):
            env = [e["name"] for e in container.get("env", [])]
            for e in container.get("env", []):
                ref = e.get("valueFrom", {}).get("configMapKeyRef")
                if ref and doc.get("kind") != "ServingRuntime":
                    data = config_maps.get(ref["name"])
                    if data is None:
                        raise Invalid(f"{name}: env {e['name']} names ConfigMap {ref['name']}, which is not in the set")
                    if ref["key"] not in data and not ref.get("optional"):
                        raise Invalid(f"{name}: env {e['name']} names key {ref['key']}, which ConfigMap {ref['name']} lacks")
            for arg in container.get("args", []) + container.get("command", []):
                for var in re.findall(r"\$\(([^)]*)\)", arg):
                    if var not in env:
                        raise Invalid(f"{name}: argument {arg!r} names $({var}), which the container does not define")
            ports = {p.get("name"): p["containerPort"] for p in container.get("ports", [])}
            for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                port = container.get(probe, {}).get("httpGet", {}).get("port")
                if port is not None and port not in ports and port not in ports.values():
                    raise Invalid(f"{name}: {probe} port {port!r} is not a port of container {container['name']}")
            for mount in container.get("volumeMounts", []):
                if mount["name"] not in volumes:
                    raise Invalid(f"{name}: volume mount {mount['name']} names no volume")
    templates = [doc for _, doc in pods if doc.get("kind") == "Deployment"]
    for where, doc in objects:
        selector = None
        if doc.get("kind") == "Service":
            selector = doc["spec"].get("selector", {})
        elif doc.get("kind") in ("PodDisruptionBudget", "NetworkPolicy"):
            key = "selector" if doc["kind"] == "PodDisruptionBudget" else "podSelector"
            selector = doc["spec"][key].get("matchLabels", {})
        if selector is None:
            continue
        name = f"{where}: {doc['kind']}/{doc['metadata']['name']}"
        chosen = [t for t in templates if selector.items() <= t["spec"]["template"]["metadata"]["labels"].items()]
        if not chosen:
            raise Invalid(f"{name}: its selector {selector} matches no pod of the set")
        if doc.get("kind") == "NetworkPolicy":
            for rule in doc["spec"].get("ingress", []):
                for port in rule.get("ports", []):
                    for template in chosen:
                        ports = {p.get("name"): p["containerPort"] for c in pod_containers(template) for p in c.get("ports", [])}
                        if port["port"] not in ports and port["port"] not in ports.values():
                            raise Invalid(f"{name}: port {port['port']!r} is not a port of the pods it selects")
        if doc.get("kind") == "Service":
            for port in doc["spec"]["ports"]:
                for template in chosen:
                    ports = {p.get("name"): p["containerPort"] for c in pod_containers(template) for p in c.get("ports", [])}
                    target = port.get("targetPort", port["port"])
                    if target not in ports and target not in ports.values():
                        raise Invalid(f"{name}: targetPort {target!r} is not a port of the pods it selects")


# --- main -----------------------------------------------------------------


def collect(paths):
    objects = []
    for path in paths:
        if os.path.isdir(path):
            objects.extend(render(path))
        else:
            objects.extend((path, doc) for doc in load_yaml(path))
    return objects


def validate(paths):
    kserve = None
    checked = 0
    for path in paths:
        objects = collect([path])
        for where, doc in objects:
            if doc.get("apiVersion", "").startswith("serving.kserve.io/"):
                kserve = kserve or Kserve()
                kserve.validate(where, doc)
            else:
                check_kubernetes(where, doc)
            checked += 1
        cross_check(objects)
    print(f"{checked} objects valid (Kubernetes {KUBERNETES_VERSION} strict schemas"
          + (f", {kserve.wheel}" if kserve else "") + ")")


def main():
    if len(sys.argv) < 3 or sys.argv[1] not in ("render", "objects", "validate"):
        raise SystemExit(__doc__)
    try:
        if sys.argv[1] == "render":
            print(json.dumps([doc for _, doc in render(sys.argv[2])], indent=1))
        elif sys.argv[1] == "objects":
            print(json.dumps([doc for _, doc in collect(sys.argv[2:])], indent=1))
        else:
            validate(sys.argv[2:])
    except Invalid as e:
        print(f"invalid: {e}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
